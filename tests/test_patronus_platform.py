"""The Patronus platform from SDK-style code: remote datasets, one-off evaluations and
results exported to Patronus, against the loopback Patronus API (tests/servers.py)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from patronus_tasks import (
    Client,
    ConfigError,
    DatasetError,
    EvaluationResult,
    RemoteAPIError,
    TaskResult,
    evaluator,
    simple_evaluator,
    simple_task,
    task,
)

from .servers import FakeServer, PatronusAPI, serve

KEY = "pt-test-SECRET-0123456789"
REMOTE_ROWS = [
    {"dataset_id": "d-1", "sid": 7, "evaluated_model_input": "hi",
     "evaluated_model_gold_answer": "HI", "evaluated_model_retrieved_context": ["ctx"],
     "meta_evaluated_model_name": "gpt-x", "meta_evaluated_model_provider": "acme"},
    {"dataset_id": "d-1", "sid": 9, "evaluated_model_input": "yo",
     "evaluated_model_gold_answer": "no", "meta_evaluated_model_name": "gpt-x"},
]


@pytest.fixture
def patronus(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeServer, PatronusAPI]]:
    api = PatronusAPI()
    api.datasets["d-1"] = REMOTE_ROWS
    with serve(api) as server:
        monkeypatch.setenv("PATRONUS_API_KEY", KEY)
        monkeypatch.setenv("PATRONUS_API_URL", server.url)
        monkeypatch.setenv("PATRONUS_UI_URL", "https://ui.example")
        monkeypatch.delenv("PATRONUS_REPORT", raising=False)
        yield server, api


def _client(results_dir: Path, **kwargs: Any) -> Client:
    return Client(results_dir=results_dir, backend="local", **kwargs)


def test_remote_dataset_rows_ids_and_model_facts(patronus: tuple[FakeServer, PatronusAPI],
                                                 results_dir: Path) -> None:
    cli = _client(results_dir)
    exp = cli.experiment("sdk", dataset=cli.remote_dataset("d-1"), task=simple_task(str.upper),
                         evaluators=simple_evaluator(lambda o, g: o == g), print_summary=False)
    df = exp.to_dataframe().sort_values("sid")
    assert df["sid"].tolist() == ["7", "9"]
    assert df["pass"].tolist() == [True, False]
    facts = [json.loads(m) for m in df["task_metadata"]]
    assert facts[0] == {"evaluated_model_name": "gpt-x", "evaluated_model_provider": "acme"}
    assert facts[1] == {"evaluated_model_name": "gpt-x"}
    assert exp.info.dataset.source == "patronus:d-1"


def test_a_task_keeps_its_own_model_facts_over_the_datasets(
        patronus: tuple[FakeServer, PatronusAPI], results_dir: Path) -> None:
    @task
    def own(evaluated_model_input: str) -> TaskResult:
        return TaskResult(evaluated_model_output=evaluated_model_input, evaluated_model_name="mine")

    cli = _client(results_dir)
    df = cli.experiment("sdk", data=cli.remote_dataset("d-1"), task=own,
                        print_summary=False).to_dataframe()
    assert {json.loads(m)["evaluated_model_name"] for m in df["task_metadata"]} == {"mine"}


def test_remote_dataset_errors_are_clear(patronus: tuple[FakeServer, PatronusAPI],
                                         results_dir: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    cli = _client(results_dir)
    with pytest.raises(DatasetError, match=r"no dataset 'nope'.*check the id"):
        cli.experiment("sdk", data=cli.remote_dataset("nope"), task=simple_task(str.upper))
    monkeypatch.delenv("PATRONUS_API_KEY")
    with pytest.raises(ConfigError, match="remote datasets need a Patronus API key"):
        Client().remote_dataset("d-1")


def test_remote_dataset_loads_on_demand(patronus: tuple[FakeServer, PatronusAPI]) -> None:
    dataset = asyncio.run(Client().remote_dataset("d-1").load())
    assert len(dataset) == 2 and dataset.dataset_id == "d-1"


def test_evaluate_remote_sends_the_sdks_request(patronus: tuple[FakeServer, PatronusAPI]) -> None:
    server, _ = patronus
    result = Client().evaluate("lynx", "patronus:hallucination", evaluated_model_input="Who?",
                               evaluated_model_output="Barry", evaluated_model_retrieved_context="John",
                               tags={"t": "1"}, capture="fails-only")
    assert isinstance(result, EvaluationResult) and result.pass_ is True
    body = next(r for r in server.requests if r.path == "/v1/evaluate").body
    assert body["evaluators"] == [{"evaluator": "lynx", "criteria": "patronus:hallucination",
                                   "explain_strategy": "always"}]
    assert body["evaluated_model_retrieved_context"] == ["John"]
    assert (body["capture"], body["tags"]) == ("fails-only", {"t": "1"})


def test_evaluate_local_gets_every_field(patronus: tuple[FakeServer, PatronusAPI]) -> None:
    server, _ = patronus
    cli = Client()
    seen: dict[str, Any] = {}

    @cli.register_local_evaluator("iexact")
    def iexact(**kwargs: Any) -> bool:
        seen.update(kwargs)
        return kwargs["evaluated_model_output"].lower() == kwargs["evaluated_model_gold_answer"]

    result = cli.evaluate("iexact", evaluated_model_output="A", evaluated_model_gold_answer="a")
    assert result is not None and result.pass_ is True and result.evaluation_duration is not None
    assert set(seen) == {"evaluated_model_system_prompt", "evaluated_model_retrieved_context",
                         "evaluated_model_input", "evaluated_model_output",
                         "evaluated_model_gold_answer", "evaluated_model_attachments", "tags",
                         "explain_strategy"}
    assert not server.requests  # not reporting: nothing leaves the process
    assert iexact is cli._local_evaluators["iexact"]


def test_evaluate_async_and_local_export_when_reporting(
        patronus: tuple[FakeServer, PatronusAPI]) -> None:
    _, api = patronus
    cli = Client(report_to_patronus=True)

    @cli.register_local_evaluator("judge")
    async def judge(evaluated_model_output: str, **_: Any) -> EvaluationResult:
        return EvaluationResult(pass_=False, score_raw=0.2, tags={"k": "v"})

    result = asyncio.run(cli.evaluate_async("judge", evaluated_model_output="x", tags={"a": "b"}))
    assert result is not None and result.score_raw == 0.2
    [[exported]] = api.exported
    assert exported["evaluator_id"] == "judge" and exported["pass"] is False
    assert exported["tags"] == {"a": "b", "k": "v"}
    assert cli.evaluate("judge", evaluated_model_output="x", capture="none") is not None
    assert len(api.exported) == 1


def test_evaluate_refuses_unknown_keywords_and_reports_api_errors(
        patronus: tuple[FakeServer, PatronusAPI]) -> None:
    _, api = patronus
    with pytest.raises(ConfigError, match="unknown keywords \\['evaluated_model_ouput'\\]"):
        Client().evaluate("lynx", evaluated_model_ouput="x")
    api.faults = ["400"]
    with pytest.raises(RemoteAPIError) as err:
        Client().evaluate("lynx", "c", evaluated_model_output="x")
    assert KEY not in str(err.value)


def _judged(results_dir: Path, rows: int, **client: Any) -> Any:
    @evaluator
    def long_enough(evaluated_model_output: str) -> bool:
        return len(evaluated_model_output) > 1

    data = [{"evaluated_model_input": f"q{i}", "evaluated_model_gold_answer": f"Q{i}"}
            for i in range(rows)]
    cli = _client(results_dir, **client)
    return cli.experiment("My Project!", data=data, task=simple_task(str.upper),
                          evaluators=[long_enough, simple_evaluator(lambda o, g: o == g)],
                          tags={"model": "v2"}, experiment_name="run-1", max_concurrency=8,
                          print_summary=False)


def test_report_to_patronus_exports_every_result_in_batches_of_ten(
        patronus: tuple[FakeServer, PatronusAPI], results_dir: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    server, api = patronus
    exp = _judged(results_dir, 37, report_to_patronus=True)
    assert api.projects == {"My Project_": "proj-1"}
    assert api.experiments["exp-1"] == {"project_id": "proj-1", "name": "run-1",
                                        "tags": {"model": "v2"}, "id": "exp-1"}
    assert all(1 <= len(batch) <= 10 for batch in api.exported)
    sent = [r for batch in api.exported for r in batch]
    assert len(sent) == 74
    assert {(r["dataset_sample_id"], r["evaluator_id"]) for r in sent} == {
        (i + 1, name) for i in range(37) for name in ("long_enough", "simple_evaluator")}
    first = next(r for r in sent if r["dataset_sample_id"] == 1 and r["evaluator_id"] != "long_enough")
    assert first["experiment_id"] == "exp-1" and first["pass"] is True
    assert (first["evaluated_model_input"], first["evaluated_model_output"]) == ("q0", "Q0")
    assert first["evaluated_model_gold_answer"] == "Q0" and first["tags"] == {"model": "v2"}
    assert first["evaluation_duration"].startswith("PT")
    report = exp.manifest["reports"]["patronus"]
    assert (report["exported"], report["failed"], report["experiment_id"]) == (74, 0, "exp-1")
    assert "https://ui.example/experiments/exp-1?account_id=acc-7" in capsys.readouterr().out
    assert all(r.headers["x-api-key"] == KEY for r in server.requests)


def test_export_retries_then_counts_failures(patronus: tuple[FakeServer, PatronusAPI],
                                             results_dir: Path,
                                             caplog: pytest.LogCaptureFixture) -> None:
    _, api = patronus
    api.export_faults = ["500", "503"]  # retried, then accepted
    api.export_rejects = {5}  # the batches holding sample 5 fail every attempt
    with caplog.at_level(logging.WARNING, "patronus_tasks"):
        exp = _judged(results_dir, 20, report_to_patronus=True, max_attempts=3)
    report = exp.manifest["reports"]["patronus"]
    sent = [r["dataset_sample_id"] for batch in api.exported for r in batch]
    assert report["failed"] >= 1 and report["exported"] == len(sent)
    assert report["exported"] + report["failed"] == 40 and 5 not in sent
    assert "retry 1/2" in caplog.text
    assert len(exp.to_dataframe()) == 40  # the local results are complete either way
    assert "could not be exported to Patronus" in caplog.text
    assert KEY not in caplog.text and KEY not in json.dumps(report)


def test_report_via_environment_and_key_never_written(
        patronus: tuple[FakeServer, PatronusAPI], results_dir: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _, api = patronus
    monkeypatch.setenv("PATRONUS_REPORT", "1")
    exp = _judged(results_dir, 3)
    assert sum(len(b) for b in api.exported) == 6
    for path in exp.path.rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path
    assert KEY not in capsys.readouterr().out and KEY not in repr(Client())


def test_reporting_is_off_by_default_and_needs_a_key(
        patronus: tuple[FakeServer, PatronusAPI], results_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    server, _ = patronus
    exp = _judged(results_dir, 2)
    assert not server.requests and "reports" not in exp.manifest
    monkeypatch.delenv("PATRONUS_API_KEY")
    with pytest.raises(ConfigError, match="report_to_patronus need a Patronus API key"):
        Client(report_to_patronus=True)


def test_a_full_queue_holds_the_rows_back_and_drops_nothing(
        patronus: tuple[FakeServer, PatronusAPI], results_dir: Path) -> None:
    from patronus_tasks import run_experiment
    from patronus_tasks.patronus import PatronusReporter, patronus_endpoint

    _, api = patronus
    # A queue of 2 and one sender: most rows wait for room, none is dropped.
    reporter = PatronusReporter(patronus_endpoint(), queue_size=2, senders=1, linger=0.0)
    data = [{"evaluated_model_output": str(i), "evaluated_model_gold_answer": "g"}
            for i in range(30)]
    exp = run_experiment("p", data=data,
                         evaluators=[simple_evaluator(lambda o, g: True, name="e")],
                         backend="local", results_dir=results_dir, reporters=[reporter],
                         print_summary=False)
    assert sorted(r["dataset_sample_id"] for b in api.exported for r in b) == list(range(1, 31))
    assert exp.manifest["reports"]["patronus"]["exported"] == 30


def test_report_to_patronus_on_prefect(patronus: tuple[FakeServer, PatronusAPI],
                                       results_dir: Path, prefect_server: str) -> None:
    _, api = patronus
    exp = Client(results_dir=results_dir, report_to_patronus=True).experiment(
        "sdk", data=[{"evaluated_model_input": f"q{i}", "evaluated_model_gold_answer": "x"}
                     for i in range(12)],
        task=simple_task(str.upper), evaluators=simple_evaluator(lambda o, g: o == g),
        print_summary=False)
    assert sum(len(b) for b in api.exported) == 12
    assert exp.manifest["reports"]["patronus"]["exported"] == 12
