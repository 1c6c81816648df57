"""Past one machine: an experiment's rows in batches through a Prefect task runner (Dask).

The rows are cut into batches; each batch is one Prefect task run submitted through the
flow's task runner (``prefect-dask``'s `DaskTaskRunner` for ``backend="dask"``). On its
worker a batch runs its rows in asyncio as the in-process path does, records each call as
its own task run nested under the batch, writes its records as Parquet parts (named for
the batch) into the experiment's folder, which the flow then merges into the one
``results.parquet``, and ends once Prefect holds its records (the worker may go away
after). Workers need the folder (a shared file system past one machine, or an
object-store ``results_dir``) and a Prefect server (``PREFECT_API_URL``). A resumed
experiment sends each batch what the earlier run completed of its rows.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
from prefect import task as prefect_task
from prefect.cache_policies import NO_CACHE
from prefect.context import TaskRunContext
from prefect.task_runners import TaskRunner

from patronus_tasks.define.dataset import Dataset
from patronus_tasks.exceptions import ConfigError
from patronus_tasks.integrations.prefect import steplogs as _steplogs
from patronus_tasks.integrations.prefect.calls import RecordingStepRunner
from patronus_tasks.integrations.prefect.recorder import TaskRunRecorder
from patronus_tasks.record import parquet as _parquet
from patronus_tasks.record.records import Record
from patronus_tasks.record.resume import Replay
from patronus_tasks.run.execute import RunTotals
from patronus_tasks.run.options import TaskRunnerOption
from patronus_tasks.run.spec import ExperimentSpec
from patronus_tasks.run.threads import DaemonThreadPool

logger = logging.getLogger("patronus_tasks")
BATCHES_PER_WORKER = 4


def make_task_runner(task_runner: TaskRunnerOption, address: str | None) -> TaskRunner[Any]:
    """``"dask"`` as a `DaskTaskRunner` (a local cluster, or the scheduler at ``address``)."""
    if task_runner != "dask":
        return task_runner
    try:
        from prefect_dask import DaskTaskRunner
    except ImportError:
        raise ConfigError("backend='dask' needs prefect-dask: pip install "
                          "'patronus-tasks[dask]'") from None
    if address:
        return DaskTaskRunner(address=address)
    from patronus_tasks.integrations.dask_cluster import local_cluster

    # Not `LocalCluster`: its workers import the user's script again (see dask_cluster).
    return DaskTaskRunner(cluster_class=local_cluster,
                          cluster_kwargs={"n_workers": 2, "threads_per_worker": 1})


@dataclass
class RowBatch:
    """What one worker needs: the spec with its slice of rows, where to write, for whom."""

    spec: ExperimentSpec
    index: int
    flow_run_id: str
    columns: tuple[pa.Schema, frozenset[str]]
    #: Batches that may post to the server at once (all of them, at most): their event
    #: recorders share the server's bound (see `recorder`).
    share: int = 1
    replay: Replay | None = None  # what an earlier run completed of these rows


@dataclass
class BatchOutcome:
    """What a batch sends back from its worker: its totals, calls made, task runs lost."""

    totals: RunTotals
    calls: int
    lost: int


@prefect_task(name="experiment-batch", task_run_name="batch-{batch.index}", cache_policy=NO_CACHE,
              persist_result=False)
async def run_batch(batch: RowBatch) -> BatchOutcome:
    """Run a batch of rows on a worker; write its parts; return its counts once Prefect
    holds its records."""
    from patronus_tasks.run.runner import RowRunner, run_rows, units

    ctx = TaskRunContext.get()
    parent = str(ctx.task_run.id) if ctx and ctx.task_run else None
    spec, tally = batch.spec, RunTotals(pids=[os.getpid()])
    sink = _parquet.ParquetSink(spec.out_dir, columns=batch.columns, prefix=f"b{batch.index}")
    pool = DaemonThreadPool(spec.max_concurrency)
    recorder = TaskRunRecorder(batch.flow_run_id, spec.prefect_tags, parent,
                               share=batch.share).start()
    runner = RowRunner(spec.links, RecordingStepRunner(recorder, spec.record), tags=spec.tags,
                       limit=spec.max_concurrency, pool=pool, replay=batch.replay,
                       cache=spec.open_cache(), prices=spec.prices)
    wanted = batch.replay.wanted if batch.replay is not None else None

    def on_records(records: list[Record]) -> None:
        tally.add(records)
        sink.add(records)

    try:
        with _steplogs.capture():
            await run_rows(units(spec.dataset.samples(), spec.repeats, wanted), runner,
                           spec.max_concurrency, on_records)
    finally:
        sink.flush()
        pool.shutdown(wait=False)
        recorder.close()
    await recorder.until_recorded()
    tally.calls, tally.cached = runner.calls, runner.cached
    return BatchOutcome(tally, runner.calls, recorder.lost)


def _batches(spec: ExperimentSpec, flow_run_id: str, workers: int,
             replay: Replay | None) -> list[RowBatch]:
    df = spec.dataset.df
    if replay is not None:  # rows the earlier run completed are written already
        numbers = range(1, spec.repeats + 1) if spec.repeats > 1 else [None]
        df = df[[any(replay.wanted(str(sid), k) for k in numbers)
                 for sid in df["sid"]]].reset_index(drop=True)
    if not len(df):
        return []
    count = max(1, min(len(df), workers * BATCHES_PER_WORKER))
    size = math.ceil(len(df) / count)
    columns, starts = _parquet.dataset_schema(spec.dataset.df), range(0, len(df), size)
    # Reporters stay here (they hold this loop's queue): the results go to them at the end.
    return [RowBatch(replace(spec, reporters=(),
                          dataset=Dataset(df.iloc[i:i + size].reset_index(drop=True),
                                          spec.dataset.source, spec.dataset.dataset_id)),
                  n, flow_run_id, columns, share=len(starts),
                  replay=_replay_of(replay, df["sid"].iloc[i:i + size]))
            for n, i in enumerate(starts)]


def _replay_of(replay: Replay | None, sids: Iterable[object]) -> Replay | None:
    return None if replay is None else replay.of({str(s) for s in sids})


async def run_batches(spec: ExperimentSpec, flow_run_id: str, tally: RunTotals,
                      replay: Replay | None = None) -> int:
    """Submit every batch to the flow's task runner; fold their counts into ``tally``.

    Returns the task runs made: each call, plus one per batch.
    """
    batches = _batches(spec, flow_run_id, 2, replay)
    futures = [run_batch.submit(b) for b in batches]
    results: list[BatchOutcome] = await asyncio.to_thread(
        lambda: [f.result() for f in futures])  # type: ignore[misc]
    for result in results:
        tally += result.totals
    lost = sum(r.lost for r in results)
    if lost:
        logger.error("%d task runs of the batches were not recorded by Prefect (their rows are "
                     "in the Parquet results)", lost)
    return sum(r.calls for r in results) + len(batches)
