"""Calls recorded as Prefect task runs through bulk events, read back from a real server.
(The recorder against servers that lag, lose or flood: test_recorder.py; against servers
killed or without their event persister: test_recorder_restarts.py.)

This is also the contract test of the event format `prefect/events.py` sends,
which is internal to Prefect: the same calls run through Prefect's own task engine must
read back the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prefect import flow
from prefect import task as prefect_task
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterTaskRunId
from prefect.logging import get_run_logger
from prefect.states import Completed

from patronus_tasks import Row, run_experiment, task

from .conftest import RECORDED_WITHIN
from .shared_steps import answer, follow_up, respond, size, upper_judge

KINDS = ["ok", "flaky", "broken", "skip", "hang", "ok"]


async def _runs(flow_run_id: str) -> list[Any]:
    async with get_client() as client:
        return await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))


def _count(flow_run_id: str) -> int:
    from patronus_tasks.prefect.runs.flow import count_task_runs

    return asyncio.run(count_task_runs(flow_run_id))


def _settled(flow_run_id: str, count: int) -> list[Any]:
    """The flow run's task runs once ``count`` of them are in a final state (the engine's
    records reach the server as events too, a little after its flow returns)."""
    deadline = time.monotonic() + 60
    while True:
        runs = asyncio.run(_runs(flow_run_id))
        if len(runs) >= count and all(r.state and r.state.is_final() for r in runs):
            return runs
        if time.monotonic() > deadline:
            return runs
        time.sleep(0.5)


def _shape(runs: list[Any]) -> dict[str, tuple[str, str, int, list[str]]]:
    names = {str(r.id): r.name for r in runs}
    return {r.name: (r.state.type.value, r.state.name, r.run_count,
                     sorted(names.get(str(i.id), "?") for i in r.task_inputs.get("wait_for", [])))
            for r in runs}


def _messages(runs: list[Any]) -> dict[str, str | None]:
    return {r.name: r.state.message or None for r in runs if r.state.type.value == "COMPLETED"}


@prefect_task(cache_policy=NO_CACHE, persist_result=False)
async def _engine_call(step: str, kind: str, sid: str) -> Any:
    """What our calls do, returning the named states our records carry (a verdict)."""
    if step == "answer":
        value = respond(kind, f"t{int(sid) - 1}", f"engine:{sid}")
        return Completed(name="Skipped", message="task returned None") if value is None else value
    if step == "upper_judge":
        if kind == "hang":
            await asyncio.sleep(30)
        return Completed(name="Passed", message="score 0.5")
    if step == "size":
        return Completed(name="Scored", message=f"score {len(f't{int(sid) - 1}'):g}")
    return step


@flow(persist_result=False)
async def _engine_reference() -> str:
    """The same calls through Prefect's own task engine: names, retries, timeout, wait_for."""
    from prefect.context import FlowRunContext

    for i, kind in enumerate(KINDS):
        sid = str(i + 1)
        run = _engine_call.with_options(task_run_name=f"answer-{sid}", retries=2,
                                        retry_delay_seconds=0)
        state = await run("answer", kind, sid, return_state=True)
        if state.is_failed() or await state.result() is None:
            continue
        for name, timeout in (("upper_judge", 0.5), ("size", None)):
            await _engine_call.with_options(task_run_name=f"{name}-{sid}", timeout_seconds=timeout)(
                name, kind, sid, wait_for=[state], return_state=True)
        await _engine_call.with_options(task_run_name=f"follow_up-{sid}-link1")(
            "follow_up", kind, sid, return_state=True)
    ctx = FlowRunContext.get()
    assert ctx is not None and ctx.flow_run is not None
    return str(ctx.flow_run.id)


def test_calls_read_back_as_prefect_engine_task_runs(tmp_path: Path, results_dir: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    prefect_template_db: Path) -> None:
    # On a server of its own: on the shared one, a flush of Prefect's task-run recorder
    # that failed for another test's events lost this one's states too (a task run read
    # back with no state, twice in whole-suite runs).
    from .test_recorder_restarts import _server

    with _server(tmp_path, monkeypatch, prefect_template_db):
        _contract(results_dir)


def _contract(results_dir: Path) -> None:
    data = [{"kind": k, "text": f"t{i}", "run": "contract"} for i, k in enumerate(KINDS)]
    exp = run_experiment("recording", data=data, experiment_name="contract",
                         chain=[{"task": answer, "evaluators": [upper_judge, size]},
                                {"task": follow_up}],
                         results_dir=results_dir, print_summary=False, max_concurrency=3)
    assert exp.wait_recorded(RECORDED_WITHIN)
    ours = _settled(exp.manifest["flow_run_id"], 0)  # states land a little after the runs
    engine = _settled(asyncio.run(_engine_reference()), len(ours))
    assert _shape(ours) == _shape(engine)
    assert _messages(ours) == _messages(engine)
    shape = _shape(ours)
    assert shape["answer-2"] == ("COMPLETED", "Completed", 2, [])  # one retry used
    assert shape["answer-3"] == ("FAILED", "Failed", 3, [])
    assert shape["answer-4"] == ("COMPLETED", "Skipped", 1, [])  # returned None
    assert shape["upper_judge-5"][:2] == ("FAILED", "TimedOut")
    assert shape["upper_judge-1"] == ("COMPLETED", "Passed", 1, ["answer-1"])
    assert shape["size-1"] == ("COMPLETED", "Scored", 1, ["answer-1"])
    assert "follow_up-1-link1" in shape and "follow_up-4-link1" not in shape
    for run in ours:  # full records: times, key, tags, flow run
        assert run.start_time is not None and run.end_time is not None
        assert run.start_time <= run.end_time and run.flow_run_id is not None
        assert run.task_key in {"task-answer", "task-follow_up", "evaluator-upper_judge",
                                "evaluator-size"}
        assert {"project:recording", "experiment:contract"} <= set(run.tags)
    assert exp.manifest["flow_run_id"] and _manifest(exp)["prefect"] == {
        "task_runs": len(ours), "task_runs_recorded": len(ours), "task_runs_lost": 0,
        "complete": True}


def _manifest(exp: Any) -> dict[str, Any]:
    import json

    return dict(json.loads((exp.path / "manifest.json").read_text()))


@task
async def slow_and_chatty(row: Row) -> str:
    logging.getLogger("user.code").warning("thinking about %s", row.sid)
    logging.getLogger("user.other").error("still at %s", row.sid)
    if row.sid == "1":  # a slow call: it ends once the server shows it Running
        await _until_running(f"slow_and_chatty-{row.sid}")
    return "done"


async def _until_running(name: str) -> None:
    from prefect.settings import PREFECT_API_URL

    body = {"task_runs": {"name": {"any_": [name]}, "state": {"type": {"any_": ["RUNNING"]}}}}
    async with httpx.AsyncClient(base_url=str(PREFECT_API_URL.value()), timeout=10) as client:
        deadline, pause = time.monotonic() + 60, 0.05
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.TimeoutException):  # a loaded server: ask again
                if (await client.post("/task_runs/filter", json=body)).json():
                    return
            await asyncio.sleep(pause)
            pause = min(0.5, pause * 1.5)  # a server slow to show it is not asked 20 times a second
    raise TimeoutError(f"{name} was never shown Running")


@task
def asks_for_a_run_logger(row: Row) -> str:
    get_run_logger().info("prefect logger in %s", row.sid)
    return "done"


async def _states_and_logs(flow_run_id: str) -> dict[str, tuple[list[str], list[str]]]:
    async with get_client() as client:
        out = {}
        for run in await _runs(flow_run_id):
            states = await client.read_task_run_states(run.id)
            for _ in range(60):  # a task run's state history is written after the run itself
                if any(s.is_final() for s in states):
                    break
                await asyncio.sleep(0.5)
                states = await client.read_task_run_states(run.id)
            flt = LogFilter(task_run_id=LogFilterTaskRunId(any_=[run.id]))
            logs: list[Any] = []
            while page := await client.read_logs(flt, limit=200, offset=len(logs)):
                logs += page
            out[run.name] = ([s.name for s in sorted(states, key=lambda s: s.timestamp)],
                             [log.message for log in logs])
        return out


def test_slow_calls_show_running_and_logs_attach_to_their_task_run(
        tmp_path: Path, prefect_template_db: Path, results_dir: Path) -> None:
    # A server of its own: on the shared one, now and then a state row of these runs went
    # missing while the other tests' faults (stalls, resends, restarts of their recorders)
    # went on beside them (["Running"] without "Completed"; a fast run with no state row),
    # seen twice in four full runs and never alone. What this test checks is what the
    # recorder sends; its history here is exact.
    from .prefect_servers import api_of, start_server

    server = start_server(tmp_path / "home", prefect_template_db)
    try:
        with api_of(server.api_url):
            exp = run_experiment("recording", data=[{"x": 1}, {"x": 2}], task=slow_and_chatty,
                                 experiment_name="ui", results_dir=results_dir,
                                 print_summary=False)
            assert exp.wait_recorded(RECORDED_WITHIN)
            found = asyncio.run(_states_and_logs(exp.manifest["flow_run_id"]))
    finally:
        server.stop()
    # Row 1 returns only once the server showed its task run Running (else its row is an
    # error): still going after 1 s, it was sent Running, then Completed.
    assert list(exp.to_dataframe()["task_output"]) == ["done", "done"]
    assert found["slow_and_chatty-1"][0] == ["Running", "Completed"]
    # Fast: one event, not two.
    assert found["slow_and_chatty-2"][0] == ["Completed"]
    for sid in ("1", "2"):
        logs = found[f"slow_and_chatty-{sid}"][1]
        assert f"thinking about {sid}" in logs and f"still at {sid}" in logs
        assert len(logs) == 2


def test_a_run_logger_outside_a_flow_is_an_error_that_says_the_fix(
        prefect_server: str, results_dir: Path) -> None:
    # Calls run in the experiment's own process, outside any Prefect run: inside a user's
    # @flow, get_run_logger() works (test_prefect_run.py); outside one, the row says why.
    exp = run_experiment("recording", data=[{"x": 1}], task=asks_for_a_run_logger,
                         experiment_name="no-context", results_dir=results_dir,
                         print_summary=False)
    message = exp.to_dataframe()["error_message"][0]
    assert "get_run_logger()" in message and "logging.getLogger(__name__)" in message
    assert "inside your own @flow" in message
