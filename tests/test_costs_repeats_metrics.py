"""Tokens and cost, repeats (pass@k, pass^k, rows that flip) and dataset-level metrics:
recorded per call, totalled in the summary and the manifest, shown by ``show`` and
``compare``, gated on; on the local backend, and on a real Prefect server for the flow
run's figures and artifacts."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from patronus_tasks import (
    ConfigError,
    QualityGateError,
    Row,
    TaskResult,
    Usage,
    evaluator,
    run_experiment,
    task,
)
from patronus_tasks.cli import app
from patronus_tasks.metrics import accuracy_by, metric, precision_recall_f1
from patronus_tasks.openai import ChatTask, LLMJudge, openai_endpoint
from patronus_tasks.patronus.evaluators import parse_evaluation
from patronus_tasks.prices import DEFAULT_PRICES, PRICES_AS_OF, Price, PriceTable
from patronus_tasks.results import compare_experiments

from .conftest import RECORDED_WITHIN
from .servers import FakeServer, serve
from .test_cache import counted_chat

LOCAL: dict[str, Any] = dict(backend="local", print_summary=False, html_report=False)


@pytest.fixture
def model() -> Iterator[FakeServer]:
    with serve(counted_chat) as server:
        yield server


def test_prices_are_exact_dated_and_overridable() -> None:
    table = PriceTable()
    assert PRICES_AS_OF and DEFAULT_PRICES["gpt-4o"] == Price(2.5, 10.0)
    assert table.cost(Usage(model="gpt-4o", input_tokens=1000, output_tokens=100)) == \
        pytest.approx(0.0035)
    # never a guess: a dated snapshot not listed, an unknown model, a missing count
    assert table.cost(Usage(model="gpt-4o-2024-05-13", input_tokens=10, output_tokens=1)) is None
    assert table.cost(Usage(model="mine", input_tokens=10, output_tokens=1)) is None
    assert table.cost(Usage(model="gpt-4o", input_tokens=10)) is None
    assert table.cost(Usage(model="mine", cost_usd=0.5)) == 0.5  # as the call says
    mine = PriceTable({"mine": (1.0, 2.0), "gpt-4o": None})
    assert mine.cost(Usage(model="mine", input_tokens=10**6, output_tokens=10**6)) == 3.0
    assert mine.cost(Usage(model="gpt-4o", input_tokens=1, output_tokens=1)) is None
    with pytest.raises(ConfigError, match="prices\\['bad'\\]"):
        PriceTable({"bad": (-1, 2)})
    assert Usage.of({"input_tokens": 7, "output_tokens": 3}, "claude-sonnet-4-0") == Usage(
        model="claude-sonnet-4-0", input_tokens=7, output_tokens=3)


def test_tokens_and_cost_per_call_step_and_model(model: FakeServer, results_dir: Path) -> None:
    endpoint = openai_endpoint(model.url, max_attempts=1)

    @task
    def reports_its_own(evaluated_model_input: str) -> TaskResult:
        return TaskResult(evaluated_model_output=evaluated_model_input,
                          usage=Usage(model="in-house", input_tokens=5, output_tokens=2,
                                      cost_usd=0.01))

    exp = run_experiment(
        "costs", data=[{"evaluated_model_input": f"say {'word ' * i}"} for i in range(1, 5)],
        chain=[{"task": ChatTask("gpt-4o", endpoint=endpoint),
                "evaluators": [LLMJudge("judge", "answers", model="judge-x", endpoint=endpoint)]},
               {"task": reports_its_own}],
        prices={"judge-x": (1.0, 4.0)}, results_dir=results_dir, experiment_name="c", **LOCAL)
    sent = [(r.body["model"], counted_chat(r)[2]["usage"]) for r in model.requests]
    want = {m: (sum(u["prompt_tokens"] for n, u in sent if n == m),
                sum(u["completion_tokens"] for n, u in sent if n == m)) for m in ("gpt-4o", "judge-x")}
    totals = {(u.step, u.model): u for u in exp.summary().usage}
    chat, judge = totals[("chat", "gpt-4o")], totals[("judge", "judge-x")]
    assert (chat.calls, chat.input_tokens, chat.output_tokens) == (4, *want["gpt-4o"])
    assert chat.cost_usd == pytest.approx((2.5 * want["gpt-4o"][0] + 10 * want["gpt-4o"][1]) / 1e6)
    assert judge.cost_usd == pytest.approx((want["judge-x"][0] + 4 * want["judge-x"][1]) / 1e6)
    own = totals[("reports_its_own", "in-house")]
    assert (own.calls, own.input_tokens, own.cost_usd) == (4, 20, pytest.approx(0.04))
    df = exp.to_dataframe()
    link0 = df[df["link_index"] == 0]
    assert link0["task_input_tokens"].sum() == want["gpt-4o"][0]  # one record per call here
    manifest = exp.manifest
    assert manifest["cost_usd"] == pytest.approx(chat.cost_usd + judge.cost_usd + 0.04)
    assert {(u["step"], u["model"]) for u in manifest["usage"]} == set(totals)
    shown = CliRunner().invoke(app, ["show", str(exp.path)])
    assert shown.exit_code == 0 and "Tokens and cost" in shown.output
    assert "judge-x" in shown.output and f"{chat.cost_usd:.4g}" in shown.output
    assert f"cost ${exp.summary().cost_usd:.4g}" in exp.summary().headline()


def _flaky_judge(passes: dict[str, list[bool | None]]) -> Any:
    """An evaluator whose n-th call for a row says ``passes[sid][n]`` (None: raises)."""
    seen: Counter[str] = Counter()
    lock = threading.Lock()

    @evaluator
    def judge(row: Row) -> bool:
        with lock:
            n = seen[row.sid]
            seen[row.sid] += 1
        said = passes[row.sid][n]
        if said is None:
            raise RuntimeError("judge down")
        return said

    return judge


@task
def echo(evaluated_model_input: str) -> str:
    return evaluated_model_input


def test_repeats_give_pass_at_k_pass_hat_k_and_flipping_rows(results_dir: Path) -> None:
    judge = _flaky_judge({"a": [True] * 3, "b": [True, False, False], "c": [False] * 3,
                          "d": [None, True, True]})
    exp = run_experiment("rep", data=[{"sid": s, "evaluated_model_input": s} for s in "abcd"],
                         task=echo, evaluators=[judge], repeats=3, results_dir=results_dir, **LOCAL)
    df = exp.to_dataframe()
    assert sorted(zip(df["sid"], df["repeat"], strict=True)) == [
        (s, k) for s in "abcd" for k in (1, 2, 3)]
    stats = exp.summary().evaluators[0]
    r = stats.repeats
    assert r is not None and (r.k, r.rows) == (3, 4)
    assert r.mean_pass_rate == pytest.approx((3 + 1 + 0 + 2) / 12) == stats.pass_rate
    assert (r.pass_at_k, r.pass_hat_k, r.flipping) == (0.75, 0.25, ["b", "d"])
    assert r.interval is not None and r.interval[0] < 0.5 < r.interval[1]
    text = exp.format_summary()
    assert "pass@3    : 75.0%   pass^3: 25.0%" in text and "Flipping  : 2 rows (b, d)" in text
    assert "4 rows x 3 repeats" in exp.summary().headline()
    assert exp.manifest["rows"] == 12 and exp.manifest["repeats"] == 3
    with pytest.raises(ConfigError, match="repeats must be"):
        run_experiment("rep", data=[{"x": 1}], task=echo, repeats=0, **LOCAL)


def test_resume_and_gates_work_with_repeats(results_dir: Path) -> None:
    calls: Counter[str] = Counter()

    @task
    def work(row: Row) -> str:
        calls["task"] += 1
        return f"out-{row.sid}"

    judge = _flaky_judge({"1": [True, None, True], "2": [True, True], "3": [False, True]})
    kwargs: dict[str, Any] = dict(data=[{"x": i} for i in range(3)], task=work,
                                  evaluators=[judge], repeats=2, experiment_name="again",
                                  results_dir=results_dir, **LOCAL)
    with pytest.raises(QualityGateError, match=r"pass rate 66\.7% is below 90\.0%"):
        run_experiment("retry-rep", min_pass_rates={"judge": 0.9}, **kwargs)
    assert calls["task"] == 6
    again = run_experiment("retry-rep", retry_errors=True, **kwargs)
    assert calls["task"] == 6  # the errored run of row 1 replays its task output
    df = again.to_dataframe()
    assert len(df) == 6 and df["status"].eq("ok").all()  # each (sid, repeat) once
    assert sorted(df.loc[df["sid"] == "1", "repeat"]) == [1, 2]
    assert again.summary().evaluators[0].repeats.flipping == ["3"]  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="resuming would mix them"):
        run_experiment("retry-rep", resume=True, **{**kwargs, "repeats": 3})


def test_metrics_values_failures_and_gates(results_dir: Path) -> None:
    @task
    def classify(evaluated_model_input: str) -> str:
        return "spam" if "win" in evaluated_model_input else "ham"

    @evaluator
    def correct(evaluated_model_output: str, evaluated_model_gold_answer: str) -> bool:
        return evaluated_model_output == evaluated_model_gold_answer

    @metric
    def broken(results: Any) -> float:
        raise RuntimeError("no luck")

    @metric(name="rows")
    def row_count(sids: list[str]) -> int:
        return len(sids)

    data = [{"evaluated_model_input": i, "evaluated_model_gold_answer": g, "lang": lang}
            for i, g, lang in [("win cash", "spam", "en"), ("win a prize", "ham", "en"),
                               ("hello", "ham", "de"), ("cheap pills", "spam", "de")]]
    metrics = [precision_recall_f1("spam"), accuracy_by("lang"), broken, row_count]
    with pytest.raises(QualityGateError) as failed:
        run_experiment("metrics", data=data, task=classify, evaluators=[correct],
                       metrics=metrics, min_metrics={"f1": 0.9, "broken": 0, "nope": 1},
                       results_dir=results_dir, **LOCAL)
    messages = failed.value.failures
    assert messages[0] == "f1: 0.5 is below 0.9"
    assert "broken: the metric failed (RuntimeError: no luck)" in messages[1]
    assert messages[2].startswith("nope: no such metric")
    exp = failed.value.experiment
    values = {m.name: m.value for m in exp.metrics}  # type: ignore[union-attr]
    assert values == {"precision": 0.5, "recall": 0.5, "f1": 0.5, "accuracy[lang=de]": 0.5,
                      "accuracy[lang=en]": 0.5, "broken": None, "rows": 4.0}
    assert "f1 0.5" in exp.summary().headline()  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="min_metrics= gates"):
        run_experiment("metrics", data=data, task=classify, min_metrics={"f1": 1}, **LOCAL)


def test_compare_pairs_repeats_and_sets_cost_side_by_side(results_dir: Path) -> None:
    @task
    def paid(evaluated_model_input: str) -> TaskResult:
        return TaskResult(evaluated_model_output=evaluated_model_input,
                          usage=Usage(model="gpt-4o-mini", input_tokens=1000, output_tokens=500))

    data = [{"sid": s, "evaluated_model_input": s} for s in "abcd"]

    def run(name: str, repeats: int, passes: dict[str, list[bool | None]]) -> Any:
        return run_experiment("cmp", data=data, task=paid, evaluators=[_flaky_judge(passes)],
                              repeats=repeats, experiment_name=name, results_dir=results_dir,
                              metrics=[accuracy_by("evaluated_model_input")], **LOCAL)

    a = run("a", 2, {s: [True, True] for s in "abcd"})
    b = run("b", 2, {"a": [True, False], "b": [True, True], "c": [False, False], "d": [True, True]})
    c = run("c", 3, {s: [True, True, False] for s in "abcd"})
    ab = compare_experiments(a, b)
    assert ab.pairing == "repeat" and ab.evaluators[0].paired == 8
    assert (ab.evaluators[0].mcnemar_b, ab.evaluators[0].mcnemar_c) == (3, 0)
    assert ab.evaluators[0].regressed == ["a", "c"]
    ac = compare_experiments(a, c)
    assert ac.pairing == "mean" and ac.evaluators[0].paired == 4
    e = ac.evaluators[0]
    assert e.pass_diff == pytest.approx(-1 / 3) and e.pass_p is not None and e.mcnemar_p is None
    with pytest.raises(ConfigError, match="same repeats"):
        compare_experiments(a, c, pair="repeat")
    cost = 8 * (1000 * 0.15 + 500 * 0.60) / 1e6
    assert ab.cost_a == pytest.approx(cost) and ac.cost_b == pytest.approx(cost * 1.5)
    out = CliRunner().invoke(app, ["compare", str(a.path), str(c.path)])
    assert out.exit_code == 0, out.output
    assert "rows' means over their repeats" in out.output and "cost diff" in out.output
    assert "accuracy[evaluated_model_input=a]: A 1  B 0.6667  diff -0.3333" in out.output


def test_patronus_evaluation_usage_is_read_when_given() -> None:
    body = {"results": [{"status": "success", "evaluator_id": "judge-large", "evaluation_result": {
        "id": "e1", "pass": True, "score_raw": 1.0, "evaluator_family": "judge",
        "usage": {"input_tokens": 120, "output_tokens": 8}}}]}
    result = parse_evaluation(body, 1)
    assert result.usage == Usage(model="patronus:judge", input_tokens=120, output_tokens=8)
    del body["results"][0]["evaluation_result"]["usage"]  # type: ignore[attr-defined]
    assert parse_evaluation(body, 1).usage is None


async def _flow_run(flow_run_id: str) -> Any:
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        return await client.read_flow_run(flow_run_id)


def test_figures_reach_the_flow_run_and_its_gate(prefect_server: str, results_dir: Path) -> None:
    from patronus_tasks.prefect.ui.artifacts import summary_rows

    judge = _flaky_judge({s: [True, False] for s in "abc"})
    with pytest.raises(QualityGateError, match="rows: 6 is below 7") as failed:
        run_experiment("figures", data=[{"sid": s, "evaluated_model_input": s} for s in "abc"],
                       task=echo, evaluators=[judge], repeats=2, metrics=[metric(
                           lambda sids: len(sids), name="rows")], min_metrics={"rows": 7},
                       results_dir=results_dir, print_summary=False, html_report=False)
    exp = failed.value.experiment
    assert exp is not None and exp.manifest["metrics"][0]["value"] == 6
    rows = summary_rows(exp.summary())
    assert rows[0]["repeats"] == "pass@2 100.0% · pass^2 0.0% · 3/3 flip"
    # The recorder process sets the final state after the results, then says it is done.
    assert exp.wait_recorded(RECORDED_WITHIN)
    state = asyncio.run(_flow_run(exp.manifest["flow_run_id"])).state
    assert state.type.value == "FAILED" and "rows: 6 is below 7" in state.message
    assert "pass@2 100.0%, pass^2 0.0%, 3 of 3 rows flip" in state.message


def test_repeats_cache_resume_and_metric_gates_on_dask(prefect_server: str,
                                                       tmp_path: Path) -> None:
    from distributed import LocalCluster

    from .shared_steps import echo_cached, fails_while_flagged

    flag = tmp_path / "flag"
    flag.touch()
    results = tmp_path / "results"
    data = [{"sid": str(i), "flag": str(flag)} for i in range(1, 4)]
    with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=":0") as cluster:
        opts: dict[str, Any] = dict(
            data=data, task=echo_cached, evaluators=[fails_while_flagged], repeats=2,
            cache=True, backend="dask", dask_address=cluster.scheduler_address,
            experiment_name="d", results_dir=results, print_summary=False, html_report=False,
            metrics=[metric(lambda sids: len(sids), name="runs")])
        with pytest.raises(QualityGateError, match="runs: 6 is below 7") as failed:
            run_experiment("dask-rep", min_metrics={"runs": 7}, **opts)
        first = failed.value.experiment
        assert first is not None and first.manifest["evaluator_errors"] == 2
        assert (first.manifest["calls"], first.manifest["cached_calls"]) == (12, 0)
        assert len(list((results / ".cache" / "echo_cached").rglob("*.json"))) == 6  # by workers
        flag.unlink()
        again = run_experiment("dask-rep", retry_errors=True, **opts)
    df = again.to_dataframe()
    assert sorted(zip(df["sid"], df["repeat"], strict=True)) == [
        (s, k) for s in "123" for k in (1, 2)]
    assert df["status"].eq("ok").all() and again.manifest["calls"] == 2  # the two failed runs
    assert again.summary().evaluators[0].repeats.pass_hat_k == 1.0  # type: ignore[union-attr]


def test_model_calls_a_task_made_before_it_failed_are_paid_and_counted(results_dir: Path) -> None:
    """An agent out of budget raises after its model calls: they were paid. A task's own
    `llm` spans count when its result reports no usage (never twice when it does)."""
    from patronus_tasks import span

    @task
    def agent(evaluated_model_input: str) -> str:
        for _ in range(2):
            with span("chat gpt-4o-mini", kind="llm", model="gpt-4o-mini", input_tokens=1000,
                      output_tokens=500):
                pass
        if evaluated_model_input == "loops":
            raise RuntimeError("out of budget: 2 model calls")
        return "done"

    @evaluator
    def ok(evaluated_model_output: str) -> bool:
        return True

    exp = run_experiment("spent", data=[{"evaluated_model_input": "loops"},
                                        {"evaluated_model_input": "answers"}],
                         task=agent, evaluators=[ok], backend="local", results_dir=results_dir,
                         print_summary=False, html_report=False)
    df = exp.to_dataframe().drop_duplicates("sid").set_index("sid")
    one_row = 2 * (1000 * 0.15e-6 + 500 * 0.6e-6)  # gpt-4o-mini's price, two calls
    for sid in ("1", "2"):  # the failed row too
        assert df.loc[sid, "task_input_tokens"] == 2000 and df.loc[sid, "task_model"] == "gpt-4o-mini"
        assert df.loc[sid, "task_cost_usd"] == pytest.approx(one_row)
    assert exp.manifest["cost_usd"] == pytest.approx(2 * one_row)
