"""Calls recorded as Prefect task runs through bulk events, read back from a real server.

This is also the contract test of the event format `integrations/prefect/events.py` sends,
which is internal to Prefect: the same calls run through Prefect's own task engine must
read back the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from prefect import flow
from prefect import task as prefect_task
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterTaskRunId
from prefect.logging import get_run_logger
from prefect.states import Completed

from patronus_tasks import Row, evaluator, run_experiment, task
from patronus_tasks.integrations.prefect import internal
from patronus_tasks.integrations.prefect.events import Call, State
from patronus_tasks.integrations.prefect.recorder import Limits, TaskRunRecorder
from patronus_tasks.integrations.prefect.runs import FINAL_STATES

from .prefect_gate import Gate
from .shared_steps import answer, follow_up, respond, size, upper_judge
from .waits import until

KINDS = ["ok", "flaky", "broken", "skip", "hang", "ok"]


async def _runs(flow_run_id: str) -> list[Any]:
    async with get_client() as client:
        return await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))


def _count(flow_run_id: str) -> int:
    from patronus_tasks.integrations.prefect.runs import count_task_runs

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


def test_calls_read_back_as_prefect_engine_task_runs(prefect_server: str, results_dir: Path) -> None:
    data = [{"kind": k, "text": f"t{i}", "run": "contract"} for i, k in enumerate(KINDS)]
    exp = run_experiment("recording", data=data, experiment_name="contract",
                         chain=[{"task": answer, "evaluators": [upper_judge, size]},
                                {"task": follow_up}],
                         results_dir=results_dir, print_summary=False, max_concurrency=3)
    assert exp.wait_recorded(60)
    ours = asyncio.run(_runs(exp.manifest["flow_run_id"]))
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
    body = {"task_runs": {"name": {"any_": [name]}, "state": {"type": {"any_": ["RUNNING"]}}}}
    async with httpx.AsyncClient(base_url=os.environ["PREFECT_API_URL"], timeout=10) as client:
        for _ in range(1200):
            if (await client.post("/task_runs/filter", json=body)).json():
                return
            await asyncio.sleep(0.05)
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
            flt = LogFilter(task_run_id=LogFilterTaskRunId(any_=[run.id]))
            logs: list[Any] = []
            while page := await client.read_logs(flt, limit=200, offset=len(logs)):
                logs += page
            out[run.name] = ([s.name for s in sorted(states, key=lambda s: s.timestamp)],
                             [log.message for log in logs])
        return out


def test_slow_calls_show_running_and_logs_attach_to_their_task_run(
        prefect_server: str, results_dir: Path) -> None:
    exp = run_experiment("recording", data=[{"x": 1}, {"x": 2}], task=slow_and_chatty,
                         experiment_name="ui", results_dir=results_dir, print_summary=False)
    assert exp.wait_recorded(60)
    found = asyncio.run(_states_and_logs(exp.manifest["flow_run_id"]))
    assert found["slow_and_chatty-1"][0] == ["Running", "Completed"]  # still going after 1 s
    assert found["slow_and_chatty-2"][0] == ["Completed"]  # fast: one event, not two
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


def test_a_flood_of_logs_is_bounded_and_counted(
        prefect_gate: Gate, caplog: pytest.LogCaptureFixture) -> None:
    # Logs come faster than the server takes them (each post held 2 s by the gate): past
    # `max_logs` waiting, they are dropped and counted, never held without bound.
    prefect_gate.log_delay = 2.0

    async def record() -> tuple[str, TaskRunRecorder, str]:
        flow_run_id = await _new_flow_run("flood")
        recorder = TaskRunRecorder(flow_run_id, [], limits=Limits(max_logs=500)).start()
        task_run_id = _record(recorder, "task-floods", 1)[0]
        for i in range(3_000):
            recorder.log({"name": "user.flood", "level": logging.WARNING, "message": f"line {i}",
                          "timestamp": dt.datetime.now(dt.UTC).isoformat(),
                          "task_run_id": task_run_id})
        recorder.close()
        return flow_run_id, recorder, task_run_id

    flow_run_id, recorder, _ = asyncio.run(record())
    assert recorder.wait(60)
    assert recorder.logs_dropped >= 1_000  # past the bound: dropped, not held
    assert "log records of calls were dropped" in caplog.text
    logs = asyncio.run(_states_and_logs(flow_run_id))["task-floods-0"][1]
    assert 500 <= len(logs) == 3_000 - recorder.logs_dropped


def _nothing() -> None:
    pass


async def _new_flow_run(flow_name: str) -> str:
    """A flow run made through the API, for recorders to record into."""
    async with get_client() as client:
        created = await client.create_flow_run(flow(name=flow_name)(_nothing))
    return str(created.id)


def _record(recorder: TaskRunRecorder, step: str, count: int, prefix: str = "") -> list[str]:
    """``count`` finished calls of ``step`` (a task or an evaluator), as events."""
    ids, now = [], dt.datetime.now(dt.UTC)
    for i in range(count):
        call = Call(str(uuid.uuid4()), f"{prefix}{step}-{i}", step, None, now, 0, 0.0)
        ids.append(call.task_run_id)
        recorder.finished(call, State("COMPLETED", "Completed"), 1, now)
    return ids


class AheadCheck:
    """At the gate, before each post of events: the events posted so far (each once,
    however often it went), this post's included, that the slower of the server's task-run
    recorder and event persister has not taken yet, counted over the flow run."""

    def __init__(self, api_url: str, since: dt.datetime) -> None:
        self.api_url, self.since, self.flow_run_id = api_url, since, ""
        self.posted: set[str] = set()
        self.ahead: list[int] = []
        self.lock = threading.Lock()

    def __call__(self, body: bytes) -> bytes:
        recorded = min(self._count("/task_runs/count", {
            "flow_runs": {"id": {"any_": [self.flow_run_id]}},
            "task_runs": {"state": {"type": {"any_": FINAL_STATES}}}}),
            self._count("/events/filter", {"filter": {
                "related": {"id": [f"prefect.flow-run.{self.flow_run_id}"]},
                "occurred": {"since": self.since.isoformat(), "until": "2999-01-01T00:00:00Z"}},
                "limit": 1}))
        with self.lock:
            self.posted |= {event["id"] for event in orjson.loads(body)}
            self.ahead.append(len(self.posted) - recorded)
        return body

    def _count(self, path: str, body: dict[str, Any]) -> int:
        found = httpx.post(f"{self.api_url}{path}", json=body, timeout=30).json()
        return int(found["total"] if isinstance(found, dict) else found)


def test_recorders_posting_at_once_stay_within_the_bound_together(
        prefect_server: str, prefect_gate: Gate) -> None:
    # Prefect's broker drops events past 10,000 queued per consumer: the posters (Dask
    # batches each have their own) must wait for the server to record and store them.
    check = prefect_gate.on_events = AheadCheck(prefect_server, dt.datetime.now(dt.UTC))
    recorders: list[TaskRunRecorder] = []

    async def record() -> str:
        flow_run_id = check.flow_run_id = await _new_flow_run("shared-bound")
        recorders.extend(TaskRunRecorder(flow_run_id, [], share=3, limits=Limits(max_ahead=150))
                         .start() for _ in range(3))
        for n, r in enumerate(recorders):
            _record(r, "evaluator-short", 200, prefix=f"r{n}-")
            r.close()
        return flow_run_id

    flow_run_id = asyncio.run(record())
    assert all(r.wait(120) for r in recorders)
    assert sum(r.recorded for r in recorders) == 600 == _count(flow_run_id)
    assert len(check.ahead) >= 6 and max(check.ahead) <= 150, check.ahead


def test_rows_task_runs_are_posted_before_their_evaluators(prefect_server: str) -> None:
    # When the server lags, every row's own task run is recorded first: evaluator events
    # made earlier wait behind task events made later.
    async def record() -> tuple[str, TaskRunRecorder]:
        flow_run_id = await _new_flow_run("rows-first")
        # batches of 10, each waits for the last
        recorder = TaskRunRecorder(flow_run_id, [], limits=Limits(max_ahead=10)).start()
        _record(recorder, "evaluator-short", 30)
        _record(recorder, "task-first", 30)
        recorder.close()
        return flow_run_id, recorder

    flow_run_id, recorder = asyncio.run(record())
    assert recorder.wait(60) and recorder.recorded == 60
    runs = asyncio.run(_runs(flow_run_id))
    created = {kind: sorted(r.created for r in runs if r.name.startswith(kind))
               for kind in ("task-first-", "evaluator-short-")}
    assert created["task-first-"][-1] <= created["evaluator-short-"][0]


@contextlib.contextmanager
def _server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, template: Path,
            *services_off: str) -> Iterator[Any]:
    """A real Prefect server of its own (these services off), as the API meanwhile."""
    from .prefect_servers import api_of, start_server

    for service in services_off:
        monkeypatch.setenv(f"PREFECT_SERVER_SERVICES_{service}_ENABLED", "false")
    server = start_server(tmp_path / "home", template)
    try:
        with api_of(server.api_url):
            yield server
    finally:
        server.stop()


@evaluator
def short(evaluated_model_output: str) -> bool:
    return len(evaluated_model_output) < 4


@pytest.mark.heavy
def test_without_the_event_persister_task_runs_alone_count(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefect_template_db: Path) -> None:
    # A server whose event persister is off stores no event: waiting for stored events
    # would never end; the recorder notices and counts task runs alone.
    async def record() -> tuple[str, TaskRunRecorder]:
        flow_run_id = await _new_flow_run("no-persister")
        limits = Limits(max_ahead=100, persister_grace_seconds=3.0)
        recorder = TaskRunRecorder(flow_run_id, [], limits=limits).start()
        _record(recorder, "evaluator-short", 300)
        recorder.close()
        return flow_run_id, recorder

    with _server(tmp_path, monkeypatch, prefect_template_db, "EVENT_PERSISTER"):
        flow_run_id, recorder = asyncio.run(record())
        assert recorder.wait(90) and recorder.recorded == 300
        assert _count(flow_run_id) == 300
    assert not recorder.backlog.persisting


class Unrecordable:
    """At the gate: the first ``posts`` posts of events (all, if None) reach the server but
    are never recorded: they say another orchestration, which its task-run recorder passes
    over (its broker takes their ids all the same). Keeps the bodies posted."""

    def __init__(self, posts: int | None = None) -> None:
        self.posts, self.bodies = posts, list[bytes]()

    def __call__(self, body: bytes) -> bytes:
        self.bodies.append(body)
        if self.posts is None or len(self.bodies) <= self.posts:
            body = body.replace(b'"prefect.orchestration":"client"',
                                b'"prefect.orchestration":"lost"')
        return body


def test_a_server_that_records_nothing_is_given_up_on_and_said_so(
        prefect_gate: Gate, caplog: pytest.LogCaptureFixture) -> None:
    prefect_gate.on_events = Unrecordable()

    async def record() -> TaskRunRecorder:
        limits = Limits(max_ahead=100, stall_seconds=1.0, give_up_seconds=4.0)
        recorder = TaskRunRecorder(await _new_flow_run("records-nothing"), [], limits=limits)
        _record(recorder.start(), "evaluator-short", 400)
        recorder.close()
        return recorder

    recorder = asyncio.run(record())
    assert recorder.wait(60)
    assert recorder.lost == 400 and recorder.recorded == 0
    assert [r for r in caplog.records if "sending them again" in r.getMessage()]
    gave_up = [r for r in caplog.records if "are not recorded" in r.getMessage()]
    assert len(gave_up) == 1, [r.getMessage() for r in gave_up]


def test_events_the_server_took_and_lost_go_again_under_new_ids(prefect_gate: Gate) -> None:
    # The server's broker drops an event whose id it took in the last five minutes, so
    # events it took and then lost (a full broker, a failed flush) only count when sent
    # under new ids. Lost here: the first post (`Unrecordable`). The first resend keeps
    # the ids (a server merely slow would otherwise record each state twice); it is
    # dropped, and the next one, under new ids, is recorded.
    lossy = prefect_gate.on_events = Unrecordable(posts=1)

    async def record() -> tuple[str, TaskRunRecorder, list[str]]:
        flow_run_id = await _new_flow_run("took-and-lost")
        recorder = TaskRunRecorder(flow_run_id, [], limits=Limits(stall_seconds=1.0)).start()
        ids = _record(recorder, "evaluator-short", 40)
        recorder.close()
        return flow_run_id, recorder, ids

    flow_run_id, recorder, ids = asyncio.run(record())
    assert recorder.wait(60) and recorder.recorded == 40 and recorder.lost == 0
    assert _count(flow_run_id) == 40  # each task run once
    first, *again = (orjson.loads(b) for b in lossy.bodies)
    resent = [e for body in again for e in body]  # (more than once, if the server lags)
    first_ids = {e["id"] for e in first}
    renewed = [e for e in resent if e["id"] not in first_ids]
    assert {e["resource"]["prefect.resource.id"] for e in renewed} == {
        f"prefect.task-run.{i}" for i in ids}  # the same task runs under new ids, ...
    assert first_ids & {e["id"] for e in resent}  # ... once the same ids did not do


@task
async def paced(row: Row) -> str:
    await asyncio.sleep(0.05)
    return f"out {row.sid}"


@pytest.mark.heavy
def test_a_server_killed_and_restarted_mid_run_loses_nothing(
        tmp_path: Path, results_dir: Path, monkeypatch: pytest.MonkeyPatch,
        prefect_template_db: Path) -> None:
    # Killed with events in its broker (taken, not yet recorded), restarted on the same
    # database: what it lost is sent again, with the same ids, and nothing doubles.
    import contextvars


    # (The recorder process sends the run's tail, lost at the kill, again after its
    # `recorder.STALL_SECONDS`.)
    with _server(tmp_path, monkeypatch, prefect_template_db) as server:
        done: dict[str, Any] = {}

        def experiment() -> None:
            done["exp"] = run_experiment(
                "restart", data=[{"x": i} for i in range(400)], task=paced, evaluators=[short],
                results_dir=results_dir, print_summary=False, max_concurrency=4)

        runner = threading.Thread(target=contextvars.copy_context().run, args=(experiment,))
        runner.start()
        until(lambda: _recorded_so_far(server.api_url) >= 200, "200 task runs recorded")
        server.kill()
        server.start()
        runner.join(180)
        exp = done["exp"]
        assert exp.wait_recorded(180)
        flow_run_id = exp.manifest["flow_run_id"]
        assert _count(flow_run_id) == 800  # every call once, in its final state
        assert _count_all(flow_run_id) == 800  # and no other task run


def _recorded_so_far(api_url: str) -> int:
    """Task runs on the server so far, of any flow run (the experiment's is not known yet)."""
    try:
        return int(httpx.post(f"{api_url}/task_runs/count", json={}, timeout=5).json())
    except httpx.HTTPError:
        return 0


def _count_all(flow_run_id: str) -> int:
    """Task runs of the flow run, in any state."""
    async def count() -> int:
        async with get_client() as client:
            return await internal.count_task_runs(
                client, {"flow_runs": {"id": {"any_": [flow_run_id]}}})

    return asyncio.run(count())
