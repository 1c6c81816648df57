"""The row loop, and the backends that drive it: where an experiment's rows run.

`row_loop` is the one loop every backend runs rows through: the rows of a `Rows` (the
spec's, or a worker's batch of them) through the chain with a `StepRunner`, at most
``max_concurrency`` at once, each row's records into a `RecordStream` (the totals, the
Parquet parts, whoever watches) as it finishes. A `Backend` says where the loop runs:
`InProcess` runs it here with a step runner (plain asyncio for ``"local"``; each call
recorded on Prefect, `prefect/runs/calls`); a Prefect task runner (Dask's or
any other) runs it in batches on its workers (`prefect/runs/taskrunner`),
where each batch is an `InProcess` loop of its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from patronus_tasks.record.parquet import ParquetSink
from patronus_tasks.record.recorder import Recorder, RunFacts
from patronus_tasks.record.records import STATUS_ERROR, Record
from patronus_tasks.record.resume import Replay
from patronus_tasks.run.garbage import fewer_collections
from patronus_tasks.run.runner import RowRunner, StepRunner, Unit, run_rows, units
from patronus_tasks.run.spec import ExperimentSpec
from patronus_tasks.run.threads import DaemonThreadPool

if TYPE_CHECKING:
    from patronus_tasks.record.manifest import Manifest

@dataclass
class RunTotals:
    """Rows, records and errors counted as records stream past (the manifest's figures,
    the progress): a `Recorder`; the totals of loops run elsewhere (batches) add up with
    ``+=``."""

    name = "totals"

    rows: int = 0
    records: int = 0
    task_errors: int = 0
    evaluator_errors: int = 0
    errored_rows: int = 0
    calls: int = 0  # step calls handed to be run (the cache's answers included)
    cached: int = 0  # of them, answered from the cache
    pids: list[int] = field(default_factory=list)  # worker processes, when rows ran on Dask

    def add(self, records: list[Record]) -> None:
        """One row's records."""
        self.rows += 1
        self.records += len(records)
        errors = [r for r in records if r.status == STATUS_ERROR]
        self.errored_rows += bool(errors)
        evaluator = sum(r.error_stage == "evaluator" for r in errors)
        self.evaluator_errors += evaluator
        self.task_errors += len(errors) - evaluator

    async def start(self, run: RunFacts) -> None:
        return None

    async def finish(self, manifest: Manifest) -> None:
        return None

    def cancel(self) -> None:
        return None

    def __iadd__(self, other: RunTotals) -> RunTotals:
        for name in ("rows", "records", "task_errors", "evaluator_errors", "errored_rows",
                     "calls", "cached"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.pids = sorted({*self.pids, *other.pids})
        return self


@dataclass(frozen=True)
class Rows:
    """Rows to run: the spec's dataset (a batch's slice of it on a worker), and what an
    earlier run completed of them (a resume: those are not run again)."""

    spec: ExperimentSpec
    replay: Replay | None = None

    def units(self) -> Iterator[Unit]:
        """Every run of every row still to run (each repeat of it, with repeats)."""
        wanted = self.replay.wanted if self.replay is not None else None
        return units(self.spec.dataset.samples(), self.spec.repeats, wanted)


class RecordStream:
    """Where each row's records go as it finishes, to the run's `Recorder`s: counted in
    ``totals``, written to ``sink`` (Parquet parts), shown to the ``watchers`` (the
    progress, the reporters), whom the row may wait for."""

    def __init__(self, totals: RunTotals, sink: ParquetSink,
                 watchers: Sequence[Recorder] = ()) -> None:
        self.totals, self.sink, self.watchers = totals, sink, tuple(watchers)

    def add(self, records: list[Record]) -> Awaitable[None] | None:
        self.totals.add(records)
        self.sink.add(records)
        return self.show(records)

    def show(self, records: list[Record]) -> Awaitable[None] | None:
        """Show a row's records to the watchers only (a worker counted and wrote them)."""
        if not self.watchers:  # the common case: nobody watches, nothing to build per row
            return None
        pending = [p for p in (w.add(records) for w in self.watchers) if p is not None]
        return None if not pending else _each(pending)

    @property
    def recorders(self) -> tuple[Recorder, ...]:
        return (self.totals, self.sink, *self.watchers)


async def _each(pending: list[Awaitable[None]]) -> None:
    for awaitable in pending:  # in order: a reporter's queue keeps the rows' order
        await awaitable


async def row_loop(rows: Rows, steps: StepRunner, stream: RecordStream) -> None:
    """Run the rows through the chain, each call through ``steps``; stream each row's
    records. Whatever ends it, the rows done are written (as parts) and the threads of
    sync steps let go (a call stuck in user code must not hold the process)."""
    spec = rows.spec
    pool = DaemonThreadPool(spec.max_concurrency)
    runner = RowRunner(spec.links, steps, tags=spec.tags, limit=spec.max_concurrency,
                       pool=pool, replay=rows.replay, cache=spec.open_cache(), prices=spec.prices,
                       variant=spec.variant.view() if spec.variant is not None else None)
    try:
        with fewer_collections():
            await run_rows(rows.units(), runner, spec.max_concurrency, stream.add)
    finally:
        stream.totals.calls += runner.calls
        stream.totals.cached += runner.cached
        stream.sink.flush()
        pool.shutdown(wait=False)


class Backend(Protocol):
    """Where an experiment's rows run: it runs them through `row_loop` (here, or on
    workers that write their own parts into the experiment's folder) and streams or
    shows each row's records to ``stream``."""

    async def run(self, rows: Rows, stream: RecordStream) -> None: ...


class InProcess:
    """Rows run here, in this event loop, each call through ``steps``."""

    def __init__(self, steps: StepRunner) -> None:
        self.steps = steps

    async def run(self, rows: Rows, stream: RecordStream) -> None:
        await row_loop(rows, self.steps, stream)
