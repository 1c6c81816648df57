"""The cache of step calls against real pieces: a loopback OpenAI-compatible server that
counts requests, a folder written by two processes at once and by one killed mid-write,
object storage (moto's S3 server) shared by two results directories, and a real Prefect
server reading back the `Cached` state of the text-to-SQL flow's second run."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from patronus_tasks import Cache, ConfigError, TaskResult, evaluator, run_experiment, task
from patronus_tasks.openai import ChatTask, LLMJudge, openai_endpoint
from patronus_tasks.record.cache import CACHE_DIR

from .conftest import RECORDED_WITHIN, ROOT
from .servers import FakeServer, Recorded, Reply, chat_completion, serve
from .test_object_store import _url, s3  # noqa: F401 (the moto server fixture)
from .waits import task_runs_with_states


def counted_chat(req: Recorded) -> Reply:
    """A chat model answering ``answer: <input>`` (a judge: a passing JSON verdict), with
    usage: a token per word of the messages and of the answer."""
    messages = req.body["messages"]
    asked = " ".join(m["content"] for m in messages)
    judge = messages[0]["role"] == "system" and "impartial" in messages[0]["content"]
    content = ('{"pass": true, "score": 1, "explanation": "fine"}' if judge
               else f"answer: {messages[-1]['content']}")
    body = chat_completion(content, req.body.get("model", "gpt-4o"))
    body["usage"] = {"prompt_tokens": len(asked.split()), "completion_tokens": len(content.split()),
                     "total_tokens": 0}
    return 200, {}, body


@pytest.fixture
def model() -> Iterator[FakeServer]:
    with serve(counted_chat) as server:
        yield server


DATA = [{"evaluated_model_input": f"question {i}"} for i in range(6)]


def _chat_run(url: str, results: Path | str, name: str, **options: Any) -> Any:
    endpoint = openai_endpoint(url, max_attempts=1)
    task_ = ChatTask("gpt-4o", endpoint=endpoint, temperature=0)
    judge = LLMJudge("judge", "answers the question", model="my-judge", endpoint=endpoint)
    return run_experiment("cached", data=DATA, task=task_, evaluators=[judge],
                          experiment_name=name, backend="local", results_dir=results,
                          print_summary=False, html_report=False, **options)


def test_second_run_calls_nothing_and_costs_nothing(model: FakeServer, results_dir: Path) -> None:
    first = _chat_run(model.url, results_dir, "a", cache=True)
    assert len(model.requests) == 12  # 6 answers, 6 verdicts
    df = first.to_dataframe()
    assert not df["task_cached"].any() and not df["evaluation_cached"].any()
    assert df["task_model"].eq("gpt-4o").all() and df["evaluation_model"].eq("my-judge").all()
    # gpt-4o is in the price table; my-judge is not: its tokens, no cost
    assert (df["task_cost_usd"] > 0).all() and df["evaluation_cost_usd"].isna().all()

    second = _chat_run(model.url, results_dir, "a", cache=True)
    assert len(model.requests) == 12  # not one request more
    again = second.to_dataframe()
    assert again["task_cached"].all() and again["evaluation_cached"].all()
    assert (again["task_cost_usd"] == 0).all()
    assert list(again.sort_values("sid")["task_output"]) == list(df.sort_values("sid")["task_output"])
    m = second.manifest
    assert (m["calls"], m["cached_calls"], m["cost_usd"]) == (0, 12, 0.0)
    assert first.manifest["calls"] == 12 and first.manifest["cost_usd"] > 0
    # A step that is changed is a new key: the judge's model, say.
    _chat_run(model.url, results_dir, "a", cache=True, prices={"my-judge": (1.0, 2.0)})
    assert len(model.requests) == 12  # prices are not what a call receives: still cached


def test_refresh_expiry_and_opt_in_per_step(model: FakeServer, results_dir: Path) -> None:
    _chat_run(model.url, results_dir, "b", cache=True)
    assert len(model.requests) == 12
    _chat_run(model.url, results_dir, "b", cache=Cache(refresh=True))
    assert len(model.requests) == 24  # refreshed: called again, entries rewritten
    _chat_run(model.url, results_dir, "b", cache=Cache(expire_after=1e-6))
    assert len(model.requests) == 36  # every entry older than its expiry
    _chat_run(model.url, results_dir, "b")  # default: only steps that opted in; none here
    assert len(model.requests) == 48
    _chat_run(model.url, results_dir, "b", cache=False)
    assert len(model.requests) == 60

    calls: list[str] = []

    @task(cache=True)
    def echo(evaluated_model_input: str) -> TaskResult:
        calls.append(evaluated_model_input)
        return TaskResult(evaluated_model_output=evaluated_model_input.upper())

    @evaluator
    def loud(evaluated_model_output: str) -> bool:
        calls.append("judged")
        return evaluated_model_output.isupper()

    for _ in range(2):  # the experiment's default cache: the task opted in, the evaluator not
        run_experiment("opt-in", data=DATA, task=echo, evaluators=[loud], backend="local",
                       results_dir=results_dir, print_summary=False, html_report=False)
    assert calls.count("judged") == 12 and len(calls) == 12 + 6
    assert (results_dir / CACHE_DIR / "echo").is_dir() and not (results_dir / CACHE_DIR / "loud").exists()
    with pytest.raises(ConfigError, match="cache must be"):
        run_experiment("opt-in", data=DATA, task=echo, cache=3, backend="local",
                       results_dir=results_dir)


def test_an_unreadable_entry_is_a_miss_and_is_written_again(results_dir: Path) -> None:
    calls: list[str] = []

    @task(cache=True)
    def echo(evaluated_model_input: str) -> str:
        calls.append(evaluated_model_input)
        return evaluated_model_input

    kwargs: dict[str, Any] = dict(data=DATA[:2], task=echo, backend="local",
                                  results_dir=results_dir, print_summary=False, html_report=False)
    run_experiment("damaged", **kwargs)
    entries = sorted((results_dir / CACHE_DIR / "echo").rglob("*.json"))
    assert len(entries) == 2 and len(calls) == 2
    entries[0].write_bytes(entries[0].read_bytes()[:20])  # cut short, as by a broken writer
    run_experiment("damaged", **kwargs)
    assert len(calls) == 3  # that one entry called again
    assert json.loads(entries[0].read_text())["value"]["evaluated_model_output"]  # rewritten whole
    run_experiment("damaged", **kwargs)
    assert len(calls) == 3


WRITER = """
import sys
from patronus_tasks import run_experiment, task

@task(cache=True)
def slow(evaluated_model_input: str) -> str:
    return "answer " + evaluated_model_input

data = [{"evaluated_model_input": f"q{i}"} for i in range(int(sys.argv[3]))]
e = run_experiment("shared", data=data, task=slow, backend="local", results_dir=sys.argv[1],
                   cache=sys.argv[2], max_concurrency=8, print_summary=False, html_report=False)
print(e.manifest["calls"], e.manifest["cached_calls"], flush=True)
"""


def _writer(results: Path | str, store: str, rows: int) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", WRITER, str(results), store, str(rows)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_processes_write_one_cache(tmp_path: Path) -> None:
    store = tmp_path / "shared-cache"
    procs = [_writer(tmp_path / f"results-{i}", str(store), 120) for i in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    entries = list(store.rglob("*.json"))
    assert len(entries) == 120  # the same 120 keys, whoever wrote them last
    for entry in entries:
        assert json.loads(entry.read_text())["value"]["evaluated_model_output"].startswith("answer")
    assert not list(store.rglob("*.tmp"))
    third = _writer(tmp_path / "results-3", str(store), 120)
    out, err = third.communicate(timeout=120)
    assert third.returncode == 0, err[-2000:]
    assert out.split() == ["0", "120"]  # every answer from the cache


KILLED_WRITER = """
import asyncio, sys
from pathlib import Path
from patronus_tasks import Cache, TaskResult, task
from patronus_tasks.record.cache import CallCache
from patronus_tasks.record.location import Location

@task
def step(evaluated_model_input: str) -> str:
    return evaluated_model_input

cache = CallCache(Location(Path(sys.argv[1])), Cache())
big = TaskResult(evaluated_model_output="x" * 200_000)

async def main() -> None:
    n = 0
    while True:  # writes until killed
        await cache.put(step, f"{n:064x}", big)
        n += 1
        if n == 50:
            print("writing", flush=True)

asyncio.run(main())
"""


def test_a_writer_killed_mid_write_leaves_no_corrupt_entry(tmp_path: Path) -> None:
    store = tmp_path / "store"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(store)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "writing"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    entries = list(store.rglob("*.json"))
    assert len(entries) >= 50
    for entry in entries:  # each whole, however far the writer got
        assert len(json.loads(entry.read_bytes())["value"]["evaluated_model_output"]) == 200_000


def test_object_storage_cache_is_shared_by_results_dirs(s3: str, model: FakeServer,  # noqa: F811
                                                         tmp_path: Path) -> None:
    store = _url(s3, "cache")
    _chat_run(model.url, tmp_path / "one", "x", cache=store)
    assert len(model.requests) == 12
    again = _chat_run(model.url, _url(s3, "other-results"), "x", cache=store)
    assert len(model.requests) == 12  # another results directory, the same store: no call
    assert again.to_dataframe()["task_cached"].all()


def _flow_module() -> Any:
    spec = importlib.util.spec_from_file_location("text_to_sql_flow", ROOT / "flows" / "text_to_sql.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def _states(flow_run_id: str) -> dict[str, tuple[str, str, str | None]]:
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        runs = await task_runs_with_states(client, flow_run_id)
    return {r.name: (r.state.type.value, r.state.name, r.state.message) for r in runs}


def _experiment_of(results: Path, name: str) -> Any:
    from patronus_tasks.results import load_experiment

    return load_experiment(name, results)


@pytest.mark.heavy
def test_text_to_sql_second_run_is_cached_on_prefect(prefect_server: str, tmp_path: Path) -> None:
    flow_module = _flow_module()
    results = tmp_path / "results"
    params = dict(results_dir=str(results), cache=True, repeats=2, min_f1=0.5)
    flow_module.text_to_sql_eval(experiment_name="sql-1", **params)
    first = _experiment_of(results, "sql-1").manifest
    assert (first["calls"], first["cached_calls"]) == (12 * 2 + 9 * 2 * 2, 0)
    flow_module.text_to_sql_eval(experiment_name="sql-1", **params)
    exp = _experiment_of(results, "sql-1")
    assert exp.wait_recorded(RECORDED_WITHIN)
    states = asyncio.run(_states(exp.manifest["flow_run_id"]))
    assert len(states) == 12 * 2 + 9 * 2 * 2  # names unique per repeat: none merged
    # The second run: each repeat of the one row whose SQL fails (q07) is called again
    # (errors are never cached); every other call is the cache's answer.
    assert {name for name, state in states.items() if state[1] != "Cached"} == {
        "perform_sql_query-q07-r1", "perform_sql_query-q07-r2"}
    assert states["perform_sql_query-q01-r1"][:2] == ("COMPLETED", "Cached")
    assert states["perform_sql_query-q07-r2"][:2] == ("FAILED", "Failed")
    assert states["perform_sql_query-q08-r1"][1] == "Cached"  # a cached skip (not SQL)
    not_passed = states["(x) result_matches_gold-q03-r2"]  # its name marked: it did not pass
    assert not_passed[1] == "Cached" and "Not passed" in (not_passed[2] or "")
    cached = [n for n, s in states.items() if s[1] == "Cached"]
    assert len(cached) == len(states) - 2
    m = exp.manifest
    assert (m["calls"], m["cached_calls"], m["repeats"]) == (2, len(cached), 2)
    assert {v["name"] for v in m["metrics"]} >= {"precision", "recall", "f1",
                                                 "accuracy[category=order]"}
