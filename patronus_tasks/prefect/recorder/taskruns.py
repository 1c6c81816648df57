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
server records them).

Rows first: when full batches of the ``@task``'s events wait (each row's own task run),
they go before the evaluators', so when the server lags (it records a call in several ms
of CPU, the client makes one in ~0.1 ms), every row still shows up soon after the rows
are done, its evaluators' task runs after.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import datetime as dt
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, temporary_settings

from patronus_tasks.http import Pace
from patronus_tasks.prefect import internal
from patronus_tasks.prefect.clients import get_client
from patronus_tasks.prefect.events import RUNNING, Call, EventBatch, EventFormat, State
from patronus_tasks.prefect.recorder.backlog import Backlog
from patronus_tasks.prefect.recorder.poster import Poster, brief
from patronus_tasks.prefect.settings import STALL_SECONDS
from patronus_tasks.run import background as _background

logger = logging.getLogger("patronus_tasks.records")
_BATCH_EVENTS = 500
#: Events posted but not yet recorded, at most: half the broker's queue per consumer.
MAX_AHEAD = 5_000
#: Serialised events held here at most: past this, calls wait for the poster.
MAX_BUFFERED_BYTES = 200 * 2**20
#: With events outstanding and nothing recorded for this long, send them again (a server
#: that restarted at the end of a run lost them, and nothing posted later shows the gap),
#: then after twice as long each time (they go under new ids: a server merely slow would
#: get them twice); with nothing recorded for `GIVE_UP_SECONDS`, count them lost. The
#: recorder process takes the stall from $PATRONUS_TASKS_RECORDER_STALL_SECONDS (settings).
GIVE_UP_SECONDS = 300.0
#: How long the event persister may store nothing while the task-run recorder takes
#: events, before it is taken to be switched off (three of its default flush intervals).
PERSISTER_GRACE_SECONDS = 15.0
#: Step log records waiting to be sent, at most (more are dropped, and counted).
MAX_LOGS = 10_000
_LOG_BATCH, _LOG_CHARS = 1_000, 10_000
_AGAIN, _ROWS, _EVALUATORS = 0, 1, 2  # the recorder's queues, in the order they are posted
#: The rows' batch still filling goes ahead of full evaluators' batches this old (seconds):
#: a row's task run waits at most this long for its batch, and the evaluators, whose
#: batches fill faster, are never held behind a stream of small ones.
ROWS_WAIT = 2.0


@dataclass(frozen=True)
class Limits:
    """A recorder's bounds and patience (the constants above; tests give smaller ones)."""

    max_ahead: int = MAX_AHEAD
    max_logs: int = MAX_LOGS
    stall_seconds: float = STALL_SECONDS
    give_up_seconds: float = GIVE_UP_SECONDS
    persister_grace_seconds: float = PERSISTER_GRACE_SECONDS


class TaskRunRecorder:
    """Events of one flow run's calls, on their way to the Prefect server.

    ``running``, ``finished`` and ``log`` may be called from any thread; ``close`` says no
    more will come; ``wait`` (or ``await until_recorded()``) waits for the server to have them.
    """

    def __init__(self, flow_run_id: str, tags: list[str], parent_task_run_id: str | None = None,
                 share: int = 1, on_progress: Callable[[TaskRunRecorder], None] | None = None,
                 label: str = "", persisting: bool = True, limits: Limits = Limits()) -> None:
        self.flow_run_id, self.label = flow_run_id, label
        self.limits = limits
        self.run_key = flow_run_id  # the calls' task-run ids derive from it (`calls`)
        self.format = EventFormat(flow_run_id, tags, parent_task_run_id)
        self.share = max(1, share)  # recorders posting to the server at once, this one included
        self.on_progress = on_progress
        self._queues: tuple[deque[EventBatch], ...] = (deque(), deque(), deque())
        self._logs: deque[dict[str, Any]] = deque()
        self._lock = threading.Lock()
        self._buffered = 0  # bytes of the events waiting in the queues
        self.backlog = Backlog(persisting)  # False: the server stores no events
        self.expected = 0  # calls finished: task runs this recorder must see recorded
        self.lost = self.logs_dropped = 0
        self.pace = Pace()  # how fast the server takes events, when it limits the rate
        self._closed = False
        self._finished = threading.Event()
        self._ended = False  # `ended`: set before the last progress note; `done` after it
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- the experiment's side -------------------------------------------------------

    def start(self) -> TaskRunRecorder:
        """Start posting from the background loop, with this context's Prefect settings."""
        _background.submit(self._run(), contextvars.copy_context())
        _background.keep_alive(self)
        return self

    def running(self, call: Call, run_count: int) -> None:
        """``call`` has been running a while: show it as Running."""
        self._push(_ROWS, self.format.event(call, RUNNING, run_count, call.start), final=False)

    def finished(self, call: Call, state: State, run_count: int, end: dt.datetime) -> None:
        """``call`` ended in ``state``."""
        queue = _ROWS if call.task_key.startswith("task-") else _EVALUATORS
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
            if not batches or batches[-1].count >= self._batch_size():
                batches.append(EventBatch(queue))
                if len(batches) > 1:
                    self._poke()
            self._buffered += batches[-1].add(event, final)
            self.expected += final

    async def backpressure(self) -> None:
        """Wait while the events waiting here are over their bound."""
        while self._buffered >= MAX_BUFFERED_BYTES and not self._finished.is_set():
            self._poke()
            await asyncio.sleep(0.05)

    def close(self) -> None:
        """No more events: post what is left; the server catches up in the background."""
        self._closed = True
        self._poke()

    @property
    def closed(self) -> bool:
        return self._closed

    def _poke(self) -> None:
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    # -- progress ------------------------------------------------------------------------

    @property
    def recorded(self) -> int:
        """Task runs the server holds in their final state."""
        return self.backlog.recorded

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

    def describe(self) -> str:
        left = self.expected - self.recorded - self.lost
        return f"Prefect to record {left} of {self.expected} task runs" + (
            f" of {self.label}" if self.label else "")

    # -- the background loop's side ------------------------------------------------------

    @property
    def max_ahead(self) -> int:
        """Events this recorder may have posted and not yet recorded: its share."""
        return max(1, self.limits.max_ahead // self.share)

    def _batch_size(self) -> int:
        return min(_BATCH_EVENTS, self.max_ahead)

    async def _run(self) -> None:
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        try:
            # Its own retries (and waits for Retry-After) only: the client's would hold
            # every post to a server that is down for a minute of back-off.
            with temporary_settings({PREFECT_CLIENT_MAX_RETRIES: 0}):
                async with get_client() as client:
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

    # -- what its poster (`poster.Poster`, on the background loop) uses --------------------------

    def tell_progress(self) -> None:
        if self.on_progress is not None:
            try:
                self.on_progress(self)
            except Exception as exc:
                logger.warning("could not note Prefect's progress: %s", exc)

    def take(self, flush: bool) -> EventBatch | None:
        """The next batch to post: one to send again, else a full one (rows first), else,
        when ``flush``, a partly filled one. The rows' batch still filling counts as full
        once `ROWS_WAIT` old or when no more calls come: else, while evaluators' batches
        were full, it waited behind all of them (the last rows of a 20,000-row run were
        visible only when every evaluator's task run was)."""
        with self._lock:
            waiting = [q for q in self._queues if q]
            full = [q for q in waiting if q[0].count >= self._batch_size() or len(q) > 1
                    or (q is self._queues[_ROWS] and self._rows_due(q[0]))]
            ready = [q for q in waiting if q is self._queues[_AGAIN]] or full or (
                waiting if flush else [])
            if not ready:
                return None
            batch = ready[0].popleft()
            self._buffered -= len(batch.data)
            return batch

    def _rows_due(self, batch: EventBatch) -> bool:
        return self._closed or time.monotonic() - batch.opened >= ROWS_WAIT

    def put_back(self, batches: list[EventBatch]) -> None:
        """Post these first next time, oldest first: posted before, to be sent again, or
        taken and not posted, back where they waited."""
        with self._lock:
            for batch in reversed(batches):
                self._queues[_AGAIN if batch.posts else batch.queue].appendleft(batch)
                self._buffered += len(batch.data)

    def take_logs(self) -> list[dict[str, Any]]:
        with self._lock:
            return [self._logs.popleft() for _ in range(min(len(self._logs), _LOG_BATCH))]

    def put_back_logs(self, logs: list[dict[str, Any]]) -> None:
        """Send these log records first next time (the server refused them for its rate)."""
        with self._lock:
            self._logs.extendleft(reversed(logs))

    async def wait_for_work(self, timeout: float) -> None:
        """Until something is pushed or closed (`_poke`), or ``timeout`` seconds."""
        assert self._wake is not None, "posting starts in `_run`"
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)
        self._wake.clear()

    def outstanding(self) -> bool:
        """Events not yet recorded (waiting, or posted), or logs not yet sent."""
        with self._lock:
            waiting = any(self._queues) or bool(self._logs)
        return waiting or bool(self.backlog.posted)
