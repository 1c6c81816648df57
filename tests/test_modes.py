"""The fast mode (calls in asyncio, recorded through bulk events) against the engine mode
(a Prefect task engine run per call): same results, same task-run records.

This is also the contract test of the event format `_events.py` sends, which is internal
to Prefect: rows are recorded that way and read back through the Prefect API.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

from patronus_tasks import EvaluationResult, Parent, Row, TaskResult, evaluator, run_experiment, task

CALLS: dict[str, int] = {}


@task(retries=2, retry_delay_seconds=0)
async def first(row: Row) -> TaskResult | None:
    key = f"{row.sid}:{row.attempt_key}"
    CALLS[key] = CALLS.get(key, 0) + 1
    if row.kind == "flaky" and CALLS[key] < 2:
        raise ConnectionError("flaky model")
    if row.kind == "broken":
        raise ValueError("always broken")
    if row.kind == "skip":
        return None
    return TaskResult(evaluated_model_output=row.text.upper(), tags={"k": row.kind})


@evaluator(timeout_seconds=0.5)
async def slow_judge(row: Row, task_result: TaskResult) -> EvaluationResult:
    if row.kind == "hang":
        await asyncio.sleep(30)
    return EvaluationResult(pass_=task_result.evaluated_model_output.isupper(), score_raw=0.5)


@evaluator
def length(task_result: TaskResult) -> float:
    return float(len(task_result.evaluated_model_output))


@task
def second(parent: Parent) -> str:
    return f"{parent.task.evaluated_model_output}:{parent.find_eval_result('length').score_raw}"


KINDS = ["ok", "flaky", "broken", "skip", "hang", "ok"]
COLUMNS = ["sid", "link_index", "task_name", "evaluator_name", "status", "error_stage", "pass",
           "score", "task_output", "task_tags", "task_attempts", "evaluation_attempts", "error_type"]


async def _new_flow_run(flow_name: str) -> str:
    """A bare flow run made through the API, for recorders to record into."""
    async with get_client() as client:
        flow_id = await client.create_flow_from_name(flow_name)
        created = await client._client.post("/flow_runs/", json={"flow_id": str(flow_id)})
    return str(created.json()["id"])


async def _runs(flow_run_id: str) -> list[Any]:
    async with get_client() as client:
        return await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))


def _run(mode: str, results_dir: Path) -> tuple[pd.DataFrame, list[Any]]:
    data = [{"kind": k, "text": f"t{i}", "attempt_key": mode} for i, k in enumerate(KINDS)]
    exp = run_experiment("modes", data=data, experiment_name=mode, mode=mode,  # type: ignore[arg-type]
                         chain=[{"task": first, "evaluators": [slow_judge, length]},
                                {"task": second}],
                         results_dir=results_dir, print_summary=False, max_concurrency=3)
    df = exp.to_dataframe()[COLUMNS].sort_values(["sid", "link_index", "evaluator_name"],
                                                 na_position="first").reset_index(drop=True)
    return df, asyncio.run(_runs(exp.manifest["flow_run_id"]))


def _shape(runs: list[Any]) -> dict[str, tuple[str, str, int, list[str]]]:
    names = {str(r.id): r.name for r in runs}
    return {r.name: (r.state.type.value, r.state.name, r.run_count,
                     sorted(names.get(str(i.id), "?") for i in r.task_inputs.get("wait_for", [])))
            for r in runs}


@pytest.mark.parametrize("mode", ["fast"])
def test_fast_mode_matches_engine_mode(prefect_server: str, results_dir: Path, mode: str) -> None:
    engine_df, engine_runs = _run("engine", results_dir)
    fast_df, fast_runs = _run(mode, results_dir)
    pd.testing.assert_frame_equal(engine_df, fast_df)
    assert engine_df.set_index(["sid", "link_index"]).loc[("2", 0), "task_attempts"].tolist() == [2, 2]
    assert set(engine_df["error_type"].dropna()) == {"ValueError", "TimeoutError"}
    engine, fast = _shape(engine_runs), _shape(fast_runs)
    assert fast == engine
    assert engine["first-3"] == ("FAILED", "Failed", 3, [])
    assert engine["slow_judge-5"][:2] == ("FAILED", "TimedOut")
    assert engine["length-1"] == ("COMPLETED", "Completed", 1, ["first-1"])
    assert "second-1-link1" in engine and "second-4-link1" not in engine
    for run in fast_runs:  # full records: times, key, tags, flow run
        assert run.start_time is not None and run.end_time is not None
        assert run.start_time <= run.end_time and run.flow_run_id is not None
        assert run.task_key in {"task-first", "task-second", "evaluator-slow_judge",
                                "evaluator-length"}
        assert {"project:modes", "experiment:fast"} <= set(run.tags)


def test_fast_mode_posts_no_further_ahead_of_the_server_than_max_ahead(
        prefect_server: str, results_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prefect's broker drops events past 10,000 queued per consumer: the poster must wait
    # for the server to record and store what it was sent. Checked against the real
    # server's counts of task runs and of stored events.
    # The poster reads the server's progress from marks (`_backlog`); this test counts
    # everything the flow run has instead.
    from patronus_tasks import _events
    from patronus_tasks._prefect import count_task_runs

    monkeypatch.setattr(_events, "MAX_AHEAD", 100)
    ahead: list[int] = []
    post = _events.TaskRunRecorder._post
    since = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
    events0: list[int] = []

    async def checked(self: Any, batch: Any) -> None:
        # Of the events sent, the slower of the recorder and the persister has taken:
        runs = await count_task_runs(self.flow_run_id, self._client)
        events = await _count_events(self.flow_run_id, since, self._client)
        events0.extend([] if events0 else [events])  # the flow run's own, before ours
        ahead.append(self.sent + batch.count - min(runs, events - events0[0]))
        await post(self, batch)

    monkeypatch.setattr(_events.TaskRunRecorder, "_post", checked)

    @evaluator
    def short(evaluated_model_output: str) -> bool:
        return len(evaluated_model_output) < 4

    exp = run_experiment("ahead", data=[{"evaluated_model_output": str(i)} for i in range(150)],
                         evaluators=[short, length_of_output], mode="fast",
                         results_dir=results_dir, print_summary=False, max_concurrency=8)
    assert len(ahead) >= 3 and max(ahead) <= 100, ahead
    assert asyncio.run(count_task_runs(exp.manifest["flow_run_id"])) == 300


def test_recorders_posting_at_once_share_the_bound(
        prefect_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Dask batches each post their own events to one server: together they must stay
    # within MAX_AHEAD of it, or its broker drops what is past its queue.
    from patronus_tasks import _events
    from patronus_tasks._prefect import count_task_runs, wait_until_recorded
    from patronus_tasks._runner import Invocation

    monkeypatch.setattr(_events, "MAX_AHEAD", 100)
    post, ahead, since = _events.TaskRunRecorder._post, [], dt.datetime.now(dt.UTC)
    recorders: list[Any] = []

    async def checked(self: Any, batch: Any) -> None:
        runs = await count_task_runs(self.flow_run_id, self._client)
        events = await _count_events(self.flow_run_id, since, self._client)
        ahead.append(sum(r.sent for r in recorders) + batch.count - min(runs, events))
        await post(self, batch)

    monkeypatch.setattr(_events.TaskRunRecorder, "_post", checked)

    async def one(flow_run_id: str, name: str) -> None:
        async with _events.TaskRunRecorder(flow_run_id, [], share=3) as recorder:
            recorders.append(recorder)
            now = dt.datetime.now(dt.UTC)
            for i in range(200):
                inv = Invocation(_short, {}, f"{name}-{i}", None)
                recorder.finished(str(uuid.uuid4()), inv, None, now, now)

    async def record() -> str:
        flow_run_id = await _new_flow_run("shared-bound")
        await asyncio.gather(*(one(flow_run_id, f"r{n}") for n in range(3)))
        return await wait_until_recorded(flow_run_id, 600, last=[r.last_task_run_id
                                                               for r in recorders])

    assert asyncio.run(record()) == 600
    assert len(ahead) >= 6 and max(ahead) <= 100, ahead


async def _count_events(flow_run_id: str, since: dt.datetime, client: Any) -> int:
    """Events related to this flow run, from ``since`` on, that the server stored."""
    body = {"filter": {"related": {"id": [f"prefect.flow-run.{flow_run_id}"]},
                       "occurred": {"since": since.isoformat(), "until": "2999-01-01T00:00:00Z"}},
            "limit": 1}
    response = await client._client.post("/events/filter", json=body)
    response.raise_for_status()
    return int(response.json()["total"])


@evaluator
def length_of_output(evaluated_model_output: str) -> float:
    return float(len(evaluated_model_output))


def test_waiting_for_records_says_how_many_are_missing(
        prefect_server: str, caplog: pytest.LogCaptureFixture) -> None:
    from patronus_tasks._prefect import wait_until_recorded

    async def missing() -> int:
        return await wait_until_recorded(await _new_flow_run("nothing-recorded"), expected=3,
                                         timeout=1)

    with caplog.at_level("WARNING", logger="patronus_tasks"):
        assert asyncio.run(missing()) == 0
    assert "recorded 0 of this experiment's 3 task runs" in caplog.text


def test_fast_mode_paces_by_task_runs_alone_when_the_server_stores_no_events(
        tmp_path: Path, results_dir: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, prefect_template_db: Path) -> None:
    # A server whose event persister is off stores no event: waiting for stored events
    # would stall the poster; it must notice and pace by the task-run recorder alone.
    from patronus_tasks import _events
    from patronus_tasks._prefect import count_task_runs

    monkeypatch.setattr(_events, "MAX_AHEAD", 100)
    monkeypatch.setattr(_events, "_STALL_SECONDS", 8.0)
    monkeypatch.setattr(_events, "_PERSISTER_GRACE_SECONDS", 3.0)
    backlogs = []
    aclose = _events.TaskRunRecorder.aclose

    async def closing(self: Any) -> None:
        backlogs.append(self.backlog)
        await aclose(self)

    monkeypatch.setattr(_events.TaskRunRecorder, "aclose", closing)
    with _server_without(tmp_path, monkeypatch, prefect_template_db, "EVENT_PERSISTER"):
        exp = run_experiment(
            "no-persister", data=[{"evaluated_model_output": str(i)} for i in range(150)],
            evaluators=[length_of_output, _short], mode="fast", results_dir=results_dir,
            print_summary=False, max_concurrency=8)
        assert asyncio.run(count_task_runs(exp.manifest["flow_run_id"])) == 300
    assert backlogs and not backlogs[0].persisting
    assert not [r for r in caplog.records if "took none" in r.getMessage()]


@contextlib.contextmanager
def _server_without(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, template: Path,
                    *services: str) -> Iterator[None]:
    """A real Prefect server of its own with these services off, as the API meanwhile."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from patronus_tasks import _stack

    from .prefect_servers import start_server

    for service in services:
        monkeypatch.setenv(f"PREFECT_SERVER_SERVICES_{service}_ENABLED", "false")
    stack = start_server(tmp_path / "home", template)
    try:
        with temporary_settings({PREFECT_API_URL: stack.api_url}):
            yield
    finally:
        _stack.down(tmp_path / "home")


@evaluator
def _short(evaluated_model_output: str) -> bool:
    return len(evaluated_model_output) < 4


def test_fast_mode_stops_pacing_after_one_stall_of_a_server_that_records_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        prefect_template_db: Path) -> None:
    # A server that records nothing (recorder and persister off): the poster waits one
    # stall, says so once, and posts the rest without waiting again for every batch.
    from patronus_tasks import _events
    from patronus_tasks._runner import Invocation

    monkeypatch.setattr(_events, "MAX_AHEAD", 100)
    monkeypatch.setattr(_events, "_STALL_SECONDS", 1.0)

    async def record() -> int:
        now = dt.datetime.now(dt.UTC)
        async with _events.TaskRunRecorder(await _new_flow_run("records-nothing"), []) as recorder:
            for i in range(400):
                inv = Invocation(_short, {}, f"_short-{i}", None)
                recorder.finished(str(uuid.uuid4()), inv, None, now, now)
        return recorder.sent

    with _server_without(tmp_path, monkeypatch, prefect_template_db, "EVENT_PERSISTER",
                         "TASK_RUN_RECORDER"):
        assert asyncio.run(record()) == 400
    stalls = [r for r in caplog.records if "took none" in r.getMessage()]
    assert len(stalls) == 1, [r.getMessage() for r in stalls]


def test_fast_mode_posts_the_rows_task_runs_before_their_evaluators(
        prefect_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # When the server lags, every row's own task run should be recorded first: evaluator
    # events made earlier wait behind task events made later.
    from patronus_tasks import _events, _prefect
    from patronus_tasks._runner import Invocation

    monkeypatch.setattr(_events, "MAX_AHEAD", 10)  # batches of 10, each waits for the last

    async def record() -> str:
        flow_run_id = await _new_flow_run("rows-first")
        now, ids = dt.datetime.now(dt.UTC), []
        async with _events.TaskRunRecorder(flow_run_id, []) as recorder:
            for step, count in ((_short, 30), (first, 30)):
                for i in range(count):
                    ids.append(str(uuid.uuid4()))
                    recorder.finished(ids[-1], Invocation(step, {}, f"{step.name}-{i}", None),
                                      None, now, now)
        # Posted last: the last evaluator event (the end of the run waits for it).
        assert recorder.last_task_run_id == ids[29]
        assert await _prefect.wait_until_recorded(flow_run_id, 60,
                                                  last=[recorder.last_task_run_id]) == 60
        return flow_run_id

    runs = asyncio.run(_runs(asyncio.run(record())))
    assert len(runs) == 60
    created = {kind: sorted(r.created for r in runs if r.name.startswith(kind))
               for kind in ("first-", "_short-")}
    assert created["first-"][-1] <= created["_short-"][0]
