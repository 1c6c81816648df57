"""The loop posting one recorder's events (its `Outbox`) to Prefect, on the background loop.

It posts what fits within the recorder's ``max_ahead``, asks the server every
`_POLL_SECONDS` what it recorded (`_TAIL_POLL_SECONDS` for a run's last events), puts back
what a server lost or refused (its rate: after its ``Retry-After``), sends everything
outstanding again after a stall, and gives up (counting the rest lost) after the
recorder's ``give_up_seconds`` without progress.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import httpx

from patronus_tasks.http import RateLimited
from patronus_tasks.prefect import internal
from patronus_tasks.prefect.events import EventBatch
from patronus_tasks.prefect.recorder.backlog import still_needed
from patronus_tasks.prefect.recorder.outbox import BATCH_EVENTS, Outbox

if TYPE_CHECKING:
    from patronus_tasks.prefect.internal import ApiClient

logger = logging.getLogger("patronus_tasks.records")
_FLUSH_SECONDS = 0.25
#: How often to ask the server what it recorded.
_POLL_SECONDS = 0.5
#: ... once the run's events are all posted and at most `_TAIL_EVENTS` wait to be recorded:
#: nothing else is left to do then, and the time to the next poll was added to every
#: run's end (up to half a second; a poll is a primary-key look-up or two). A big run's
#: long catch-up is still asked every `_POLL_SECONDS`, until its last batch.
_TAIL_POLL_SECONDS = 0.1
_TAIL_EVENTS = BATCH_EVENTS
_WARN_SECONDS = 10.0
#: Times a batch is sent before what the server still lacks of it counts lost. Sent again
#: at most every `backlog.LOST_AFTER` (10 s): a server restarted with a backlog takes
#: minutes to catch up (~7 ms per event), and meanwhile its broker may drop copies.
_MAX_POSTS = 30
#: A batch a server refused for its rate is cut in two, down to this many events: it may
#: be more than the server allows in a window (Prefect Cloud counts each event).
_MIN_SPLIT = 25


class Poster:
    """The loop posting one recorder's events and checking what the server recorded."""

    def __init__(self, recorder: Outbox, client: ApiClient) -> None:
        self.r, self.client = recorder, client
        self.checked = self.reported = self.resent = self.warned = 0.0
        self.stall_after, self.stalls = recorder.limits.stall_seconds, 0  # resends since progress
        self.waiting_since = time.monotonic()  # the server's last progress, or no backlog
        self.recorded = 0

    async def run(self) -> None:
        r = self.r
        await self._post()  # what waited for the flow run or the client goes at once
        while not r.closed or r.outstanding():
            await r.wait_for_work(self._until_check())
            await self._post_logs()
            await self._check()
            await self._post()
            if self._given_up():
                return

    async def _post(self) -> None:
        """Post what fits within the recorder's `max_ahead`."""
        r = self.r
        while (batch := r.take(flush=True)) is not None:
            if r.backlog.posted and r.backlog.ahead() + batch.count > r.max_ahead:
                r.put_back([batch])
                return
            try:
                sent = await self._send(batch)
            except RateLimited as limited:  # not taken: it goes again once the server allows
                refused = [batch] if batch.posts or batch.count <= _MIN_SPLIT else [*batch.split()]
                r.put_back(refused)
                await self._wait_out(limited)
                return
            if sent is False:
                # Down, or restarting: a restarted server lost what it had queued.
                r.put_back([*r.backlog.posted, batch])
                r.backlog.posted.clear()
                return
            r.backlog.add(batch)  # its answer lost too (None): the server is asked
            r.pace.took(batch.count)

    async def _send(self, batch: EventBatch) -> bool | None:
        """Post ``batch`` (what the server lacks of it, if it went before): True when
        taken, False when not (down, refusing), None when its answer was lost: it may be
        in, so it is never sent again before the server is asked (`still_needed`)."""
        try:
            body = batch.body() if not batch.posts else await still_needed(
                self.client, batch, self.r.backlog.persisting)
            if body is not None:
                await internal.post_events(self.client, body)
            return True
        except Exception as exc:
            RateLimited.raise_if(exc)
            self._warn(f"could not post {batch.count} task-run events to Prefect (will retry): "
                       f"{brief(exc)}")
            if answer_lost(exc):
                batch.keep_ids = True  # the server's broker drops a copy it took
                return None
            await asyncio.sleep(1.0)
            return False

    async def _wait_out(self, limited: RateLimited) -> None:
        """Wait as long as the server asked (its ``Retry-After``), saying what it means."""
        self._warn(self.r.pace.note(self.r.expected - self.r.recorded - self.r.lost)
                   or f"Prefect limits the rate of events: waiting {limited.seconds:.0f} s")
        await asyncio.sleep(limited.seconds)
        self.waiting_since = time.monotonic()  # it answered: slow, not gone

    def _poll_seconds(self) -> float:
        tail = self.r.all_posted() and self.r.backlog.ahead() <= _TAIL_EVENTS
        return _TAIL_POLL_SECONDS if tail else _POLL_SECONDS

    def _until_check(self) -> float:
        """Seconds to wait for work before the next poll is due (at most `_FLUSH_SECONDS`)."""
        if not self.r.backlog.posted:
            return _FLUSH_SECONDS
        due = self.checked + self._poll_seconds() - time.monotonic()
        return min(_FLUSH_SECONDS, max(0.0, due))

    async def _check(self) -> None:
        """Every `_poll_seconds`: what did the server record, and what did it lose?"""
        r, now = self.r, time.monotonic()
        if not r.backlog.posted or now - self.checked < self._poll_seconds():
            self._note_progress(now)
            return
        self.checked = now
        try:
            lost = await r.backlog.refresh(self.client, persister_off_after=r.max_ahead,
                                           grace=r.limits.persister_grace_seconds,
                                           last=r.all_posted())
        except Exception as exc:
            self._warn(f"could not read what Prefect recorded (will retry): {brief(exc)}")
            limited = RateLimited.of(exc)
            self.checked += limited.seconds if limited else 0.0  # ask again once allowed
            lost = []
        again = [b for b in lost if b.posts < _MAX_POSTS]
        if again:
            logger.warning("Prefect lost %d batches of task-run events; sending them again",
                           len(again))
            r.put_back(again)
        for batch in (b for b in lost if b.posts >= _MAX_POSTS):
            r.lost += batch.missing[0]
            r.backlog.recorded += batch.finals - batch.missing[0]
            logger.error("Prefect still lacks %d of the task runs and %d of the events of a batch "
                         "of %d events sent %d times; counting those task runs lost",
                         *batch.missing, batch.count, batch.posts)
        self._note_progress(now)

    def _note_progress(self, now: float) -> None:
        r = self.r
        if r.recorded > self.recorded or not r.outstanding():
            self.recorded, self.waiting_since = r.recorded, now
            self.stall_after, self.stalls = r.limits.stall_seconds, 0
        stalled = now - max(self.waiting_since, self.resent) > self.stall_after
        if stalled and r.backlog.posted:
            logger.warning("Prefect recorded none of %d pending task-run events for %.0f s; "
                           "sending them again", r.backlog.ahead(), now - self.waiting_since)
            for batch in r.backlog.posted:  # the first time as they were: see still_needed
                batch.keep_ids = self.stalls == 0
            r.put_back(list(r.backlog.posted))
            r.backlog.posted.clear()
            self.resent, self.stall_after = now, self.stall_after * 2
            self.stalls += 1
        if now - self.reported >= 2.0:
            self.reported = now
            r.tell_progress()

    def _given_up(self) -> bool:
        r = self.r
        if time.monotonic() - self.waiting_since < r.limits.give_up_seconds:
            return False
        r.lost = r.expected - r.recorded
        logger.error("Prefect recorded none of this experiment's task runs for %.0f s: %d of %d "
                     "are not recorded (their rows are in the Parquet results)",
                     time.monotonic() - self.waiting_since, r.lost, r.expected)
        return True

    async def _post_logs(self) -> None:
        logs = self.r.take_logs()
        if not logs:
            return
        try:
            await internal.post_logs(self.client, logs)
        except Exception as exc:
            limited = RateLimited.of(exc)
            if limited is not None:  # they go again, once the server allows
                self.r.put_back_logs(logs)
                await self._wait_out(limited)
                return
            self.r.logs_dropped += len(logs)
            self._warn(f"could not send {len(logs)} log records to Prefect: {brief(exc)}")

    def _warn(self, message: str) -> None:
        """Log a problem at most every `_WARN_SECONDS` (a server down fails every poll)."""
        now = time.monotonic()
        if now - self.warned >= _WARN_SECONDS:
            self.warned = now
            logger.warning(message)


def answer_lost(exc: BaseException) -> bool:
    """Whether a post failing with ``exc`` may have reached the server all the same: its
    answer was lost (read timed out, connection closed before it, a proxy's 502 or 504),
    where a refusal (503, 4xx) or no connection at all says it was not taken."""
    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code in (502, 504)
    return isinstance(exc, httpx.ReadTimeout | httpx.ReadError | httpx.RemoteProtocolError)


def brief(exc: BaseException) -> str:
    """An exception in one short line (an HTTP error's text can hold a whole request)."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= 300 else text[:299] + "…"
