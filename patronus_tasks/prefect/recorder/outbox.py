"""What a recorder holds for its poster: the batches of events waiting to be posted (and
the calls' logs), its bounds, and its counts of what the server recorded and lost.

The part of `taskruns.TaskRunRecorder` that its `poster.Poster` reads and moves, in a
module of its own so that the poster knows it without importing the recorder (which
starts the poster: the two modules made an import circle, the poster's side for its
type hints alone).

Rows first: when full batches of the ``@task``'s events wait (each row's own task run),
they go before the evaluators', so when the server lags (it records a call in several ms
of CPU, the client makes one in ~0.1 ms), every row still shows up soon after the rows
are done, its evaluators' task runs after.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from patronus_tasks.http import Pace
from patronus_tasks.prefect.events import EventBatch
from patronus_tasks.prefect.recorder.backlog import Backlog
from patronus_tasks.prefect.settings import STALL_SECONDS

BATCH_EVENTS = 500
#: Events posted but not yet recorded, at most: half the broker's queue per consumer.
MAX_AHEAD = 5_000
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
_LOG_BATCH = 1_000
AGAIN, ROWS, EVALUATORS = 0, 1, 2  # the queues, in the order they are posted
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


DEFAULT_LIMITS = Limits()


class Outbox:
    """A recorder's events and logs on their way, and what the server did with them.

    Filled from any thread (`taskruns`), emptied by its poster on the background loop.
    """

    def __init__(self, share: int = 1, persisting: bool = True,
                 limits: Limits = DEFAULT_LIMITS) -> None:
        self.limits = limits
        self.share = max(1, share)  # recorders posting to the server at once, this one included
        self._queues: tuple[deque[EventBatch], ...] = (deque(), deque(), deque())
        self._logs: deque[dict[str, Any]] = deque()
        self._lock = threading.Lock()
        self._buffered = 0  # bytes of the events waiting in the queues
        self.backlog = Backlog(persisting)  # False: the server stores no events
        self.expected = 0  # calls finished: task runs this recorder must see recorded
        self.lost = self.logs_dropped = 0
        self.pace = Pace()  # how fast the server takes events, when it limits the rate
        self._closed = False
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def closed(self) -> bool:
        """No more events will come."""
        return self._closed

    @property
    def recorded(self) -> int:
        """Task runs the server holds in their final state."""
        return self.backlog.recorded

    @property
    def max_ahead(self) -> int:
        """Events this recorder may have posted and not yet recorded: its share."""
        return max(1, self.limits.max_ahead // self.share)

    def batch_size(self) -> int:
        return min(BATCH_EVENTS, self.max_ahead)

    def poke(self) -> None:
        """Wake the poster (from any thread)."""
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    def tell_progress(self) -> None:
        """Say how far the server is (the recorder says it to whoever listens)."""

    def take(self, flush: bool) -> EventBatch | None:
        """The next batch to post: one to send again, else a full one (rows first), else,
        when ``flush``, a partly filled one. The rows' batch still filling counts as full
        once `ROWS_WAIT` old or when no more calls come: else, while evaluators' batches
        were full, it waited behind all of them (the last rows of a 20,000-row run were
        visible only when every evaluator's task run was)."""
        with self._lock:
            waiting = [q for q in self._queues if q]
            full = [q for q in waiting if q[0].count >= self.batch_size() or len(q) > 1
                    or (q is self._queues[ROWS] and self._rows_due(q[0]))]
            ready = [q for q in waiting if q is self._queues[AGAIN]] or full or (
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
                self._queues[AGAIN if batch.posts else batch.queue].appendleft(batch)
                self._buffered += len(batch.data)

    def take_logs(self) -> list[dict[str, Any]]:
        with self._lock:
            return [self._logs.popleft() for _ in range(min(len(self._logs), _LOG_BATCH))]

    def put_back_logs(self, logs: list[dict[str, Any]]) -> None:
        """Send these log records first next time (the server refused them for its rate)."""
        with self._lock:
            self._logs.extendleft(reversed(logs))

    def listen(self) -> None:
        """Take pokes on the running loop (the poster's, before it starts)."""
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()

    async def wait_for_work(self, timeout: float) -> None:
        """Until something is pushed or closed (`poke`), or ``timeout`` seconds."""
        assert self._wake is not None, "the poster listens first (`listen`)"
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)
        self._wake.clear()

    def all_posted(self) -> bool:
        """No more events will come and none waits to be posted (some may wait for the
        server to record them)."""
        with self._lock:
            return self._closed and not any(self._queues)

    def outstanding(self) -> bool:
        """Events not yet recorded (waiting, or posted), or logs not yet sent."""
        with self._lock:
            waiting = any(self._queues) or bool(self._logs)
        return waiting or bool(self.backlog.posted)
