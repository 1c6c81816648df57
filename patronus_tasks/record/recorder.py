"""The one interface that receives an experiment's results: a `Recorder`.

Every row's records go, as the row ends, to the recorders of its run (`run.loop.
RecordStream` hands them on): the totals the manifest counts (`run.loop.RunTotals`),
the Parquet results (`record.parquet.ParquetSink`), the progress and observers
(`run.observers.Progress`) and the reporters that send them elsewhere (the Patronus
platform: `patronus.export.PatronusReporter`, or one of yours in ``reporters=``).

A step call's way to its Prefect task run is not a recorder: calls go to a
`prefect.runs.calls.CallSink` while the row is still running, to show in the UI as they
happen; its records are final only when the row ends.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from patronus_tasks.define.dataset import Dataset
    from patronus_tasks.record.manifest import Manifest
    from patronus_tasks.record.records import Record


class RunFacts(Protocol):
    """What recorders read of the experiment running (its `run.spec.ExperimentSpec`)."""

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


class Recorder(Protocol):
    """Receives an experiment's results.

    ``start`` runs before the first row (a failure there stops the experiment, like a
    set-up mistake); ``add`` gets each row's records as the row ends and may return an
    awaitable the row waits on (a full queue holds the rows back: nothing is dropped);
    ``finish`` runs once the rows are done, with the run's manifest, and returns what the
    manifest keeps under ``reports[name]`` (None: nothing); ``cancel`` stops it when the
    run is interrupted, keeping what it was given. A reporter's failures never fail the
    experiment: it counts them.
    """

    name: str

    async def start(self, run: RunFacts) -> None: ...

    def add(self, records: list[Record]) -> Awaitable[None] | None: ...

    async def finish(self, manifest: Manifest) -> dict[str, Any] | None: ...

    def cancel(self) -> None: ...
