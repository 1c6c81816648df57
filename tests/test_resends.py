"""What the recorder sends again after a stall: only the states the server lacks, asked of
the real server first, so that no copy collides with a state it holds (the task-run
recorder keys a state by its event's id: "UNIQUE constraint failed: task_run_state")."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from prefect.client.orchestration import get_client

from patronus_tasks import evaluator, run_experiment
from patronus_tasks.prefect import internal
from patronus_tasks.prefect.events import RUNNING, Call, EventBatch, EventFormat, State
from patronus_tasks.prefect.recorder.backlog import still_needed

from .prefect_gate import Gate
from .test_recording import _count


def _call(name: str) -> Call:
    return Call(task_run_id=str(uuid.uuid4()), name=name, task_key=f"task-{name}", upstream=None,
                start=dt.datetime.now(dt.UTC), retries=0, retry_delay=0.0)


def _batch(fmt: EventFormat, *items: tuple[Call, State, bool]) -> EventBatch:
    batch = EventBatch()
    now = dt.datetime.now(dt.UTC)
    for call, state, final in items:
        batch.add(fmt.event(call, state, 1, now, now if final else None), final)
    batch.posts, batch.keep_ids = 1, True  # sent once; the stall's resend keeps the ids
    return batch


def test_a_resend_after_a_stall_sends_only_the_states_the_server_lacks(prefect_server: str) -> None:
    from prefect import flow

    @flow(name="resends")
    def holder() -> str:
        from prefect.runtime import flow_run

        return str(flow_run.id)

    flow_run_id = holder()
    fmt = EventFormat(flow_run_id, ["resends"])
    done, running, missing = _call("done-1"), _call("running-1"), _call("missing-1")
    completed = State("COMPLETED", "Passed", "score 1")

    async def scenario() -> None:
        async with get_client() as client:
            # The server takes a call's Running and final states, and another's Running.
            first = _batch(fmt, (done, RUNNING, False), (done, completed, True),
                           (running, RUNNING, False))
            await internal.post_events(client, first.body())

            async def recorded() -> bool:
                found = await internal.filter_task_runs(client, {"task_runs": {"id": {"any_": [
                    done.task_run_id, running.task_run_id]}}})
                return len(found) == 2 and any(r["state_type"] == "COMPLETED" for r in found)

            await asyncio.wait_for(_until_async(recorded), 60)
            # The stall: that batch, and one event the server never got, sent again.
            again = _batch(fmt, (done, RUNNING, False), (done, completed, True),
                           (running, RUNNING, False), (missing, completed, True))
            body = await still_needed(client, again, persisting=False)
            assert body is not None
            sent = orjson.loads(body)
            # Only the missing call's state: never a state the server holds (same id: its
            # insert fails whole; a new id: a second copy of the state).
            assert [e["resource"]["prefect.resource.id"] for e in sent] == [
                f"prefect.task-run.{missing.task_run_id}"]
            await internal.post_events(client, body)
            held = _batch(fmt, (done, RUNNING, False), (done, completed, True))
            assert await still_needed(client, held, persisting=True) is None

    asyncio.run(scenario())


def _final_runs(ids: list[str]) -> int:
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(task_run_filter=TaskRunFilter(id=TaskRunFilterId(any_=ids)))
    return sum(1 for r in runs if r.state is not None and r.state.is_final())


def _until(check: Any, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "the server never recorded what it was sent"
        time.sleep(0.2)


async def _until_async(check: Any) -> None:
    while not await check():
        await asyncio.sleep(0.2)


def test_a_post_whose_answer_is_lost_is_never_sent_again_before_the_server_is_asked(
        prefect_gate: Gate, results_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The gate forwards half of the first post's events to the server and answers 504
    # instead of the server's answer. Sent again at once, the half the server took would
    # reach it twice (under the same ids: "UNIQUE constraint failed" on a busy SQLite
    # server; under new ones: doubled states). After the stall (4 s here), the recorder
    # asks the server and sends only the half it lacks. 8 s, not less: beside two CPU hogs
    # the server's consumers once took longer than 4 s to record that half, which the
    # next stall then sent again under new ids, as it does for a server that lost it.
    monkeypatch.setenv("PATRONUS_TASKS_RECORDER_STALL_SECONDS", "8")
    forwarded: list[tuple[str, str, str]] = []

    def seen(body: bytes) -> bytes:
        events = orjson.loads(body)
        if not forwarded:  # the first post: one event in two never reaches the server
            events = events[::2]
        forwarded.extend((e["id"], e["resource"]["prefect.resource.id"],
                          e["resource"]["prefect.state-type"]) for e in events)
        return orjson.dumps(events)

    def server_has_them() -> None:
        # On a loaded machine the server's consumers can lag past the stall: what it took
        # then looks lost to anyone who asks. This test is about the answer, not the lag.
        runs = [f[1].removeprefix("prefect.task-run.") for f in forwarded]
        _until(lambda: _final_runs(runs) == len(runs), 60)

    prefect_gate.on_events, prefect_gate.lose_answers = seen, 1
    prefect_gate.before_lost_answer = server_has_them
    rows = 100
    exp = run_experiment("answers-lost", data=[{"evaluated_model_output": str(i)} for i in range(rows)],
                         evaluators=[_short], results_dir=results_dir, print_summary=False)
    assert exp.wait_recorded(90)
    assert prefect_gate.answers_lost == 1 and prefect_gate.posts > 1
    ids = [f[0] for f in forwarded]
    states = [f[1:] for f in forwarded]
    assert len(ids) == len(set(ids)), "an event was forwarded twice"
    assert len(states) == len(set(states)), "a task run's state was forwarded twice"
    assert _count(exp.manifest["flow_run_id"]) == rows
    assert len(states) == rows  # each call's one final event, once


@evaluator
def _short(evaluated_model_output: str) -> bool:
    return len(evaluated_model_output) < 2
