"""Running an experiment's rows: the run core (rows to Parquet, the manifest, the tally).

Where the rows run (here, recorded on Prefect or not, on a task runner's workers) is
the caller's: this takes the `Backend` that runs them through the row loop (`loop`).
"""

from __future__ import annotations

import datetime as dt
import functools
import os
import socket
import subprocess
import sys
from typing import TYPE_CHECKING, Any, Protocol

from patronus_tasks._version import __version__
from patronus_tasks.exceptions import QualityGateError
from patronus_tasks.record import parquet as _parquet
from patronus_tasks.record import resume as _resume
from patronus_tasks.record.manifest import (
    DatasetInfo,
    EvaluatorInfo,
    LinkInfo,
    Manifest,
    RunStatus,
)
from patronus_tasks.record.manifest_file import ManifestFile
from patronus_tasks.record.recorder import Recorder
from patronus_tasks.results.gates import error_gate, failed_gates, failed_metric_gates
from patronus_tasks.results.metrics import evaluate_metrics
from patronus_tasks.results.summary import Summary
from patronus_tasks.results.usage import USAGE_COLUMNS, total_cost, usage_totals
from patronus_tasks.run import observers
from patronus_tasks.run.background import say
from patronus_tasks.run.loop import Backend, RecordStream, Rows, RunTotals
from patronus_tasks.run.options import stricter
from patronus_tasks.run.spec import ExperimentSpec

if TYPE_CHECKING:
    from patronus_tasks.results.experiment import Experiment

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
        repeats=spec.repeats, worker_pids=tally.pids or None, pid=os.getpid(),
        host=socket.gethostname(),
        dataset=DatasetInfo(source=spec.dataset.source, rows=len(spec.dataset),
                            sha256=spec.dataset.content_hash()),
        links=[LinkInfo(task=lk.task.name if lk.task else None,
                        evaluators=[EvaluatorInfo(name=e.name, criteria=e.criteria, weight=e.weight,
                                                  scale=e.scale) for e in lk.evaluators])
               for lk in spec.links],
        metadata=spec.metadata,
        package_version=__version__, git_commit=_git_commit(), python=sys.version.split()[0])


async def execute(spec: ExperimentSpec, backend: Backend, flow_run_id: str | None = None,
                  tally: RunTotals | None = None,
                  manifest_file: ManifestFile | None = None) -> tuple[Manifest, int]:
    """Run every row where ``backend`` says, stream records to Parquet, write the manifest.

    Returns the manifest and the number of step calls made. This is the whole
    experiment minus orchestration: the Prefect flow is a thin wrapper around it.
    """
    started = dt.datetime.now(dt.UTC)
    replay = (_resume.load_replay(spec.out_dir, spec.replay == "retry") if spec.replay
              else None)
    if replay is not None:
        say(_resuming(spec, replay))
    tally = tally or RunTotals()
    stream = _stream(spec, tally)
    manifest_file = manifest_file or ManifestFile(spec.out_dir)
    manifest_file.write(_manifest(spec, tally, "running", started, flow_run_id))
    for recorder in stream.recorders:
        await recorder.start(spec)
    try:
        await _reuse(replay, stream)
        await backend.run(Rows(spec, replay), stream)
    except BaseException as exc:
        # Interrupted: keep every completed row as a part, and say so.
        for recorder in stream.recorders:
            recorder.cancel()
        manifest_file.write(_manifest(spec, tally, "interrupted", started, flow_run_id))
        say(_stopped(spec, tally, exc))
        raise
    manifest = _manifest(spec, tally, "completed", started, flow_run_id)
    await stream.sink.finish(manifest)
    _resume.finish(spec.out_dir)
    manifest = _with_figures(spec, manifest, tally)
    manifest_file.write(manifest)
    if spec.reporters:  # after the results are written: they never wait for a reporter
        manifest = manifest.model_copy(update={"reports": await _finish_reports(spec, manifest)})
        manifest_file.write(manifest)
    return manifest, tally.calls


def _stream(spec: ExperimentSpec, tally: RunTotals) -> RecordStream:
    """The run's recorders: the totals, the results, and who watches the rows end (the
    progress and observers, when any; the reporters)."""
    order = _parquet.RowOrder([str(s) for s in spec.dataset.df["sid"]], spec.chain_order())
    columns = _parquet.dataset_schema(spec.dataset.df, spec.dataset.declared)
    sink = _parquet.ParquetSink(spec.out_dir, columns=columns, order=order)
    progress = observers.Progress(spec, tally, spec.on_progress, spec.runs)
    watchers: list[Recorder] = [progress] if progress.wanted else []
    return RecordStream(tally, sink, [*watchers, *spec.reporters])


def _stopped(spec: ExperimentSpec, tally: RunTotals, exc: BaseException) -> str:
    """Where the rows done are, and, for an interrupt, how to go on (an error first
    wants its fix: a resume would meet it again)."""
    kept = f"after {tally.rows} of {spec.runs} rows; those are kept in {spec.out_dir}."
    if not isinstance(exc, Exception):  # Ctrl-C, SIGTERM, a cancelled flow run
        return (f"interrupted {kept} Go on with resume=True (patronus-tasks run ... --resume) "
                f"and experiment_name={spec.experiment_name!r}: only the rest run.")
    return f"stopped by {type(exc).__name__} {kept}"


def _resuming(spec: ExperimentSpec, replay: _resume.Replay) -> str:
    """What a resume found: the rows it reuses, the rows it runs (a silent resume that
    found nothing re-ran, and paid for, every row)."""
    reused = sum(1 for _ in replay.reused_records())
    what = "retrying the rows that failed in" if spec.replay == "retry" else "resuming"
    return (f"{what} {spec.out_dir}: {reused} of {spec.runs} rows reused, "
            f"{spec.runs - reused} to run")


async def _reuse(replay: _resume.Replay | None, stream: RecordStream) -> None:
    """The rows an earlier run completed, as they were: no call at all."""
    for records in replay.reused_records() if replay is not None else ():
        pending = stream.add(records)
        if pending is not None:
            await pending


def _with_figures(spec: ExperimentSpec, manifest: Manifest, tally: RunTotals) -> Manifest:
    """The manifest with what the results file says of the whole run: calls, tokens and
    cost per step and model, the dataset-level metrics (user code: each one's failure is
    its own value's error, never the run's)."""
    usage = usage_totals(_parquet.read_frame(
        spec.out_dir, ["sid", "repeat", "link_index", "task_name", "evaluator_name",
                       *USAGE_COLUMNS]))
    update: dict[str, Any] = {"usage": usage or None, "cost_usd": total_cost(usage),
                              "calls": tally.calls - tally.cached, "cached_calls": tally.cached}
    if spec.metrics:
        df = _parquet.read_frame(spec.out_dir)
        update["metrics"] = evaluate_metrics(spec.metrics, df)
    return manifest.model_copy(update=update)


async def _finish_reports(spec: ExperimentSpec, manifest: Manifest) -> dict[str, Any]:
    """Each reporter's outcome, for the manifest."""
    return {reporter.name: await reporter.finish(manifest) for reporter in spec.reporters}


def gate_failures(spec: ExperimentSpec, experiment: Experiment,
                  summary: Summary | None = None) -> list[str]:
    """What the experiment's gates (``fail_on_error``, ``min_pass_rates``, ``min_metrics``)
    say is wrong.

    ``summary``: the experiment's, when already computed (saves reading the results again).
    """
    m = experiment.manifest
    failures = error_gate(m.errored_rows, m.rows, spec.fail_on_error)
    if spec.min_pass_rates or spec.min_metrics or spec.given_min_metrics:
        summary = summary or experiment.summary()
        failures += failed_gates(summary, spec.min_pass_rates)
        failures += failed_metric_gates(summary, _metric_gates(spec, summary))
    return failures


def _metric_gates(spec: ExperimentSpec, summary: Summary) -> dict[str, float]:
    """The experiment's own metric gates, and a runner's for the metrics it computed (the
    stricter of two on one metric)."""
    return stricter(spec.min_metrics, spec.given_min_metrics, {m.name for m in summary.metrics})


class Keeper(Protocol):
    """What keeps an experiment besides its files, and says its verdict: nothing more
    (``"local"``), the recorder process's flow run (``"prefect"``), or a flow run of
    Prefect's engine (rows on a task runner). It gives the rows' `Backend` and what
    `execute` writes to, the `Experiment` handed back, and publishes the verdict."""

    @property
    def backend(self) -> Backend: ...

    @property
    def flow_run_id(self) -> str | None: ...

    @property
    def tally(self) -> RunTotals | None: ...

    @property
    def manifest_file(self) -> ManifestFile | None: ...

    def interrupted(self, exc: BaseException) -> None: ...

    def experiment(self) -> Experiment: ...

    async def verdict(self, failures: list[str], calls: int) -> list[str]: ...


async def run_kept(spec: ExperimentSpec, keeper: Keeper) -> Experiment:
    """An experiment's whole run, top to bottom: its rows where the keeper's backend runs
    them, the gates on the written results, the verdict the keeper publishes (with a
    comparison on Prefect), then the experiment, or `QualityGateError` when a gate failed."""
    try:
        _, calls = await execute(spec, keeper.backend, keeper.flow_run_id, keeper.tally,
                                 keeper.manifest_file)
    except BaseException as exc:
        keeper.interrupted(exc)
        raise
    experiment = keeper.experiment()
    failures = await keeper.verdict(gate_failures(spec, experiment), calls)
    if failures:
        raise QualityGateError(failures, experiment)
    return experiment
