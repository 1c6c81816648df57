"""Past one machine: an experiment's rows spread over a Dask cluster.

The rows are cut into batches; each batch is one Prefect task run submitted through
``prefect-dask``'s `DaskTaskRunner`. On its worker a batch runs its rows in asyncio
(the fast mode), records each call as its own task run nested under the batch, and
writes its records as Parquet parts (named for the batch) into the experiment's folder,
which the flow then merges into the one ``results.parquet``. Workers need the folder
(a shared file system past one machine) and a Prefect server (``PREFECT_API_URL``).
"""

from __future__ import annotations

import asyncio
import math
import os
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
from prefect import task as prefect_task
from prefect.cache_policies import NO_CACHE
from prefect.context import TaskRunContext

from . import _parquet
from ._dataset import Dataset
from ._events import EventStepRunner, TaskRunRecorder
from ._exceptions import ConfigError
from ._spec import ExperimentSpec
from ._threads import DaemonThreadPool

BATCHES_PER_WORKER = 4


def make_task_runner(task_runner: Any, address: str | None) -> Any:
    """``"dask"`` as a `DaskTaskRunner` (a local cluster, or the scheduler at ``address``)."""
    if task_runner != "dask":
        return task_runner
    try:
        from prefect_dask import DaskTaskRunner
    except ImportError:
        raise ConfigError("task_runner='dask' needs prefect-dask: pip install "
                          "'patronus-tasks[dask]'") from None
    if address:
        return DaskTaskRunner(address=address)
    return DaskTaskRunner(cluster_kwargs={"n_workers": 2, "threads_per_worker": 1,
                                          "processes": True, "dashboard_address": None})


@dataclass
class Batch:
    """What one worker needs: the spec with its slice of rows, where to write, for whom."""

    spec: ExperimentSpec
    index: int
    flow_run_id: str
    columns: tuple[pa.Schema, frozenset[str]]
    #: Batches that may post to the server at once (all of them, at most): their event
    #: recorders share the server's bound (see `_events`).
    share: int = 1


@prefect_task(name="experiment-batch", task_run_name="batch-{batch.index}", cache_policy=NO_CACHE,
              persist_result=False)
async def run_batch(batch: Batch) -> dict[str, Any]:
    """Run a batch of rows on a worker; write its parts; return its counts."""
    from ._experiment import _Tally
    from ._runner import RowRunner, run_rows

    ctx = TaskRunContext.get()
    parent = str(ctx.task_run.id) if ctx and ctx.task_run else None
    spec, tally = batch.spec, _Tally()
    sink = _parquet.ParquetSink(spec.out_dir, columns=batch.columns, prefix=f"b{batch.index}")
    pool = DaemonThreadPool(spec.max_concurrency)

    def on_records(records: list[dict[str, Any]]) -> None:
        tally.add(records)
        sink.add(records)

    async with TaskRunRecorder(batch.flow_run_id, spec.prefect_tags, parent,
                               share=batch.share) as recorder:
        runner = RowRunner(spec.links, EventStepRunner(recorder), tags=spec.tags,
                           limit=spec.max_concurrency, pool=pool)
        try:
            await run_rows(spec.dataset.samples(), runner, spec.max_concurrency, on_records)
        finally:
            sink.flush()
            pool.shutdown(wait=False)
    return {**vars(tally), "calls": runner.calls, "lost": recorder.lost, "pid": os.getpid(),
            "last": recorder.last_task_run_id}


def _batches(spec: ExperimentSpec, flow_run_id: str, workers: int) -> list[Batch]:
    df = spec.dataset.df
    count = max(1, min(len(df), workers * BATCHES_PER_WORKER))
    size = math.ceil(len(df) / count)
    columns, starts = _parquet.dataset_schema(df), range(0, len(df), size)
    return [Batch(replace(spec, dataset=Dataset(df.iloc[i:i + size].reset_index(drop=True),
                                                spec.dataset.source)),
                  n, flow_run_id, columns, share=len(starts))
            for n, i in enumerate(starts)]


async def run_batches(spec: ExperimentSpec, flow_run_id: str, tally: Any, last: list[str]
                      ) -> int:
    """Submit every batch to the flow's task runner; fold their counts into ``tally``; put
    each batch's last recorded task run in ``last``.

    Returns the task runs made: each call, plus one per batch.
    """
    batches = _batches(spec, flow_run_id, workers=2)
    futures = [run_batch.submit(b) for b in batches]
    results: list[dict[str, Any]] = await asyncio.to_thread(
        lambda: [f.result() for f in futures])  # type: ignore[misc]
    for result in results:
        for key in ("rows", "records", "task_errors", "evaluator_errors", "errored_rows"):
            setattr(tally, key, getattr(tally, key) + result[key])
    tally.pids = sorted({r["pid"] for r in results})
    last.extend(r["last"] for r in results if r["last"])
    return sum(r["calls"] for r in results) + len(batches)
