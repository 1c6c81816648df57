"""Rows on a Prefect task runner's workers (Dask's `DaskTaskRunner`, or any other): a `Backend`.

The rows are cut into batches; each batch is one Prefect task run submitted through the
flow run's task runner. On its worker a batch runs the row loop as the experiment's
process does for ``backend="prefect"`` (`Recorded`: each call its own task run, nested
under the batch's), writes its records as Parquet parts (named for the batch) into the
experiment's folder, which the experiment then merges into the one ``results.parquet``,
and ends once Prefect holds its records (the worker may go away after). Workers need
the folder (a shared file system past one machine, or an object-store ``results_dir``)
and a Prefect server (``PREFECT_API_URL``). A resumed experiment sends each batch what
the earlier run completed of its rows.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
from prefect import task as prefect_task
from prefect.cache_policies import NO_CACHE
from prefect.context import TaskRunContext

from patronus_tasks.define.dataset import Dataset
from patronus_tasks.integrations.prefect import runs as _runs
from patronus_tasks.integrations.prefect.calls import Recorded
from patronus_tasks.integrations.prefect.recorder import TaskRunRecorder
from patronus_tasks.record import parquet as _parquet
from patronus_tasks.record.resume import Replay
from patronus_tasks.run.loop import RecordStream, Rows, RunTotals

logger = logging.getLogger("patronus_tasks")
BATCHES_PER_WORKER = 4


@dataclass
class RowBatch:
    """What one worker needs: its rows (the spec with its slice of the dataset, what an
    earlier run completed of them), where to write, for whom."""

    rows: Rows
    index: int
    flow_run_id: str
    columns: tuple[pa.Schema, frozenset[str]]
    #: Batches that may post to the server at once (all of them, at most): their event
    #: recorders share the server's bound (see `recorder`).
    share: int = 1

    @property
    def prefix(self) -> str:
        """The batch's Parquet parts' prefix."""
        return f"b{self.index}"


@dataclass
class BatchOutcome:
    """What a batch sends back from its worker: its totals, the task runs it lost."""

    totals: RunTotals
    lost: int


@prefect_task(name="experiment-batch", task_run_name="batch-{batch.index}", cache_policy=NO_CACHE,
              persist_result=False)
async def run_batch(batch: RowBatch) -> BatchOutcome:
    """Run a batch of rows on a worker; write its parts; return its totals once Prefect
    holds its records."""
    ctx = TaskRunContext.get()
    parent = str(ctx.task_run.id) if ctx and ctx.task_run else None
    spec = batch.rows.spec
    stream = RecordStream(RunTotals(pids=[os.getpid()]), _parquet.ParquetSink(
        spec.out_dir, columns=batch.columns, prefix=batch.prefix))
    recorder = TaskRunRecorder(batch.flow_run_id, spec.prefect_tags, parent,
                               share=batch.share).start()
    try:
        await Recorded(recorder, spec.record).run(batch.rows, stream)
    finally:
        recorder.close()
    await recorder.until_recorded()
    return BatchOutcome(stream.totals, recorder.lost)


class OnTaskRunner:
    """Rows in batches through the task runner of the flow run this runs in."""

    def __init__(self, workers: int = 2) -> None:
        self.workers = workers

    async def run(self, rows: Rows, stream: RecordStream) -> None:
        """Submit every batch; fold each one's totals into the stream's as it ends, and
        show its rows to the stream's watcher (progress, reporters)."""
        flow_run_id = _runs.current_flow_run_id()
        assert flow_run_id is not None, "batches run inside the experiment's flow run"
        batches = _batches(rows, flow_run_id, self.workers)
        futures = [run_batch.submit(b) for b in batches]
        lost = 0
        for batch, future in zip(batches, futures, strict=True):
            outcome: BatchOutcome = await asyncio.to_thread(future.result)  # type: ignore[arg-type]
            stream.totals += outcome.totals
            lost += outcome.lost
            await _show(batch, stream)
        if lost:
            logger.error("%d task runs of the batches were not recorded by Prefect (their "
                         "rows are in the Parquet results)", lost)


async def _show(batch: RowBatch, stream: RecordStream) -> None:
    """A batch's rows as its worker wrote them, to whoever watches."""
    if stream.watch is None:
        return
    for records in _parquet.written_by(batch.rows.spec.out_dir, batch.prefix):
        pending = stream.show(records)
        if pending is not None:
            await pending


def _batches(rows: Rows, flow_run_id: str, workers: int) -> list[RowBatch]:
    spec, replay = rows.spec, rows.replay
    df = spec.dataset.df
    if replay is not None:  # rows the earlier run completed are written already
        numbers = range(1, spec.repeats + 1) if spec.repeats > 1 else [None]
        df = df[[any(replay.wanted(str(sid), k) for k in numbers)
                 for sid in df["sid"]]].reset_index(drop=True)
    if not len(df):
        return []
    size = math.ceil(len(df) / max(1, min(len(df), workers * BATCHES_PER_WORKER)))
    columns, starts = _parquet.dataset_schema(spec.dataset.df), range(0, len(df), size)
    # Watchers stay here (reporters hold this loop's queue): a batch's rows go to them
    # once it is done.
    return [RowBatch(Rows(replace(spec, reporters=(), on_progress=None, dataset=Dataset(
                              df.iloc[i:i + size].reset_index(drop=True), spec.dataset.source,
                              spec.dataset.dataset_id)),
                          _replay_of(replay, df["sid"].iloc[i:i + size])),
                     n, flow_run_id, columns, share=len(starts))
            for n, i in enumerate(starts)]


def _replay_of(replay: Replay | None, sids: Any) -> Replay | None:
    return None if replay is None else replay.of({str(s) for s in sids})
