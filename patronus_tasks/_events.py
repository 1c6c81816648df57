"""Recording calls as Prefect task runs through bulk events, without a task engine per call.

Prefect 3 orchestrates task runs on the client: the engine reports each state change as
a ``prefect.task-run.<State>`` event, and the server's task-run recorder builds the task
run from it. This module sends the same events for calls it did not run through the
engine, in batches through ``POST /api/events``, at a fraction of the engine's CPU cost.
The event format is Prefect's internal contract (checked against Prefect 3.8 and 3.9 by
``tests/test_events_contract.py``).

Each call is recorded by one event, its final state (``Completed``, ``Failed`` or
``TimedOut``), carrying the task run's name, key, start and end time, run count, tags,
its upstream call (``wait_for``) and its parent (``__parents__``). The ``Running`` state
is not sent: one event per call halves what the server must ingest, and the server's
ingestion, not the client, is what limits how soon every call is visible.

Flow control: Prefect's in-memory broker holds at most 10,000 events per consumer and
drops the rest (logging a warning only), and the server takes POSTs far faster than it
records them (~3.5 ms of CPU per event). So the poster keeps at most `MAX_AHEAD` events
posted but not yet taken by the slower of the two consumers it can see: the task-run
recorder (task runs recorded) and the event persister (events stored; ~2.5x slower than
the recorder). The rest wait here, serialised (~1 KB each), up to `MAX_BUFFERED_BYTES`;
past that, calls wait (rows then go no faster than the server records them).
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

from ._prefect import count_events, count_task_runs
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
#: The events count is a heavier query than the task-run count: asked for less often.
_EVENTS_POLL_SECONDS = 2.0


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _state(inv: Invocation) -> tuple[str, str, str | None]:
    if inv.error is None:
        return "COMPLETED", "Completed", None
    name = "TimedOut" if inv.error.type == "TimeoutError" and "timed out" in inv.error.message \
        else "Failed"
    return "FAILED", name, f"{inv.error.type}: {inv.error.message}"[:10_000]


class TaskRunRecorder:
    """Buffers task-run events and posts them to the Prefect API in batches.

    Posting happens in the background; `aclose` sends what is left. A batch the server
    does not take after retries is counted in ``lost`` and logged, never dropped silently.
    """

    def __init__(self, flow_run_id: str, tags: list[str], parent_task_run_id: str | None = None
                 ) -> None:
        self.flow_run_id, self.tags = flow_run_id, sorted(tags)
        self.parent_task_run_id = parent_task_run_id
        self._related = [{"prefect.resource.id": f"prefect.flow-run.{flow_run_id}",
                          "prefect.resource.role": "flow-run"}]
        self._related += [{"prefect.resource.id": f"prefect.tag.{t}",
                           "prefect.resource.role": "tag"} for t in self.tags]
        self._buffer: deque[bytes] = deque()
        self._buffered_bytes = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._client: Any = None
        self.sent = self.lost = 0
        self._taken = 0  # of our events, how many the slower consumer has taken
        self._progress = _Progress(flow_run_id)

    async def __aenter__(self) -> TaskRunRecorder:
        self._client = get_client()
        await self._client.__aenter__()
        await self._progress.start(self._client)
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
        self._push(self._event(task_run_id, inv, kind, name, message, end, run))

    def _push(self, event: dict[str, Any]) -> None:
        data = orjson.dumps(event)
        self._buffer.append(data)
        self._buffered_bytes += len(data)
        if len(self._buffer) >= _FLUSH_EVENTS:
            self._wake.set()

    async def backpressure(self) -> None:
        """Wait while the buffer is over its bound and the poster is running."""
        while self._buffered_bytes >= MAX_BUFFERED_BYTES and self._task is not None:
            self._wake.set()
            await asyncio.sleep(0.05)

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), _FLUSH_SECONDS)
            self._wake.clear()
            await self.flush()

    async def flush(self) -> None:
        """Post every buffered event, with retries; count what could not be sent."""
        while self._buffer:
            size = min(_FLUSH_EVENTS, MAX_AHEAD, len(self._buffer))
            await self._server_catch_up(size)
            batch = [self._buffer.popleft() for _ in range(size)]
            self._buffered_bytes -= sum(map(len, batch))
            await self._post(batch)

    def _ahead(self, more: int) -> int:
        return self.sent + more - self._taken - MAX_AHEAD

    async def _server_catch_up(self, more: int) -> None:
        """Wait until ``more`` events keep the server within `MAX_AHEAD` of what it took."""
        progress_at = time.monotonic()
        while self._ahead(more) > 0:
            before = self._taken
            try:
                self._taken = await self._progress.taken(self._client)
            except Exception as exc:  # cannot tell how far it got: post, and let it cope
                logger.warning("could not read Prefect's progress recording task runs: %s", exc)
                return
            if self._taken > before:
                progress_at = time.monotonic()
            elif time.monotonic() - progress_at > _STALL_SECONDS:
                logger.warning("Prefect took none of %d pending task-run events for %.0f s; "
                               "posting on", self.sent - self._taken, _STALL_SECONDS)
                return
            if self._ahead(more) > 0:
                await asyncio.sleep(_POLL_SECONDS)

    async def _post(self, batch: list[bytes]) -> None:
        body = b"[" + b",".join(batch) + b"]"
        for attempt in range(1, _POST_ATTEMPTS + 1):
            try:
                response = await self._client._client.post(
                    "/events", content=body,
                    headers={"content-type": "application/json"})
                response.raise_for_status()
                self.sent += len(batch)
                return
            except Exception as exc:
                if attempt == _POST_ATTEMPTS:
                    self.lost += len(batch)
                    logger.error("could not record %d task-run events in Prefect: %s",
                                 len(batch), exc)
                    return
                await asyncio.sleep(0.2 * 2**attempt)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.flush()
        if self._client is not None:
            await self._client.__aexit__(None, None, None)
            self._client = None


class _Progress:
    """How many of a recorder's events the server's task-run recorder and event persister
    have taken (the slower of the two), from counts read through the API."""

    def __init__(self, flow_run_id: str) -> None:
        self.flow_run_id = flow_run_id
        self.since = _now() - dt.timedelta(minutes=1)
        self.runs0 = self.events0 = self.events = 0
        self.events_at = 0.0
        self.persisting = True  # False once the persister looks switched off

    async def start(self, client: Any) -> None:
        self.runs0 = await count_task_runs(self.flow_run_id, client)
        self.events0 = await count_events(self.flow_run_id, self.since, client)

    async def taken(self, client: Any) -> int:
        runs = await count_task_runs(self.flow_run_id, client) - self.runs0
        if not self.persisting:
            return runs
        if time.monotonic() - self.events_at >= _EVENTS_POLL_SECONDS:
            self.events = await count_events(self.flow_run_id, self.since, client) - self.events0
            self.events_at = time.monotonic()
            # A server without the persister stores no event: then only task runs count.
            self.persisting = self.events > 0 or runs < MAX_AHEAD // 2
        return min(runs, self.events) if self.persisting else runs


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
