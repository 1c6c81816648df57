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
from patronus_tasks.exceptions import ExperimentError
from patronus_tasks.prefect import internal, settings
from patronus_tasks.prefect.recorder.taskruns import TaskRunRecorder
from patronus_tasks.prefect.runs import flow as _runs
from patronus_tasks.prefect.runs.calls import Recorded
from patronus_tasks.prefect.runs.kept import kept_calls, send_missing
from patronus_tasks.record import parquet as _parquet
from patronus_tasks.record.records import Record
from patronus_tasks.record.resume import Replay, UnitKey
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
        spec.out_dir, columns=batch.columns, prefix=batch.prefix))  # adopts a dead one's journals
    rows, kept = _after_earlier_attempts(batch, stream)
    recorder = TaskRunRecorder(batch.flow_run_id, spec.prefect_tags, parent,
                               share=batch.share).start()
    try:
        if kept:  # their task runs the dead attempt had not sent: sent from their records
            await send_missing(recorder, [c for records in kept
                                          for c in kept_calls(records, batch.flow_run_id)])
        await Recorded(recorder, spec.record).run(rows, stream)
    finally:
        recorder.close()
    await recorder.until_recorded()
    return BatchOutcome(stream.totals, recorder.lost)


def _after_earlier_attempts(batch: RowBatch, stream: RecordStream) -> tuple[Rows, list[list[Record]]]:
    """The batch's rows but those an earlier attempt of it wrote before its worker died
    (Dask runs a lost worker's tasks again elsewhere), and the records of those: each is
    kept as written, counted in this attempt's totals, and neither run (its calls paid
    again) nor written twice."""
    written: set[UnitKey] = set()
    kept = list(_parquet.written_by(batch.rows.spec.out_dir, batch.prefix))
    for records in kept:
        written.add((records[0].sid, records[0].repeat))
        stream.totals.add(records)
        stream.totals.calls += _calls(records)
    if not written:
        return batch.rows, []
    logger.warning("batch %d ran before on a worker that is gone: its %d rows written then are "
                   "kept, the rest run here", batch.index, len(written))
    replay = batch.rows.replay or Replay()
    return replace(batch.rows, replay=replay.with_written(written)), kept


def _calls(records: list[Record]) -> int:
    """The step calls a row's records stand for: a task per link, an evaluator per record."""
    tasks = {r.link_index for r in records if r.task_name is not None}
    return len(tasks) + sum(r.evaluator_name is not None for r in records)


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
        if batches:
            await asyncio.to_thread(probe, batches[0])
        futures = [run_batch.submit(b) for b in batches]
        lost = 0
        for batch, future in zip(batches, futures, strict=True):
            outcome: BatchOutcome = await asyncio.to_thread(_outcome, batch, future)
            stream.totals += outcome.totals
            lost += outcome.lost
            await _show(batch, stream)
        if lost:
            logger.error("%d task runs of the batches were not recorded by Prefect (their "
                         "rows are in the Parquet results)", lost)


def _outcome(batch: RowBatch, future: Any) -> BatchOutcome:
    try:
        return future.result()  # type: ignore[no-any-return,unused-ignore]
    except Exception as exc:
        if type(exc).__name__ == "KilledWorker":  # Dask: the batch took its workers down
            raise ExperimentError(
                f"batch {batch.index} was lost with every worker that ran it ({exc}): a step "
                "crashed its process or the workers ran out of memory. The rows written are "
                "kept in the results folder; resume=True goes on from them.") from None
        raise


def load_on_worker(blobs: dict[str, bytes]) -> dict[str, Any]:
    """On a worker: load each step and the batch as a batch would (from bytes, so that a
    failure is this code's to say); say this package's version and the host."""
    import socket

    import cloudpickle

    from patronus_tasks._version import __version__

    problems = {}
    for name, blob in blobs.items():
        try:
            cloudpickle.loads(blob)
        except BaseException as exc:  # ModuleNotFoundError, AttributeError, ...
            problems[name] = f"{type(exc).__name__}: {exc}"
    return {"version": __version__, "host": socket.gethostname(), "problems": problems}


def probe(batch: RowBatch) -> None:
    """Fail within seconds, saying what and how to fix it, when the workers cannot run the
    experiment: a step (or the batch) a worker cannot load, another version of this
    package there, no worker answering (they died loading it, or none is connected).

    Dask only (a task runner in this process needs none). The probe goes as a plain
    function: a Prefect task carries its flow run's context, the steps in it, and a worker
    that cannot load them breaks while reading the task (Dask's "Error during
    deserialization", the client waiting for ever)."""
    import cloudpickle

    from patronus_tasks._version import __version__

    dask = internal.dask_client()
    if dask is None:
        return
    steps = {f"the step {s.name!r} ({_where(s)})": s for s in batch.rows.spec.steps()}
    blobs = {name: cloudpickle.dumps(step) for name, step in steps.items()}
    blobs["a batch of rows"] = cloudpickle.dumps(batch)
    seconds = settings.probe_seconds()
    try:
        said: dict[str, Any] = dask.submit(load_on_worker, blobs, pure=False).result(timeout=seconds)
    except TimeoutError:
        raise ExperimentError(
            f"no task runner worker ran the experiment's probe within {seconds:g} s: its workers "
            "died loading it (a module they lack, memory) or none is connected. Look at the "
            f"workers' logs; ${settings.PROBE_ENV} sets the wait.") from None
    except Exception as exc:
        died = type(exc).__name__ == "KilledWorker"
        raise ExperimentError(
            f"the task runner's workers died loading the experiment's code ({exc}): a step "
            "crashes the process that loads it." if died else
            f"the task runner's workers cannot load this package's code: {type(exc).__name__}: "
            f"{exc}. Install patronus-tasks=={__version__} on every worker.") from None
    _check(said, __version__)


def _where(step: Any) -> str:
    fn = getattr(step, "fn", None)
    module = getattr(fn, "__module__", None) or type(step).__module__
    return f"{module}.{getattr(fn, '__qualname__', type(step).__qualname__)}"


def _check(said: dict[str, Any], version: str) -> None:
    host = said.get("host", "a worker")
    if said.get("version") != version:
        raise ExperimentError(f"the worker on {host} has patronus-tasks {said.get('version')}, "
                              f"this process {version}: install the same version on every "
                              "worker (its steps and batches must read alike).")
    problems = said.get("problems") or {}
    if problems:
        listed = "; ".join(f"{name}: {why}" for name, why in problems.items())
        raise ExperimentError(
            f"the worker on {host} cannot load {listed}. Make the code importable there: "
            "install the module on every worker (or ship it with Dask's Client.upload_file), "
            "or define the step in the script that runs the experiment, which is sent whole.")


async def _show(batch: RowBatch, stream: RecordStream) -> None:
    """A batch's rows as its worker wrote them, to whoever watches."""
    if not stream.watchers:
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
    columns = _parquet.dataset_schema(spec.dataset.df, spec.dataset.declared)
    starts = range(0, len(df), size)
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
