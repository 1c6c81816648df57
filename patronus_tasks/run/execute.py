"""Running an experiment's rows: the run core (rows to Parquet, the manifest, the tally).

Where the rows run (here, on Prefect, on Dask) is the caller's: this takes a step runner,
or ``batches`` that run them elsewhere.
"""

from __future__ import annotations

import datetime as dt
import functools
import subprocess
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from patronus_tasks._version import __version__
from patronus_tasks.record import parquet as _parquet
from patronus_tasks.record import resume as _resume
from patronus_tasks.record.manifest import DatasetInfo, EvaluatorInfo, LinkInfo, Manifest, RunStatus
from patronus_tasks.record.manifest_file import ManifestFile
from patronus_tasks.record.records import STATUS_ERROR, Record
from patronus_tasks.results.gates import error_gate, failed_gates, failed_metric_gates
from patronus_tasks.results.metrics import evaluate_metrics
from patronus_tasks.results.summary import Summary
from patronus_tasks.results.usage import USAGE_COLUMNS, total_cost, usage_totals
from patronus_tasks.run import observers
from patronus_tasks.run.runner import RowRunner, StepRunner, run_rows, units
from patronus_tasks.run.spec import ExperimentSpec
from patronus_tasks.run.threads import DaemonThreadPool

if TYPE_CHECKING:
    from patronus_tasks.results.experiment import Experiment

@dataclass
class RunTotals:
    """Rows, records and errors counted as records stream past (the manifest's figures,
    the progress); totals of batches run elsewhere (Dask) add up with ``+=``."""

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

    def __iadd__(self, other: RunTotals) -> RunTotals:
        for name in ("rows", "records", "task_errors", "evaluator_errors", "errored_rows",
                     "calls", "cached"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.pids = sorted({*self.pids, *other.pids})
        return self


@functools.lru_cache(maxsize=1)
def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _manifest(spec: ExperimentSpec, tally: RunTotals, status: RunStatus, started: dt.datetime,
              flow_run_id: str | None) -> Manifest:
    ended = None if status == "running" else dt.datetime.now(dt.UTC).isoformat()
    return Manifest(
        project=spec.project_name, experiment_name=spec.experiment_name,
        experiment_id=spec.experiment_id, status=status, tags=spec.tags,
        flow_run_id=flow_run_id, series=spec.series, started_at=started.isoformat(),
        ended_at=ended,
        rows=tally.rows, records=tally.records, task_errors=tally.task_errors,
        evaluator_errors=tally.evaluator_errors, errored_rows=tally.errored_rows,
        repeats=spec.repeats, worker_pids=tally.pids or None,
        dataset=DatasetInfo(source=spec.dataset.source, rows=len(spec.dataset),
                            sha256=spec.dataset.content_hash()),
        links=[LinkInfo(task=lk.task.name if lk.task else None,
                        evaluators=[EvaluatorInfo(name=e.name, criteria=e.criteria)
                                    for e in lk.evaluators]) for lk in spec.links],
        package_version=__version__, git_commit=_git_commit(), python=sys.version.split()[0])


async def execute(spec: ExperimentSpec, runner: StepRunner, flow_run_id: str | None = None,
                  tally: RunTotals | None = None,
                  batches: Callable[[RunTotals, _resume.Replay | None], Coroutine[Any, Any, int]]
                  | None = None,
                  manifest_file: ManifestFile | None = None) -> tuple[Manifest, int]:
    """Run every row, stream records to Parquet, write the manifest.

    Returns the manifest and the number of step calls made. This is the whole
    experiment minus orchestration: the Prefect flow is a thin wrapper around it.
    ``batches`` runs the rows elsewhere instead (Dask workers writing their own parts).
    """
    started = dt.datetime.now(dt.UTC)
    replay = (_resume.load_replay(spec.out_dir, spec.replay == "retry") if spec.replay
              else None)
    sink = _parquet.ParquetSink(spec.out_dir, spec.dataset.df)
    tally = tally or RunTotals()
    manifest_file = manifest_file or ManifestFile(spec.out_dir)
    manifest_file.write(_manifest(spec, tally, "running", started, flow_run_id))

    for reporter in spec.reporters:
        await reporter.start(spec)

    def on_records(records: list[Record]) -> Coroutine[Any, Any, None] | None:
        tally.add(records)
        sink.add(records)
        if spec.on_progress is not None:
            spec.on_progress(tally.rows, spec.runs)
        for observer in observers.current():
            if observer.on_row is not None:
                observer.on_row(spec, tally.rows)
        # Rows run elsewhere (batches) go to the reporters from the results file.
        return _report(spec, records) if spec.reporters and batches is None else None

    if replay is not None:
        for records in replay.reused_records():  # completed before: no call at all
            pending = on_records(records)
            if pending is not None:
                await pending
    rows = units(spec.dataset.samples(), spec.repeats, replay.wanted if replay else None)
    pool = DaemonThreadPool(spec.max_concurrency)
    row_runner = RowRunner(spec.links, runner, tags=spec.tags, limit=spec.max_concurrency,
                           pool=pool, replay=replay, cache=spec.open_cache(), prices=spec.prices)
    try:
        if batches is not None:
            row_runner.calls = await batches(tally, replay)
        else:
            await run_rows(rows, row_runner, spec.max_concurrency, on_records)
            tally.calls, tally.cached = tally.calls + row_runner.calls, tally.cached + row_runner.cached
    except BaseException:
        # Interrupted: keep every completed row as a part, and say so.
        for reporter in spec.reporters:
            reporter.cancel()
        sink.flush()
        manifest_file.write(_manifest(spec, tally, "interrupted", started, flow_run_id))
        raise
    finally:
        pool.shutdown(wait=False)  # a call stuck in user code must not hold the process
    manifest = _manifest(spec, tally, "completed", started, flow_run_id)
    sink.finalize(manifest.to_json(), _parquet.RowOrder(
        [str(s) for s in spec.dataset.df["sid"]], spec.chain_order()))
    _resume.finish(spec.out_dir)
    manifest = _with_figures(spec, manifest, tally)
    manifest_file.write(manifest)
    if spec.reporters:  # after the results are written: they never wait for a reporter
        manifest = await _finish_reports(spec, manifest, from_file=batches is not None)
        manifest_file.write(manifest)
    return manifest, row_runner.calls


def _with_figures(spec: ExperimentSpec, manifest: Manifest, tally: RunTotals) -> Manifest:
    """The manifest with what the results file says of the whole run: calls, tokens and
    cost per step and model, the dataset-level metrics (user code: each one's failure is
    its own value's error, never the run's)."""
    usage = usage_totals(_parquet.read_results(
        spec.out_dir, ["sid", "repeat", "link_index", "task_name", "evaluator_name",
                       *USAGE_COLUMNS]).to_pandas())
    update: dict[str, Any] = {"usage": usage or None, "cost_usd": total_cost(usage),
                              "calls": tally.calls - tally.cached, "cached_calls": tally.cached}
    if spec.metrics:
        df = _parquet.read_results(spec.out_dir).to_pandas()
        update["metrics"] = evaluate_metrics(spec.metrics, df)
    return manifest.model_copy(update=update)


async def _report(spec: ExperimentSpec, records: list[Record]) -> None:
    for reporter in spec.reporters:
        await reporter.add(records)


async def _finish_reports(spec: ExperimentSpec, manifest: Manifest, from_file: bool) -> Manifest:
    """Each reporter's outcome in the manifest. Rows run elsewhere (batches) never passed
    here: their records go to the reporters from the results file."""
    if from_file:
        for row in _parquet.read_results(spec.out_dir).to_pylist():
            await _report(spec, [Record.from_row(row)])
    reports = {reporter.name: await reporter.finish() for reporter in spec.reporters}
    return manifest.model_copy(update={"reports": reports})


def gate_failures(spec: ExperimentSpec, experiment: Experiment,
                  summary: Summary | None = None) -> list[str]:
    """What the experiment's gates (``fail_on_error``, ``min_pass_rates``, ``min_metrics``)
    say is wrong.

    ``summary``: the experiment's, when already computed (saves reading the results again).
    """
    m = experiment.manifest
    failures = error_gate(m.errored_rows, m.rows, spec.fail_on_error)
    if spec.min_pass_rates or spec.min_metrics:
        summary = summary or experiment.summary()
        failures += failed_gates(summary, spec.min_pass_rates)
        failures += failed_metric_gates(summary, spec.min_metrics)
    return failures
