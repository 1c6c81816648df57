"""Who watches experiments run: a progress callback per run, or observers for a block.

A caller running one experiment passes ``on_progress`` (an option), and ``reporters``
(an option: `Reporter`s sending the records elsewhere too). A caller that runs
code which runs experiments it does not call itself (the command line running a user's
flow) observes them for the span of that code with `observing`: scoped to its context,
never set process-wide.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from patronus_tasks.define.dataset import Dataset
    from patronus_tasks.record.records import Record
    from patronus_tasks.results.experiment import Experiment


class RunFacts(Protocol):
    """What observers and reporters read of the experiment running (its `ExperimentSpec`,
    which imports this module: hence a protocol)."""

    @property
    def project_name(self) -> str: ...
    @property
    def experiment_name(self) -> str: ...
    @property
    def experiment_id(self) -> str: ...
    @property
    def tags(self) -> dict[str, str]: ...
    @property
    def dataset(self) -> Dataset: ...


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


class Reporter(Protocol):
    """Sends an experiment's records somewhere else as they come (the Patronus platform).

    ``start`` runs before the first row (a failure there stops the experiment, like a
    set-up mistake); ``add`` gets each row's records and may wait (a full queue holds the
    rows back, nothing is dropped); ``finish`` runs after the results are written and
    returns what the manifest keeps under ``reports[name]``; ``cancel`` stops it when the
    run is interrupted. Its failures never fail the experiment: it counts them.
    """

    name: str

    async def start(self, spec: RunFacts) -> None: ...

    async def add(self, records: list[Record]) -> None: ...

    async def finish(self) -> dict[str, Any]: ...  # JSON: the manifest's ``reports[name]``

    def cancel(self) -> None: ...
