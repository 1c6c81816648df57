"""How far Prefect's server got through the task-run events a recorder posted.

Prefect's in-memory broker holds at most 10,000 events per consumer and drops the rest
(logging a warning only), and the server takes POSTs far faster than it records them. So
the poster must know how many of its events the slower of the two consumers it can see
has taken: the task-run recorder (task runs) and the event persister (stored events).

Counting them (task runs of the flow run, events related to it) grows with the flow run:
at 180,000 events the events count took the server 7 s and, asked every 2 s, became most
of its work. Instead each posted batch leaves a mark, its last event's id and task run's
id, and `Backlog` asks which marks exist: two look-ups by primary key, whatever the size
of the flow run. Each consumer takes events in the order they were posted, so ``k`` marks
found means the first ``k`` batches were taken.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, NamedTuple


class _Mark(NamedTuple):
    sent: int  # events posted up to and including this batch
    event_id: str
    task_run_id: str


class Backlog:
    """Events posted, and how many of them the server's consumers have taken."""

    def __init__(self) -> None:
        self.sent = 0
        self.taken = 0
        self.persisting = True  # False once the event persister looks switched off
        self._recorded = 0  # events the task-run recorder alone has taken
        self._stored_any = False
        self._recorded_at = 0.0  # when the recorder was first seen to take one
        self._marks: deque[_Mark] = deque()
        self.last_task_run_id: str | None = None  # of the last batch the server accepted

    def posted(self, count: int, event_id: str, task_run_id: str) -> None:
        """Count a batch the server accepted, marked by its last event and task run."""
        self.sent += count
        self._marks.append(_Mark(self.sent, event_id, task_run_id))
        self.last_task_run_id = task_run_id

    def ahead(self, more: int = 0) -> int:
        """Events posted (plus ``more``) that the slower consumer has not taken yet."""
        return self.sent + more - self.taken

    async def refresh(self, client: Any, persister_off_after: int, grace: float) -> None:
        """Ask the server which marks exist; move ``taken`` on past those found.

        The persister is taken to be off once the recorder has taken
        ``persister_off_after`` events and, ``grace`` seconds after it took the first,
        not one was stored (it flushes every 5 s by default; the recorder can be faster).
        """
        if not self._marks:
            return
        marks = list(self._marks)
        recorded = await count_task_runs_by_id(client, [m.task_run_id for m in marks])
        if recorded:
            self._recorded = marks[recorded - 1].sent
            self._recorded_at = self._recorded_at or time.monotonic()
        stored = recorded
        if self.persisting:
            stored = await _count_events(client, [m.event_id for m in marks])
            self._stored_any = self._stored_any or stored > 0
            if self._persister_silent(persister_off_after, grace):
                self.persisting, stored = False, recorded
        self._advance(min(recorded, stored))

    def _persister_silent(self, after: int, grace: float) -> bool:
        return (not self._stored_any and self._recorded >= after
                and time.monotonic() - self._recorded_at >= grace)

    def _advance(self, batches: int) -> None:
        for _ in range(batches):
            self.taken = self._marks.popleft().sent


async def count_task_runs_by_id(client: Any, ids: list[str]) -> int:
    """How many of these task runs the server has: a look-up by primary key."""
    response = await client._client.post(
        "/task_runs/count", json={"task_runs": {"id": {"any_": ids}}})
    response.raise_for_status()
    return int(response.json())


async def _count_events(client: Any, ids: list[str]) -> int:
    # `occurred` must be given: by default the filter ends at the server's "now", and a
    # client clock ahead of it would hide the newest events.
    body = {"filter": {"id": {"id": ids},
                       "occurred": {"since": "2000-01-01T00:00:00Z",
                                    "until": "2999-01-01T00:00:00Z"}},
            "limit": 1}
    response = await client._client.post("/events/filter", json=body)
    response.raise_for_status()
    return int(response.json()["total"])
