"""Which posted batches of task-run events Prefect's server has recorded, and which it lost.

The server takes a POST of events into an in-memory broker and answers at once; its
consumers (the task-run recorder, the event persister) record them later. Events can
still be lost after a 2xx: the broker drops events past 10,000 queued per consumer, and a
server that restarts loses what it had queued. So a batch counts as recorded only once
the server holds all of it in both places, checked in two steps, so that the server's
work stays small whatever the size of the flow run (counting the flow run's events took
the server 7 s at 180,000):

- every poll, one look-up by primary key of each pending batch's *mark* (its last event,
  see `events.EventBatch`): the task run, and the event;
- once a batch's mark is there, one count of its task runs in a final state and one of
  its events, by their ids: a consumer writes a few batches' worth at once, in no set
  order, so the mark alone does not prove the rest is in.

A batch still incomplete `LOST_AFTER` seconds after one posted after it was found (or
after its own mark was) was lost: what the server lacks of it is sent again, under new
event ids, since the server's broker drops an id it took in the last five minutes. Task
runs do not double: the server keys them by the task-run ids the events carry. A state
could, were a copy counted lost still queued on the server; a batch counts lost only when
the server went on without it (see `LOST_AFTER`), or recorded nothing for a while.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any

import orjson

from patronus_tasks.prefect import internal
from patronus_tasks.prefect.events import FINAL_TYPES, EventBatch

if TYPE_CHECKING:
    from patronus_tasks.prefect.internal import ApiClient

_LOOKUP = 50  # marks asked for per poll, oldest first (the events API takes at most 50)
#: Seconds a batch may stay missing after a later one was recorded, before it counts as
#: lost: a consumer writes what it took in batches, so a later one can show up first.
LOST_AFTER = 10.0
#: A persister that stored nothing this long after the task-run recorder took events:
#: its server's settings are asked (`Backlog._ask_settings`). Past its flush interval
#: (1 s where `server up` sets it), well within the grace.
_ASK_AFTER = 2.0
#: `occurred` must be given: by default the events filter ends at the server's "now", and
#: a client clock ahead of it would hide the newest events.
_ALL_TIME = {"since": "2000-01-01T00:00:00Z", "until": "2999-01-01T00:00:00Z"}


class Backlog:
    """Batches posted and not yet recorded, in the order they were posted."""

    def __init__(self, persisting: bool = True) -> None:
        self.posted: deque[EventBatch] = deque()
        self.sent = 0  # events posted (each once, however often it was sent)
        self.recorded = 0  # task runs whose final state the server holds
        #: False when the event persister is known to be off (the built-in server), or
        #: once it looks switched off
        self.persisting = persisting
        self._stored_any = False
        self._recorded_events = 0  # events the task-run recorder alone has taken
        self._recorded_at = 0.0  # when the recorder was first seen to take one
        self._settings_asked = False  # the server's settings, asked once (`_ask_settings`)

    def add(self, batch: EventBatch) -> None:
        self.sent += batch.count if not batch.posts else 0
        batch.posts += 1
        batch.overtaken_at = 0.0
        self.posted.append(batch)

    def ahead(self) -> int:
        """Events posted that the server has not recorded yet."""
        return sum(b.count for b in self.posted)

    async def refresh(self, client: ApiClient, persister_off_after: int,
                      grace: float, last: bool = False) -> list[EventBatch]:
        """Ask the server which marks it holds; drop the recorded batches; return the lost
        ones (taken out of `posted`, to be sent again).

        The persister is taken to be off once the recorder has taken
        ``persister_off_after`` events and, ``grace`` seconds after it took the first,
        not one was stored (it flushes every 5 s by default; the recorder can be faster).

        ``last``: every event of the run is posted. A batch then counts once its task
        runs are final, the persister's storing of its events not waited for. Nothing
        sent depends on it (a batch whose task runs are final is never sent again:
        `still_needed`), and what it guards while events are posted, the persister's
        queue within the broker's bound (`max_ahead` counts batches until both consumers
        have them), no longer grows. Waited for, it was every run's end: the persister's
        flush interval (1 s under `server up`, 5 s Prefect's default), and on a server
        without one the 2 s before its settings are asked (`_ASK_AFTER`).
        """
        batches = list(self.posted)[:_LOOKUP]
        if not batches:
            return []
        runs = await _recorded_marks(client, batches)
        stored = runs
        if self.persisting and not last:
            stored = await _stored_marks(client, batches)
            self._note_recorder(batches, runs, stored)
            await self._ask_settings(client)
            if self.persister_silent(persister_off_after, grace):
                stored = runs
        persisting = self.persisting and not last
        # A batch sent again is never sent whole: what the persister lacks of states the
        # server holds stays out (`still_needed`), so its mark's task run is enough.
        marked = [r and (s or b.posts > 1) for r, s, b in zip(runs, stored, batches, strict=True)]
        done = [m and await self._complete(client, b, persisting)
                for b, m in zip(batches, marked, strict=True)]
        lost = [b for i, b in enumerate(batches)
                if not done[i] and _overtaken(b, marked[i] or _before_found(runs, i)
                                              or _before_found(stored, i))]
        gone = {id(b) for b, d in zip(batches, done, strict=True) if d} | {id(b) for b in lost}
        self.posted = deque(b for b in self.posted if id(b) not in gone)
        self.recorded += sum(b.finals for b, d in zip(batches, done, strict=True) if d)
        return lost

    async def _complete(self, client: ApiClient, batch: EventBatch, persisting: bool) -> bool:
        """Whether the server holds every task run of ``batch`` in its final state, and
        (``persisting``) every event."""
        events = orjson.loads(batch.body())
        finals = [e["resource"]["prefect.resource.id"].removeprefix("prefect.task-run.")
                  for e in events if e["resource"]["prefect.state-type"] in FINAL_TYPES]
        runs = await _count_final(client, finals) if finals else 0
        stored = await _count_events(client, [e["id"] for e in events]) if persisting \
            else len(events)
        batch.missing = (len(finals) - runs, len(events) - stored)
        if batch.missing[0] == 0 and batch.missing[1] and batch.posts > 1:
            # Sent again, and every state is in: what the persister lacks is never sent
            # again (see `still_needed`), so it is done.
            held = await held_by_state(client, events)
            batch.missing = (0, 0) if len(held) == len(events) else batch.missing
        return batch.missing == (0, 0)

    def _note_recorder(self, batches: list[EventBatch], runs: list[bool], stored: list[bool]) -> None:
        taken = sum(b.count for b, r in zip(batches, runs, strict=True) if r)
        if taken:
            self._recorded_events += taken
            self._recorded_at = self._recorded_at or time.monotonic()
        self._stored_any = self._stored_any or any(stored)

    async def _ask_settings(self, client: ApiClient) -> None:
        """Events recorded for `_ASK_AFTER` seconds, none stored: ask the server's settings
        whether its event persister runs (once; it costs the server 66 ms of CPU, so not
        asked of a server that stores them), rather than wait out the grace. Said off, it
        is; said on or not told, the grace decides."""
        if self._settings_asked or self._stored_any or not self._recorded_events \
                or time.monotonic() - self._recorded_at < _ASK_AFTER:
            return
        self._settings_asked = True
        if await internal.persister_said_off(client):
            self.persisting = False

    def persister_silent(self, after: int, grace: float) -> bool:
        """Whether the event persister looks switched off (see `refresh`); once it does,
        batches count as recorded by their task runs alone. (``after`` events, or all
        those posted when fewer: a small experiment must not wait for ever.)"""
        taken = self._recorded_events >= min(after, self.sent)
        if (self.persisting and not self._stored_any and taken
                and time.monotonic() - self._recorded_at >= grace):
            self.persisting = False
        return not self.persisting


async def still_needed(client: ApiClient, batch: EventBatch, persisting: bool = True) -> bytes | None:
    """The body to send ``batch`` again with: the events whose *states* the server does not
    hold, under new ids (`EventBatch.renew`: the server drops an id it took lately) unless
    ``batch.keep_ids``; None when it holds them all (the next check confirms the batch).

    The server is asked which of the batch's task runs it has, and which are final
    (`held_by_state`): a final event's state is there once its task run is final, a running
    one's once its task run exists. Such an event is never sent again, stored by the event
    persister or not: the task-run recorder keys a state by its event's id, so a copy under
    the same id fails its whole insert ("UNIQUE constraint failed: task_run_state", a busy
    SQLite server then dropping the other runs' events of that flush), and one under a new
    id doubles the state. The event persister may so miss an event whose state is in:
    the task run stands; its event feed lacks a line.

    Why new ids only when asked: a server merely slow still holds the first copies; a
    restarted one forgot the ids, so the first resend keeps them (`recorder`'s stall),
    later ones renew them.
    """
    events = orjson.loads(batch.body())
    held = await held_by_state(client, events)
    if persisting and len(held) < len(events):  # what the persister holds of the rest
        held |= (await _stored_ids(client, [e["id"] for e in events if e["id"] not in held])
                 & {e["id"] for e in events if not _final(e)})
    if len(held) == len(events):
        return None
    if batch.keep_ids:  # once: a copy the server then lost needs new ids
        batch.keep_ids = False
        return orjson.dumps([e for e in events if e["id"] not in held])
    return batch.renew(events, held)


async def held_by_state(client: ApiClient, events: list[dict[str, Any]]) -> set[str]:
    """The ids of the events whose states the server holds: a final one's task run is in a
    final state, a running one's task run exists."""
    runs = sorted({_task_run(e) for e in events})
    present, final = await _task_runs_present(client, runs)
    return {e["id"] for e in events
            if (_task_run(e) in final if _final(e) else _task_run(e) in present)}


async def held_task_runs(client: ApiClient, ids: list[str]) -> set[str]:
    """Which of these task runs the server holds in a final state."""
    return (await _task_runs_present(client, ids))[1]


def _final(event: dict[str, Any]) -> bool:
    return event["resource"]["prefect.state-type"] in FINAL_TYPES


async def _stored_ids(client: ApiClient, ids: list[str]) -> set[str]:
    """Which of these events the server has stored (asked `_LOOKUP` at a time)."""
    stored: set[str] = set()
    for i in range(0, len(ids), _LOOKUP):
        body = {"filter": {"id": {"id": ids[i:i + _LOOKUP]}, "occurred": _ALL_TIME},
                "limit": _LOOKUP}
        stored |= {e["id"] for e in (await internal.filter_events(client, body))["events"]}
    return stored


def _task_run(event: dict[str, Any]) -> str:
    return str(event["resource"]["prefect.resource.id"]).removeprefix("prefect.task-run.")


async def _task_runs_present(client: ApiClient, ids: list[str]) -> tuple[set[str], set[str]]:
    """Which of these task runs the server has, and which of them are in a final state
    (asked `_LOOKUP` at a time: the API reads at most 200 per request)."""
    present: set[str] = set()
    final: set[str] = set()
    for i in range(0, len(ids), _LOOKUP):
        runs = await internal.filter_task_runs(client, {
            "task_runs": {"id": {"any_": ids[i:i + _LOOKUP]}}, "limit": _LOOKUP})
        present |= {str(run["id"]) for run in runs}
        final |= {str(run["id"]) for run in runs if run.get("state_type") in FINAL_TYPES}
    return present, final


def _overtaken(batch: EventBatch, now_overtaken: bool) -> bool:
    """Whether ``batch``, incomplete, has been overtaken (its mark or a later batch found)
    for `LOST_AFTER` seconds."""
    if not now_overtaken:
        batch.overtaken_at = 0.0
        return False
    batch.overtaken_at = batch.overtaken_at or time.monotonic()
    return time.monotonic() - batch.overtaken_at >= LOST_AFTER


def _before_found(found: list[bool], i: int) -> bool:
    """Whether a batch posted after the ``i``-th was found by that consumer."""
    return not found[i] and any(found[i + 1:])


async def _recorded_marks(client: ApiClient, batches: list[EventBatch]) -> list[bool]:
    """Per batch: does the server hold its mark's task run (in a final state, if the mark
    is one: a task run has one final event, though it may have been sent under two ids)?"""
    ids = sorted({b.mark[1] for b in batches})
    runs = await internal.filter_task_runs(
        client, {"task_runs": {"id": {"any_": ids}}, "limit": len(ids)})
    types = {run["id"]: run.get("state_type") for run in runs}
    return [b.mark[1] in types and (not b.final or types[b.mark[1]] in FINAL_TYPES)
            for b in batches]


async def _count_final(client: ApiClient, ids: list[str]) -> int:
    """How many of these task runs the server holds in a final state."""
    return await internal.count_task_runs(client, {
        "task_runs": {"id": {"any_": ids}, "state": {"type": {"any_": list(FINAL_TYPES)}}}})


async def _count_events(client: ApiClient, ids: list[str]) -> int:
    """How many of these events the server has stored."""
    body = {"filter": {"id": {"id": ids}, "occurred": _ALL_TIME}, "limit": 1}
    return int((await internal.filter_events(client, body))["total"])


async def _stored_marks(client: ApiClient, batches: list[EventBatch]) -> list[bool]:
    """Per batch: has the event persister stored its mark's event?"""
    body = {"filter": {"id": {"id": [b.mark[0] for b in batches]}, "occurred": _ALL_TIME},
            "limit": len(batches)}
    found = {event["id"] for event in (await internal.filter_events(client, body))["events"]}
    return [b.mark[0] in found for b in batches]


async def count_task_runs_by_id(client: ApiClient, ids: list[str]) -> int:
    """How many of these task runs the server has: a look-up by primary key."""
    return await internal.count_task_runs(client, {"task_runs": {"id": {"any_": ids}}})
