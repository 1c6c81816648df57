"""Recording calls as Prefect task runs through bulk events, without a task engine per call.

Prefect 3 orchestrates task runs on the client: the engine reports each state change as
a ``prefect.task-run.<State>`` event, and the server's task-run recorder builds the task
run from it. This module sends the same events for calls it did not run through the
engine, in batches through ``POST /api/events``, at a fraction of the engine's CPU cost.
The event format is Prefect's internal contract (checked against Prefect 3.8 and 3.9 by
``tests/test_modes.py``).

Each call is recorded by one event, its final state (``Completed``, ``Failed`` or
``TimedOut``), carrying the task run's name, key, start and end time, run count, tags,
its upstream call (``wait_for``) and its parent (``__parents__``). The ``Running`` state
is not sent: one event per call halves what the server must ingest, and the server's
ingestion, not the client, is what limits how soon every call is visible.

Rows first: when full batches of the user's ``@task`` events (a row's own task run) wait,
they are posted before the evaluators' events, so when the server falls behind (it
records a call in ~3.5-6 ms of CPU, more as its tables grow; the client makes one in
~1 ms), every row still shows up soon after the experiment ends, its evaluators' task
runs after.

Flow control: the poster keeps at most `MAX_AHEAD` events posted but not yet taken by
the slower of the server's task-run recorder and event persister (`_backlog.Backlog`: its
broker drops events past 10,000 queued per consumer); ``share`` recorders posting to one
server at once (Dask batches) keep a ``share``-th of it each. The rest wait here, serialised
(~1 KB each), up to `MAX_BUFFERED_BYTES`; past that, calls wait (rows then go no faster
than the server records them).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
import uuid
from collections import deque
from typing import Any

import orjson
from prefect.client.orchestration import get_client

from ._backlog import Backlog
from ._runner import Invocation, LocalStepRunner

logger = logging.getLogger("patronus_tasks.events")
_FLUSH_EVENTS, _FLUSH_SECONDS, _POST_ATTEMPTS = 500, 0.25, 5
#: Events posted but not yet recorded, at most: half the broker's queue per consumer.
MAX_AHEAD = 5_000
#: Serialised events held here at most: past this, calls wait for the poster.
MAX_BUFFERED_BYTES = 200 * 2**20
#: How often to ask the server how far it got, and how long it may record nothing
#: while events are pending before the poster stops waiting for it (and says so).
_POLL_SECONDS, _STALL_SECONDS = 0.5, 60.0
#: How long the event persister may store nothing while the task-run recorder takes
#: events, before it is taken to be switched off (three of its default flush intervals).
_PERSISTER_GRACE_SECONDS = 15.0


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _state(inv: Invocation) -> tuple[str, str, str | None]:
    if inv.error is None:
        return "COMPLETED", "Completed", None
    name = "TimedOut" if inv.error.type == "TimeoutError" and "timed out" in inv.error.message \
        else "Failed"
    return "FAILED", name, f"{inv.error.type}: {inv.error.message}"[:10_000]


class _Batch:
    """Events serialised into one JSON array body (without its brackets).

    Copied into one buffer as they come: each ``orjson.dumps`` result keeps an 8 KB
    allocation whatever its length, so holding them one by one cost 8x their size.
    """

    __slots__ = ("count", "data", "last")

    def __init__(self) -> None:
        self.data, self.count = bytearray(), 0
        self.last = ("", "")  # the last event's id and task run id: the batch's mark

    def add(self, event: dict[str, Any]) -> int:
        """Append one event; return the bytes it took."""
        before = len(self.data)
        if self.count:
            self.data += b","
        self.data += orjson.dumps(event)
        self.count += 1
        self.last = (event["id"], event["resource"]["prefect.resource.id"].removeprefix(
            "prefect.task-run."))
        return len(self.data) - before


class TaskRunRecorder:
    """Buffers task-run events and posts them to the Prefect API in batches.

    Posting happens in the background; `aclose` sends what is left. A batch the server
    does not take after retries is counted in ``lost`` and logged, never dropped silently.
    """

    def __init__(self, flow_run_id: str, tags: list[str], parent_task_run_id: str | None = None,
                 share: int = 1) -> None:
        self.flow_run_id, self.tags = flow_run_id, sorted(tags)
        self.share = max(1, share)  # recorders posting to the server at once, this one included
        self.parent_task_run_id = parent_task_run_id
        self._related = [{"prefect.resource.id": f"prefect.flow-run.{flow_run_id}",
                          "prefect.resource.role": "flow-run"}]
        self._related += [{"prefect.resource.id": f"prefect.tag.{t}",
                           "prefect.resource.role": "tag"} for t in self.tags]
        # Two queues: the rows' own task runs, then the evaluators' (see the module's doc).
        self._queues: tuple[deque[_Batch], deque[_Batch]] = (deque(), deque())
        self._buffered_bytes = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._paced = True  # False once the server stalled: the rest is posted unpaced
        self._client: Any = None
        self.lost = 0
        self.backlog = Backlog()

    async def __aenter__(self) -> TaskRunRecorder:
        self._client = get_client()
        await self._client.__aenter__()
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _event(self, task_run_id: str, inv: Invocation, kind: str, name: str, message: str | None,
               when: dt.datetime, run: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": str(uuid.uuid4()), "occurred": when.isoformat(),
            "event": f"prefect.task-run.{name}",
            "resource": {
                "prefect.resource.id": f"prefect.task-run.{task_run_id}",
                "prefect.resource.name": inv.run_name, "prefect.orchestration": "client",
                "prefect.state-name": name, "prefect.state-type": kind,
                "prefect.run-count": str(max(inv.attempts, 1)),
                "prefect.state-message": message or "",
                "prefect.state-timestamp": when.isoformat(),
            },
            "related": self._related,
            "payload": {
                "intended": {"from": None, "to": kind},
                "validated_state": {"type": kind, "name": name, "message": message,
                                    "state_details": {}, "data": None},
                "task_run": run,
            },
        }

    def _run_fields(self, inv: Invocation, upstream: str | None) -> dict[str, Any]:
        inputs: dict[str, Any] = {}
        if upstream:
            inputs["wait_for"] = [{"input_type": "task_run", "id": upstream}]
        if self.parent_task_run_id:
            inputs["__parents__"] = [{"input_type": "task_run", "id": self.parent_task_run_id}]
        return {"name": inv.run_name, "task_key": f"{inv.step.kind}-{inv.step.name}",
                "dynamic_key": inv.run_name, "tags": self.tags, "task_inputs": inputs,
                "empirical_policy": {"retries": inv.step.retries,
                                     "retry_delay": inv.step.retry_delay_seconds}}

    def finished(self, task_run_id: str, inv: Invocation, upstream: str | None,
                 start: dt.datetime, end: dt.datetime) -> None:
        kind, name, message = _state(inv)
        run = {**self._run_fields(inv, upstream), "run_count": max(inv.attempts, 1),
               "start_time": start.isoformat(), "end_time": end.isoformat(),
               "expected_start_time": start.isoformat(),
               "total_run_time": (end - start).total_seconds()}
        queue = self._queues[0 if inv.step.kind == "task" else 1]
        self._push(queue, self._event(task_run_id, inv, kind, name, message, end, run))

    @property
    def max_ahead(self) -> int:
        """Events this recorder may have posted and not yet taken: its share of `MAX_AHEAD`."""
        return max(1, MAX_AHEAD // self.share)

    def _batch_size(self) -> int:
        return min(_FLUSH_EVENTS, self.max_ahead)

    def _push(self, queue: deque[_Batch], event: dict[str, Any]) -> None:
        if not queue or queue[-1].count >= self._batch_size():
            queue.append(_Batch())
            if len(queue) > 1:
                self._wake.set()
        self._buffered_bytes += queue[-1].add(event)

    async def backpressure(self) -> None:
        """Wait while the buffer is over its bound and the poster is running."""
        while self._buffered_bytes >= MAX_BUFFERED_BYTES and self._task is not None:
            self._wake.set()
            await asyncio.sleep(0.05)

    async def _loop(self) -> None:
        while not self._closing:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), _FLUSH_SECONDS)
            self._wake.clear()
            await self.flush()

    async def flush(self) -> None:
        """Post every buffered event, rows first, with retries; count what could not be sent."""
        rows, evaluators = self._queues
        while rows or evaluators:
            # Rows first only when a full batch of them waits (the server lags): a batch
            # still filling would otherwise always be there, and evaluators never sent.
            # Taken whole: later events start a new batch.
            full = bool(rows) and rows[0].count >= self._batch_size()
            batch = (rows if full or not evaluators else evaluators).popleft()
            await self._server_catch_up(batch.count)
            self._buffered_bytes -= len(batch.data)
            await self._post(batch)

    @property
    def sent(self) -> int:
        """Events the server accepted."""
        return self.backlog.sent

    @property
    def last_task_run_id(self) -> str | None:
        """The task run of the last event the server accepted: once it is recorded, so is
        every earlier one (the server's recorder takes events in order)."""
        return self.backlog.last_task_run_id

    async def _server_catch_up(self, more: int) -> None:
        """Wait until ``more`` events keep the server within `max_ahead` of what it took."""
        progress_at = time.monotonic()
        while self._paced and self.backlog.ahead(more) > self.max_ahead:
            before = self.backlog.taken
            try:
                await self.backlog.refresh(self._client, persister_off_after=self.max_ahead,
                                           grace=_PERSISTER_GRACE_SECONDS)
            except Exception as exc:  # cannot tell how far it got: post, and let it cope
                logger.warning("could not read Prefect's progress recording task runs: %s", exc)
                return
            if self.backlog.taken > before:
                progress_at = time.monotonic()
            elif time.monotonic() - progress_at > _STALL_SECONDS:
                # Waiting again for every later batch would only make closing take minutes.
                logger.warning("Prefect took none of %d pending task-run events for %.0f s; "
                               "posting the rest without waiting", self.backlog.ahead(),
                               _STALL_SECONDS)
                self._paced = False
                return
            if self.backlog.ahead(more) > self.max_ahead:
                await asyncio.sleep(_POLL_SECONDS)

    async def _post(self, batch: _Batch) -> None:
        body = b"[" + batch.data + b"]"
        for attempt in range(1, _POST_ATTEMPTS + 1):
            try:
                response = await self._client._client.post(
                    "/events", content=body,
                    headers={"content-type": "application/json"})
                response.raise_for_status()
                self.backlog.posted(batch.count, *batch.last)
                return
            except Exception as exc:
                if attempt == _POST_ATTEMPTS:
                    self.lost += batch.count
                    logger.error("could not record %d task-run events in Prefect: %s",
                                 batch.count, exc)
                    return
                await asyncio.sleep(0.2 * 2**attempt)

    async def aclose(self) -> None:
        if self._task is not None:
            # Let the poster finish the batch in hand: cancelled, it would drop it.
            self._closing = True
            self._wake.set()
            await self._task
            self._task = None
        await self.flush()
        if self._client is not None:
            await self._client.__aexit__(None, None, None)
            self._client = None


class EventStepRunner(LocalStepRunner):
    """Runs calls in plain asyncio (retries and timeouts as `LocalStepRunner`) and records
    each as its own Prefect task run through a `TaskRunRecorder`."""

    def __init__(self, recorder: TaskRunRecorder) -> None:
        self.recorder = recorder

    async def run(self, inv: Invocation, upstream: Any) -> None:
        task_run_id = str(uuid.uuid4())
        start = _now()
        await super().run(inv, upstream)
        self.recorder.finished(task_run_id, inv, upstream, start, _now())
        inv.handle = task_run_id
        await self.recorder.backpressure()
