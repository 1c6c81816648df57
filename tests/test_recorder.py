"""A recorder (`TaskRunRecorder`) against a real server that lags, loses what it took, or
is flooded: played by the gate in front of the session's server (tests/prefect_gate.py)."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import threading
import uuid
from typing import Any

import httpx
import orjson
import pytest
from prefect import flow
from prefect.client.orchestration import get_client

from patronus_tasks.prefect.events import Call, State
from patronus_tasks.prefect.recorder import outbox
from patronus_tasks.prefect.recorder.taskruns import Limits, TaskRunRecorder
from patronus_tasks.prefect.runs.flow import FINAL_STATES

from .prefect_gate import Gate
from .test_recording import _count, _runs, _states_and_logs


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


def test_the_end_of_a_run_waits_for_its_task_runs_not_for_the_event_persister(
        prefect_gate: Gate) -> None:
    # Once every event is posted, a batch counts when its task runs are final: a persister
    # that has stored none of them yet (its flush, 5 s by Prefect's default, 1 s under
    # `server up`) held every run's end that long; here, for the whole grace (600 s, no
    # stall's resend meanwhile). While events are still to be posted, it is waited for
    # (the bound it keeps: test_recorders_posting_at_once_stay_within_the_bound_together).
    prefect_gate.unstored = True

    async def record() -> tuple[str, TaskRunRecorder]:
        flow_run_id = await _new_flow_run("persister-late")
        limits = Limits(stall_seconds=600, persister_grace_seconds=600)
        recorder = TaskRunRecorder(flow_run_id, [], limits=limits)
        _record(recorder, "evaluator-short", 40)
        recorder.close()
        return flow_run_id, recorder.start()

    flow_run_id, recorder = asyncio.run(record())
    assert recorder.wait(60) and recorder.recorded == 40 and recorder.lost == 0
    assert _count(flow_run_id) == 40
    assert recorder.backlog.persisting  # (not taken to be off: it was not waited for)


def test_the_rows_batch_still_filling_goes_ahead_once_due(monkeypatch: pytest.MonkeyPatch) -> None:
    # Evaluators' batches fill faster than the rows': a rows' batch still filling went
    # only once every full evaluators' batch had, so the last rows of a big run showed
    # last. It goes first once no more calls come, or once `ROWS_WAIT` old.
    def recorder_of(evaluators: int, rows: int) -> tuple[TaskRunRecorder, set[str], set[str]]:
        recorder = TaskRunRecorder(str(uuid.uuid4()), [])
        return (recorder, set(_record(recorder, "evaluator-judge", evaluators)),
                set(_record(recorder, "task-answer", rows)))

    recorder, judged, answered = recorder_of(1000, 40)  # two full batches, one filling
    first = recorder.take(flush=True)
    assert first is not None and first.mark[1] in judged  # the rows' batch is young
    recorder.close()  # the rows are done: their last batch will not fill
    last_rows = recorder.take(flush=True)
    assert last_rows is not None and last_rows.mark[1] in answered and last_rows.count == 40

    monkeypatch.setattr(outbox, "ROWS_WAIT", 0.0)  # as if it had waited that long
    recorder, judged, answered = recorder_of(1000, 40)
    aged = recorder.take(flush=True)
    assert aged is not None and aged.mark[1] in answered


def test_calls_cross_to_the_recorder_process_as_they_are() -> None:
    # A call's task-run id is uuid5's (the artifacts' links and both processes derive it),
    # made faster; a call and its state come out of the pipe's pickle equal.
    import pickle

    from patronus_tasks.prefect.events import namespace_of, now, task_run_id

    namespace = namespace_of("run-key")
    for name in ["call_model-0", "judge-ü#span-7", "x" * 300, ""]:
        assert task_run_id(namespace, name) == str(uuid.uuid5(namespace, name))
    call = Call("id", "judge-1", "evaluator-judge", "up", now(), 2, 0.5, {"q": "'a'"}, "p", "k")
    state = State("COMPLETED", "Completed", "fine", ("verdict:not-passed",))
    assert pickle.loads(pickle.dumps((call, state), protocol=5)) == (call, state)
