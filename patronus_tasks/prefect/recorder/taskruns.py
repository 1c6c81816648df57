"""Sending calls' task-run events (and their logs) to Prefect until the server has them.

A `TaskRunRecorder` takes events from the experiment's event loop and posts them, in
batches through ``POST /api/events``, from the background loop (`background`), so the
experiment can return with its results while Prefect catches up. A batch counts once the
server holds it (`backlog`); what it lost of a batch (its broker's limit, a restart) is
sent again, under new event ids, until it does.

Flow control: at most `Limits.max_ahead` events posted and not yet recorded (the broker drops
events past 10,000 queued per consumer); ``share`` recorders posting to one server at once
(Dask batches) keep a ``share``-th of that each. The rest wait here, serialised (~1 KB
each), up to `MAX_BUFFERED_BYTES`; past that, calls wait (rows then go no faster than the
server records them). What waits, and in which order it goes: `outbox`.
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime as dt
import logging
import threading
from collections.abc import Callable
from typing import Any

from patronus_tasks.prefect import clients, internal
from patronus_tasks.prefect.events import RUNNING, Call, EventBatch, EventFormat, State
from patronus_tasks.prefect.recorder.outbox import DEFAULT_LIMITS, EVALUATORS, ROWS, Limits, Outbox
from patronus_tasks.prefect.recorder.poster import Poster, brief
from patronus_tasks.run import background as _background

logger = logging.getLogger("patronus_tasks.records")
#: Serialised events held here at most: past this, calls wait for the poster.
MAX_BUFFERED_BYTES = 200 * 2**20
_LOG_CHARS = 10_000


class TaskRunRecorder(Outbox):
    """Events of one flow run's calls, on their way to the Prefect server.

    ``running``, ``finished`` and ``log`` may be called from any thread; ``close`` says no
    more will come; ``wait`` (or ``await until_recorded()``) waits for the server to have them.
    """

    def __init__(self, flow_run_id: str, tags: list[str], parent_task_run_id: str | None = None,
                 share: int = 1, on_progress: Callable[[TaskRunRecorder], None] | None = None,
                 label: str = "", persisting: bool = True, limits: Limits = DEFAULT_LIMITS) -> None:
        super().__init__(share, persisting, limits)
        self.flow_run_id, self.label = flow_run_id, label
        self.on_progress = on_progress
        self.run_key = flow_run_id  # the calls' task-run ids derive from it (`calls`)
        self.format = EventFormat(flow_run_id, tags, parent_task_run_id)
        self._finished = threading.Event()
        self._ended = False  # `ended`: set before the last progress note; `done` after it

    # -- the experiment's side -------------------------------------------------------

    def start(self) -> TaskRunRecorder:
        """Start posting from the background loop, with this context's Prefect settings."""
        _background.submit(self._run(), contextvars.copy_context())
        _background.keep_alive(self)
        return self

    def running(self, call: Call, run_count: int) -> None:
        """``call`` has been running a while: show it as Running."""
        self._push(ROWS, self.format.event(call, RUNNING, run_count, call.start), final=False)

    def finished(self, call: Call, state: State, run_count: int, end: dt.datetime) -> None:
        """``call`` ended in ``state``."""
        queue = ROWS if call.task_key.startswith("task-") else EVALUATORS
        self._push(queue, self.format.event(call, state, run_count, end, end), final=True)

    def log(self, record: dict[str, Any]) -> None:
        """A log record of a call (bounded: past `Limits.max_logs` waiting, it is dropped)."""
        with self._lock:
            if len(self._logs) >= self.limits.max_logs:
                self.logs_dropped += 1
                return
            record["message"] = record["message"][:_LOG_CHARS]
            self._logs.append({**record, "flow_run_id": self.flow_run_id})

    def _push(self, queue: int, event: dict[str, Any], final: bool) -> None:
        with self._lock:
            batches = self._queues[queue]
            if not batches or batches[-1].count >= self.batch_size():
                batches.append(EventBatch(queue))
                if len(batches) > 1:
                    self.poke()
            self._buffered += batches[-1].add(event, final)
            self.expected += final

    async def backpressure(self) -> None:
        """Wait while the events waiting here are over their bound."""
        while self._buffered >= MAX_BUFFERED_BYTES and not self._finished.is_set():
            self.poke()
            await asyncio.sleep(0.05)

    def close(self) -> None:
        """No more events: post what is left; the server catches up in the background."""
        self._closed = True
        self.poke()

    # -- progress ------------------------------------------------------------------------

    @property
    def buffered(self) -> int:
        """Bytes of the events waiting to be posted."""
        return self._buffered

    @property
    def notes(self) -> list[str]:
        """What the user should know about the catch-up (a server limiting the rate)."""
        note = self.pace.note(self.expected - self.recorded - self.lost)
        return [note] if note else []

    @property
    def done(self) -> bool:
        return self._finished.is_set()

    @property
    def ended(self) -> bool:
        """Nothing more will be recorded (true already for the last progress note)."""
        return self._ended

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server has every event (or they were given up); True if so."""
        return self._finished.wait(timeout)

    async def until_recorded(self, report: Callable[[TaskRunRecorder], None] | None = None,
                             every: float = 5.0) -> None:
        """Wait in an event loop, calling ``report`` every ``every`` seconds meanwhile."""
        while not await asyncio.to_thread(self._finished.wait, every):
            if report is not None:
                report(self)

    def tell_progress(self) -> None:
        if self.on_progress is not None:
            try:
                self.on_progress(self)
            except Exception as exc:
                logger.warning("could not note Prefect's progress: %s", exc)

    def describe(self) -> str:
        left = self.expected - self.recorded - self.lost
        return f"Prefect to record {left} of {self.expected} task runs" + (
            f" of {self.label}" if self.label else "")

    # -- the background loop's side ------------------------------------------------------

    async def _run(self) -> None:
        self.listen()
        try:
            # Its own retries (and waits for Retry-After) only: the client's would hold
            # every post to a server that is down for a minute of back-off.
            async with clients.without_retries() as client:
                internal.watch_responses(client, self.pace.saw)
                await Poster(self, client).run()
        except Exception as exc:  # never silently: count what did not reach the server
            logger.error("recording task runs in Prefect failed: %s", brief(exc))
            self.lost = self.expected - self.recorded
        finally:
            if self.logs_dropped:
                logger.warning("%d log records of calls were dropped: more than %d waited to be "
                               "sent to Prefect", self.logs_dropped, self.limits.max_logs)
            # The last note (the manifest's "complete") before anyone waiting goes on: a
            # process exiting then would cut it off (on object storage, pyarrow's S3 ends
            # at exit and the write fails).
            self._ended = True
            self.tell_progress()
            self._finished.set()
