"""Who watches experiments run: a progress callback per run, or observers for a block.

A caller running one experiment passes ``on_progress`` (an option; `Progress` is the
`Recorder` that calls it), and ``reporters`` (an option: `Recorder`s sending the records
elsewhere too). A caller that runs
code which runs experiments it does not call itself (the command line running a user's
flow) observes them for the span of that code with `observing`: scoped to its context,
never set process-wide.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from patronus_tasks.record.recorder import Recorder, RunFacts

if TYPE_CHECKING:
    from patronus_tasks.record.manifest import Manifest
    from patronus_tasks.record.records import Record
    from patronus_tasks.results.experiment import Experiment


@dataclass(frozen=True)
class Observers:
    """``on_row(spec, rows_done)`` after each row; ``on_finished(experiment)`` at the end."""

    on_row: Callable[[RunFacts, int], None] | None = None
    on_finished: Callable[[Experiment], None] | None = None


_CURRENT: ContextVar[tuple[Observers, ...]] = ContextVar("patronus_tasks_observers", default=())


@contextmanager
def observing(observers: Observers) -> Iterator[None]:
    """Let ``observers`` see every experiment run in this context while the block runs."""
    token = _CURRENT.set((*_CURRENT.get(), observers))
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current() -> tuple[Observers, ...]:
    return _CURRENT.get()


#: A recorder that sends an experiment's records elsewhere as they come (``reporters=``).
Reporter = Recorder


class Progress:
    """The `Recorder` of the progress callback (``on_progress``) and the observers' ``on_row``:
    told of each row as it ends, with the rows done so far (``totals``'s count)."""

    name = "progress"

    def __init__(self, run: RunFacts, totals: RunTotalsLike,
                 on_progress: Callable[[int, int], None] | None, runs: int) -> None:
        self.run, self.totals, self.on_progress, self.runs = run, totals, on_progress, runs
        self.watching = current()

    @property
    def wanted(self) -> bool:
        return self.on_progress is not None or any(o.on_row for o in self.watching)

    async def start(self, run: RunFacts) -> None:
        return None

    def add(self, records: list[Record]) -> None:
        if self.on_progress is not None:
            self.on_progress(self.totals.rows, self.runs)
        for observer in self.watching:
            if observer.on_row is not None:
                observer.on_row(self.run, self.totals.rows)

    async def finish(self, manifest: Manifest) -> None:
        return None

    def cancel(self) -> None:
        return None


class RunTotalsLike(Protocol):
    @property
    def rows(self) -> int: ...
