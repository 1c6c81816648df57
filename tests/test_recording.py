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
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from prefect import flow
from prefect import task as prefect_task
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterTaskRunId
from prefect.logging import get_run_logger
from prefect.states import Completed

from patronus_tasks import EvaluationResult, Parent, Row, TaskResult, evaluator, run_experiment, task
from patronus_tasks.integrations.prefect import recorder as _recorder
from patronus_tasks.integrations.prefect.events import Call, State
from patronus_tasks.integrations.prefect.recorder import TaskRunRecorder

CALLS: dict[str, int] = {}


def _first(kind: str, text: str, key: str) -> TaskResult | None:
    CALLS[key] = CALLS.get(key, 0) + 1
    if kind == "flaky" and CALLS[key] < 2:
        raise ConnectionError("flaky model")
    if kind == "broken":
        raise ValueError("always broken")
    if kind == "skip":
        return None
    return TaskResult(evaluated_model_output=text.upper(), tags={"k": kind})


@task(retries=2, retry_delay_seconds=0)
async def first(row: Row) -> TaskResult | None:
    return _first(row.kind, row.text, f"{row.sid}:ours")


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
    if step == "first":
        value = _first(kind, f"t{int(sid) - 1}", f"{sid}:engine")
        return Completed(name="Skipped", message="task returned None") if value is None else value
    if step == "slow_judge":
        if kind == "hang":
            await asyncio.sleep(30)
        return Completed(name="Passed", message="score 0.5")
    if step == "length":
        return Completed(name="Scored", message=f"score {len(f't{int(sid) - 1}'):g}")
    return step


@flow(persist_result=False)
async def _engine_reference() -> str:
    """The same calls through Prefect's own task engine: names, retries, timeout, wait_for."""
    from prefect.context import FlowRunContext

    for i, kind in enumerate(KINDS):
        sid = str(i + 1)
        run = _engine_call.with_options(task_run_name=f"first-{sid}", retries=2,
                                        retry_delay_seconds=0)
        state = await run("first", kind, sid, return_state=True)
        if state.is_failed() or await state.result() is None:
            continue
        for name, timeout in (("slow_judge", 0.5), ("length", None)):
            await _engine_call.with_options(task_run_name=f"{name}-{sid}", timeout_seconds=timeout)(
                name, kind, sid, wait_for=[state], return_state=True)
        await _engine_call.with_options(task_run_name=f"second-{sid}-link1")(
            "second", kind, sid, return_state=True)
    ctx = FlowRunContext.get()
    assert ctx is not None and ctx.flow_run is not None
    return str(ctx.flow_run.id)


def test_calls_read_back_as_prefect_engine_task_runs(prefect_server: str, results_dir: Path) -> None:
    data = [{"kind": k, "text": f"t{i}"} for i, k in enumerate(KINDS)]
    exp = run_experiment("recording", data=data, experiment_name="contract",
                         chain=[{"task": first, "evaluators": [slow_judge, length]},
                                {"task": second}],
                         results_dir=results_dir, print_summary=False, max_concurrency=3)
    assert exp.wait_recorded(60)
    ours = asyncio.run(_runs(exp.manifest["flow_run_id"]))
    engine = _settled(asyncio.run(_engine_reference()), len(ours))
    assert _shape(ours) == _shape(engine)
    assert _messages(ours) == _messages(engine)
    shape = _shape(ours)
    assert shape["first-2"] == ("COMPLETED", "Completed", 2, [])  # one retry used
    assert shape["first-3"] == ("FAILED", "Failed", 3, [])
    assert shape["first-4"] == ("COMPLETED", "Skipped", 1, [])  # returned None
    assert shape["slow_judge-5"][:2] == ("FAILED", "TimedOut")
    assert shape["slow_judge-1"] == ("COMPLETED", "Passed", 1, ["first-1"])
    assert shape["length-1"] == ("COMPLETED", "Scored", 1, ["first-1"])
    assert "second-1-link1" in shape and "second-4-link1" not in shape
    for run in ours:  # full records: times, key, tags, flow run
        assert run.start_time is not None and run.end_time is not None
        assert run.start_time <= run.end_time and run.flow_run_id is not None
        assert run.task_key in {"task-first", "task-second", "evaluator-slow_judge",
                                "evaluator-length"}
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
    await asyncio.sleep(1.6 if row.sid == "1" else 0)
    return "done"


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
    assert found["slow_and_chatty-1"][0] == ["Running", "Completed"]  # ran over a second
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
        prefect_server: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # Logs come faster than the server takes them (each post held 2 s here): past
    # MAX_LOGS waiting, they are dropped and counted, never held without bound.
    from patronus_tasks.integrations.prefect import internal

    post = internal.post_logs

    async def slow(client: Any, logs: list[dict[str, Any]]) -> None:
        await asyncio.sleep(2.0)
        await post(client, logs)

    monkeypatch.setattr(internal, "post_logs", slow)
    monkeypatch.setattr(_recorder, "MAX_LOGS", 500)

    async def record() -> tuple[str, TaskRunRecorder, str]:
        flow_run_id = await _new_flow_run("flood")
        recorder = TaskRunRecorder(flow_run_id, []).start()
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


async def _new_flow_run(flow_name: str) -> str:
    """A bare flow run made through the API, for recorders to record into."""
    async with get_client() as client:
        flow_id = await client.create_flow_from_name(flow_name)
        created = await client._client.post("/flow_runs/", json={"flow_id": str(flow_id)})
    return str(created.json()["id"])


def _record(recorder: TaskRunRecorder, step: str, count: int, prefix: str = "") -> list[str]:
    """``count`` finished calls of ``step`` (a task or an evaluator), as events."""
    ids, now = [], dt.datetime.now(dt.UTC)
    for i in range(count):
        call = Call(str(uuid.uuid4()), f"{prefix}{step}-{i}", step, None, now, 0, 0.0)
        ids.append(call.task_run_id)
        recorder.finished(call, State("COMPLETED", "Completed"), 1, now)
    return ids


def _ahead_checked(monkeypatch: pytest.MonkeyPatch, recorders: list[TaskRunRecorder],
                   since: dt.datetime) -> list[int]:
    """Before every POST: events posted by ``recorders`` that the slower of the server's
    task-run recorder and event persister has not taken yet (counted over the flow run)."""
    from patronus_tasks.integrations.prefect.runs import count_task_runs

    ahead: list[int] = []
    send = _recorder._Poster._send

    async def checked(self: Any, batch: Any) -> bool:
        r = self.r
        runs = await count_task_runs(r.flow_run_id, self.client)
        events = await _count_events(r.flow_run_id, since, self.client)
        posted = sum(x.backlog.sent for x in recorders)
        ahead.append(posted + batch.count - min(runs, events))
        return bool(await send(self, batch))

    monkeypatch.setattr(_recorder._Poster, "_send", checked)
    return ahead


async def _count_events(flow_run_id: str, since: dt.datetime, client: Any) -> int:
    """Events related to this flow run, from ``since`` on, that the server stored."""
    body = {"filter": {"related": {"id": [f"prefect.flow-run.{flow_run_id}"]},
                       "occurred": {"since": since.isoformat(), "until": "2999-01-01T00:00:00Z"}},
            "limit": 1}
    response = await client._client.post("/events/filter", json=body)
    response.raise_for_status()
    return int(response.json()["total"])


def test_recorders_posting_at_once_stay_within_the_bound_together(
        prefect_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prefect's broker drops events past 10,000 queued per consumer: the posters (Dask
    # batches each have their own) must wait for the server to record and store them.
    monkeypatch.setattr(_recorder, "MAX_AHEAD", 150)
    recorders: list[TaskRunRecorder] = []
    ahead = _ahead_checked(monkeypatch, recorders, dt.datetime.now(dt.UTC))

    async def record() -> str:
        flow_run_id = await _new_flow_run("shared-bound")
        recorders.extend(TaskRunRecorder(flow_run_id, [], share=3).start() for _ in range(3))
        for n, r in enumerate(recorders):
            _record(r, "evaluator-short", 200, prefix=f"r{n}-")
            r.close()
        return flow_run_id

    flow_run_id = asyncio.run(record())
    assert all(r.wait(120) for r in recorders)
    assert sum(r.recorded for r in recorders) == 600 == _count(flow_run_id)
    assert len(ahead) >= 6 and max(ahead) <= 150, ahead


def test_rows_task_runs_are_posted_before_their_evaluators(
        prefect_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # When the server lags, every row's own task run is recorded first: evaluator events
    # made earlier wait behind task events made later.
    monkeypatch.setattr(_recorder, "MAX_AHEAD", 10)  # batches of 10, each waits for the last

    async def record() -> tuple[str, TaskRunRecorder]:
        flow_run_id = await _new_flow_run("rows-first")
        recorder = TaskRunRecorder(flow_run_id, []).start()
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
    monkeypatch.setattr(_recorder, "MAX_AHEAD", 100)
    monkeypatch.setattr(_recorder, "_PERSISTER_GRACE_SECONDS", 3.0)

    async def record() -> tuple[str, TaskRunRecorder]:
        flow_run_id = await _new_flow_run("no-persister")
        recorder = TaskRunRecorder(flow_run_id, []).start()
        _record(recorder, "evaluator-short", 300)
        recorder.close()
        return flow_run_id, recorder

    with _server(tmp_path, monkeypatch, prefect_template_db, "EVENT_PERSISTER"):
        flow_run_id, recorder = asyncio.run(record())
        assert recorder.wait(90) and recorder.recorded == 300
        assert _count(flow_run_id) == 300
    assert not recorder.backlog.persisting


def _unrecordable(monkeypatch: pytest.MonkeyPatch, posts: int | None = None) -> list[bytes]:
    """The first ``posts`` posts of events (all, if None) taken by the server but never
    recorded: they say another orchestration, which its task-run recorder passes over
    (its broker takes their ids all the same). Returns the bodies posted."""
    from patronus_tasks.integrations.prefect import internal

    post, bodies = internal.post_events, []

    async def lossy(client: Any, body: bytes) -> None:
        bodies.append(body)
        if posts is None or len(bodies) <= posts:
            body = body.replace(b'"prefect.orchestration":"client"',
                                b'"prefect.orchestration":"lost"')
        await post(client, body)

    monkeypatch.setattr(internal, "post_events", lossy)
    return bodies


def test_a_server_that_records_nothing_is_given_up_on_and_said_so(
        prefect_server: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(_recorder, "MAX_AHEAD", 100)
    monkeypatch.setattr(_recorder, "_STALL_SECONDS", 1.0)
    monkeypatch.setattr(_recorder, "GIVE_UP_SECONDS", 4.0)
    _unrecordable(monkeypatch)

    async def record() -> TaskRunRecorder:
        recorder = TaskRunRecorder(await _new_flow_run("records-nothing"), []).start()
        _record(recorder, "evaluator-short", 400)
        recorder.close()
        return recorder

    recorder = asyncio.run(record())
    assert recorder.wait(60)
    assert recorder.lost == 400 and recorder.recorded == 0
    assert [r for r in caplog.records if "sending them again" in r.getMessage()]
    gave_up = [r for r in caplog.records if "are not recorded" in r.getMessage()]
    assert len(gave_up) == 1, [r.getMessage() for r in gave_up]


def test_events_the_server_took_and_lost_go_again_under_new_ids(
        prefect_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The server's broker drops an event whose id it took in the last five minutes, so
    # events it took and then lost (a full broker, a failed flush) only count when sent
    # under new ids. Lost here: the first post (`_unrecordable`). The first resend keeps
    # the ids (a server merely slow would otherwise record each state twice); it is
    # dropped, and the next one, under new ids, is recorded.
    monkeypatch.setattr(_recorder, "_STALL_SECONDS", 1.0)
    bodies = _unrecordable(monkeypatch, posts=1)

    async def record() -> tuple[str, TaskRunRecorder, list[str]]:
        flow_run_id = await _new_flow_run("took-and-lost")
        recorder = TaskRunRecorder(flow_run_id, []).start()
        ids = _record(recorder, "evaluator-short", 40)
        recorder.close()
        return flow_run_id, recorder, ids

    flow_run_id, recorder, ids = asyncio.run(record())
    assert recorder.wait(60) and recorder.recorded == 40 and recorder.lost == 0
    assert _count(flow_run_id) == 40  # each task run once
    first, *again = (orjson.loads(b) for b in bodies)
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
    import threading


    # The run's tail, lost at the kill, is sent again after this. Not shorter, nor a shorter
    # LOST_AFTER: sent again faster than the restarted server catches up, copies pile up
    # in its broker past the 10,000 it keeps per consumer, and it drops them silently.
    monkeypatch.setattr(_recorder, "_STALL_SECONDS", 6.0)
    with _server(tmp_path, monkeypatch, prefect_template_db) as server:
        done: dict[str, Any] = {}

        def experiment() -> None:
            done["exp"] = run_experiment(
                "restart", data=[{"x": i} for i in range(400)], task=paced, evaluators=[short],
                results_dir=results_dir, print_summary=False, max_concurrency=4)

        runner = threading.Thread(target=contextvars.copy_context().run, args=(experiment,))
        runner.start()
        deadline = time.monotonic() + 60
        while _recorded_so_far(server.api_url) < 200 and time.monotonic() < deadline:
            time.sleep(0.2)
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
    import httpx

    try:
        return int(httpx.post(f"{api_url}/task_runs/count", json={}, timeout=5).json())
    except httpx.HTTPError:
        return 0


def _count_all(flow_run_id: str) -> int:
    async def count() -> int:
        async with get_client() as client:
            response = await client._client.post(
                "/task_runs/count", json={"flow_runs": {"id": {"any_": [flow_run_id]}}})
            return int(response.json())

    return asyncio.run(count())
