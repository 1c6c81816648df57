"""Experiments: setting one up, running it (on Prefect or locally), and its results."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import datetime as dt
import functools
import json
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd

from . import _parquet, _resume
from ._dataset import DataInput
from ._exceptions import QualityGateError
from ._gates import error_gate, failed_gates
from ._records import STATUS_ERROR
from ._runner import LocalStepRunner, RowRunner, StepRunner, run_rows
from ._spec import Backend, ExperimentSpec, make_spec
from ._steps import Evaluator, Task
from ._summary import SUMMARY_COLUMNS, Summary, summarize
from ._threads import DaemonThreadPool

T = TypeVar("T")


#: Called as ``listener(spec, rows_done)`` after each row; the command line's progress bar.
progress_listeners: list[Callable[[ExperimentSpec, int], None]] = []
#: Called with each finished `Experiment` of this process; how the command line finds them.
finished_listeners: list[Callable[[Experiment], None]] = []


class _Tally:
    """Counts rows and records as they stream past, for the manifest and progress."""

    def __init__(self) -> None:
        self.rows = self.records = self.task_errors = self.evaluator_errors = 0
        self.errored_rows = 0
        self.pids: list[int] = []  # worker processes, when rows ran on Dask

    def add(self, records: list[dict[str, Any]]) -> None:
        self.rows += 1
        self.records += len(records)
        if any(r.get("status") == STATUS_ERROR for r in records):
            self.errored_rows += 1
        for r in records:
            if r.get("status") == STATUS_ERROR:
                if r.get("error_stage") == "evaluator":
                    self.evaluator_errors += 1
                else:
                    self.task_errors += 1


@functools.lru_cache(maxsize=1)
def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _manifest(spec: ExperimentSpec, tally: _Tally, status: str, started: dt.datetime,
              flow_run_id: str | None) -> dict[str, Any]:
    from . import __version__

    ended = None if status == "running" else dt.datetime.now(dt.UTC).isoformat()
    return {
        "project": spec.project_name, "experiment_name": spec.experiment_name,
        "experiment_id": spec.experiment_id, "status": status, "tags": spec.tags,
        "flow_run_id": flow_run_id, "started_at": started.isoformat(), "ended_at": ended,
        "rows": tally.rows, "records": tally.records, "task_errors": tally.task_errors,
        "evaluator_errors": tally.evaluator_errors, "errored_rows": tally.errored_rows,
        "worker_pids": tally.pids or None,
        "dataset": {"source": spec.dataset.source, "rows": len(spec.dataset),
                    "sha256": spec.dataset.content_hash()},
        "links": [{"task": lk.task.name if lk.task else None,
                   "evaluators": [{"name": e.name, "criteria": e.criteria} for e in lk.evaluators]}
                  for lk in spec.links],
        "package_version": __version__, "git_commit": _git_commit(),
        "python": sys.version.split()[0],
    }


class ManifestFile:
    """The experiment's ``manifest.json``, rewritten whole (atomically) on every change.

    Written from the experiment's loop (its status) and from the background loop (how
    many task runs Prefect holds, while it catches up): one lock for both.
    """

    #: One lock for every manifest of the process: the recorder of an earlier run in the
    #: same folder (before a resume or a retry) may still be catching up.
    _lock = threading.Lock()

    def __init__(self, out_dir: Path) -> None:
        self.path = out_dir / _parquet.MANIFEST_FILE
        self.data: dict[str, Any] | None = None

    def write(self, data: dict[str, Any]) -> None:
        with self._lock:
            self.data = {**data, **({"prefect": self.data["prefect"]}
                                    if self.data and "prefect" in self.data else {})}
            self._save()

    def note_records(self, recorder: Any) -> None:
        """How many task runs Prefect holds (a `TaskRunRecorder`'s progress)."""
        with self._lock:
            if self.data is not None and self._still_ours():
                self.data["prefect"] = {"task_runs": recorder.expected,
                                        "task_runs_recorded": recorder.recorded,
                                        "task_runs_lost": recorder.lost,
                                        "complete": recorder.done and not recorder.lost}
                self._save()

    def _still_ours(self) -> bool:
        """Whether the file is still this run's: a later run in the same folder (resume,
        ``retry_errors``) owns it once it has written it."""
        try:
            on_disk = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return True
        assert self.data is not None
        return bool(on_disk.get("started_at") == self.data.get("started_at"))

    def _save(self) -> None:
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=2, default=str))
        tmp.replace(self.path)


async def execute(spec: ExperimentSpec, runner: StepRunner, flow_run_id: str | None = None,
                  tally: _Tally | None = None,
                  batches: Callable[[_Tally, _resume.Replay | None], Coroutine[Any, Any, int]]
                  | None = None,
                  manifest_file: ManifestFile | None = None) -> tuple[dict[str, Any], int]:
    """Run every row, stream records to Parquet, write the manifest.

    Returns the manifest and the number of step calls made. This is the whole
    experiment minus orchestration: the Prefect flow is a thin wrapper around it.
    ``batches`` runs the rows elsewhere instead (Dask workers writing their own parts).
    """
    started = dt.datetime.now(dt.UTC)
    replay = (_resume.load_replay(spec.out_dir, spec.replay == "retry") if spec.replay
              else None)
    sink = _parquet.ParquetSink(spec.out_dir, spec.dataset.df)
    tally = tally or _Tally()
    manifest_file = manifest_file or ManifestFile(spec.out_dir)
    manifest_file.write(_manifest(spec, tally, "running", started, flow_run_id))

    def on_records(records: list[dict[str, Any]]) -> None:
        tally.add(records)
        sink.add(records)
        for listener in progress_listeners:
            listener(spec, tally.rows)

    rows = spec.dataset.samples()
    if replay is not None:
        for records in replay.reused_records():  # completed before: no call at all
            on_records(records)
        rows = (row for row in rows if replay.wanted(row.sid))
    pool = DaemonThreadPool(spec.max_concurrency)
    row_runner = RowRunner(spec.links, runner, tags=spec.tags, limit=spec.max_concurrency,
                           pool=pool, replay=replay)
    try:
        if batches is not None:
            row_runner.calls = await batches(tally, replay)
        else:
            await run_rows(rows, row_runner, spec.max_concurrency, on_records)
    except BaseException:
        # Interrupted: keep every completed row as a part, and say so.
        sink.flush()
        manifest_file.write(_manifest(spec, tally, "interrupted", started, flow_run_id))
        raise
    finally:
        pool.shutdown(wait=False)  # a call stuck in user code must not hold the process
    manifest = _manifest(spec, tally, "completed", started, flow_run_id)
    sink.finalize(manifest)
    _resume.finish(spec.out_dir)
    manifest_file.write(manifest)
    return manifest, row_runner.calls


def gate_failures(spec: ExperimentSpec, experiment: Experiment,
                  summary: Summary | None = None) -> list[str]:
    """What the experiment's gates (``fail_on_error``, ``min_pass_rates``) say is wrong.

    ``summary``: the experiment's, when already computed (saves reading the results again).
    """
    m = experiment.manifest
    failures = error_gate(int(m.get("errored_rows", 0)), int(m.get("rows", 0)), spec.fail_on_error)
    if spec.min_pass_rates:
        failures += failed_gates(summary or experiment.summary(), spec.min_pass_rates)
    return failures


class Experiment:
    """A finished experiment: its folder, manifest and results.

    ``to_dataframe()`` reads the records back from Parquet: one row per (sample, chain
    link, evaluator), with the dataset's columns beside the results.
    """

    def __init__(self, path: str | Path, recording: Any = None) -> None:
        self.path = Path(path)
        manifest = self.path / _parquet.MANIFEST_FILE
        self.manifest: dict[str, Any] = json.loads(manifest.read_text()) if manifest.exists() else {}
        self._recording = recording  # a `TaskRunRecorder` still catching up, when run here

    def wait_recorded(self, timeout: float | None = None) -> bool:
        """Wait until Prefect has recorded every task run of this experiment (it returned
        with its results while Prefect caught up); True when it has (or nothing was due)."""
        recording = self._recording
        if recording is None:
            return True
        return bool(recording.wait(timeout)) and not recording.lost

    def __repr__(self) -> str:
        return f"Experiment({self.name!r}, path={str(self.path)!r})"

    @property
    def name(self) -> str:
        return str(self.manifest.get("experiment_name", self.path.name))

    @property
    def project(self) -> str:
        return str(self.manifest.get("project", self.path.parent.name))

    @property
    def results_path(self) -> Path:
        return self.path / _parquet.RESULTS_FILE

    def to_dataframe(self, columns: Sequence[str] | None = None) -> pd.DataFrame:
        """The records (``columns``: only these), as a DataFrame."""
        return _parquet.read_results(self.path, list(columns) if columns else None).to_pandas()

    def to_csv(self, path_or_buf: Any = None, **kwargs: Any) -> str | None:
        """Write (or return, with no path) the records as CSV."""
        return self.to_dataframe().to_csv(path_or_buf, index=False, **kwargs)

    def to_json(self, path_or_buf: Any = None, **kwargs: Any) -> str | None:
        """Write (or return, with no path) the records as JSON Lines."""
        kwargs = {"orient": "records", "lines": True, "force_ascii": False, **kwargs}
        return self.to_dataframe().to_json(path_or_buf, **kwargs)

    def summary(self, df: pd.DataFrame | None = None) -> Summary:
        """Per (link, evaluator) statistics of the records (``df``: already read records)."""
        order = [(i, e["name"]) for i, lk in enumerate(self.manifest.get("links", []))
                 for e in lk["evaluators"]]
        # Only what the summary reads: the dataset's columns can be most of the records.
        records = self.to_dataframe(SUMMARY_COLUMNS) if df is None else df
        return summarize(records, order, location=str(self.results_path))

    def format_summary(self) -> str:
        return self.summary().format(f"Experiment {self.project}/{self.name}")


async def _run(spec: ExperimentSpec) -> Experiment:
    if spec.backend != "local":
        from ._orchestrate import run_on_prefect

        return await run_on_prefect(spec)  # raises QualityGateError itself, from the flow run
    await execute(spec, LocalStepRunner())
    experiment = Experiment(spec.out_dir)
    failures = gate_failures(spec, experiment)
    if failures:
        raise QualityGateError(failures, experiment)
    return experiment


async def arun_experiment(project_name: str, *, data: DataInput, task: Task | None = None,
                          evaluators: Sequence[Evaluator] | Evaluator | None = None,
                          chain: Sequence[Mapping[str, Any]] | None = None,
                          tags: Mapping[str, str] | None = None,
                          experiment_name: str | None = None, max_concurrency: int = 10,
                          results_dir: str | Path | None = None, backend: Backend = "prefect",
                          resume: bool = False, retry_errors: bool = False,
                          experiment_id: str | None = None,
                          fail_on_error: int | float | None = None,
                          min_pass_rates: Mapping[str, float] | None = None,
                          dask_address: str | None = None,
                          print_summary: bool = True) -> Experiment:
    """Run an experiment (async form of `run_experiment`)."""
    spec = make_spec(project_name, data=data, task=task, evaluators=evaluators, chain=chain,
                     tags=tags, experiment_name=experiment_name,
                     max_concurrency=max_concurrency, results_dir=results_dir, backend=backend,
                     resume=resume, retry_errors=retry_errors, experiment_id=experiment_id,
                     fail_on_error=fail_on_error, min_pass_rates=min_pass_rates,
                     dask_address=dask_address)
    steps = spec.steps()
    try:
        for step in steps:  # look-ups and connections, before any row is run
            await step.setup()
        experiment = await _run(spec)
    except QualityGateError as exc:
        _finished(exc.experiment, print_summary)  # type: ignore[arg-type]
        raise
    finally:
        for step in steps:
            await step.aclose()
    _finished(experiment, print_summary)
    return experiment


def _finished(experiment: Experiment, print_summary: bool) -> None:
    for listener in finished_listeners:
        listener(experiment)
    if print_summary:
        print(experiment.format_summary())


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM interrupts like Ctrl-C, so completed rows are flushed and the run marked."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_sync(coro: Coroutine[Any, Any, T]) -> T:
    try:
        asyncio.get_running_loop()
        running = True
    except RuntimeError:
        running = False  # not inside the except block: user tracebacks must not chain to it
    if not running:
        with _sigterm_as_interrupt():
            return asyncio.run(coro)
    # Called from running async code (a notebook, an async flow): use a loop of our own.
    ctx = contextvars.copy_context()
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(ctx.run, asyncio.run, coro).result()


def run_experiment(project_name: str, *, data: DataInput, task: Task | None = None,
                   evaluators: Sequence[Evaluator] | Evaluator | None = None,
                   chain: Sequence[Mapping[str, Any]] | None = None,
                   tags: Mapping[str, str] | None = None, experiment_name: str | None = None,
                   max_concurrency: int = 10, results_dir: str | Path | None = None,
                   backend: Backend = "prefect", resume: bool = False, retry_errors: bool = False,
                   experiment_id: str | None = None, fail_on_error: int | float | None = None,
                   min_pass_rates: Mapping[str, float] | None = None,
                   dask_address: str | None = None, print_summary: bool = True) -> Experiment:
    """Run an experiment: every row through the task and evaluators (or the ``chain``).

    The experiment is one Prefect flow run and every task and evaluator call its own task
    run, on ``PREFECT_API_URL`` or Prefect's built-in local server. It returns as soon as
    the rows are done and the results written; the task-run records Prefect has not taken
    yet follow in the background (`Experiment.wait_recorded`; the process waits for them
    before it exits, and a call made inside a flow run waits before it returns).

    ``backend``: where rows run: ``"prefect"`` (this process, recorded on Prefect),
    ``"local"`` (this process, no Prefect), ``"dask"`` (batches on a Dask cluster: a local
    one of two processes, or the scheduler at ``dask_address``; needs ``prefect-dask`` and
    a server in ``PREFECT_API_URL``) or any Prefect ``TaskRunner``.

    ``resume=True`` goes on with the latest run of ``experiment_name`` (or the run whose
    ``experiment_id`` is given): rows completed there are reused, missing and failed ones
    run (steps that completed inside failed rows are replayed, not called again);
    ``retry_errors=True`` re-runs only the rows that failed. ``fail_on_error`` (a row
    count, or a fraction as a float) and ``min_pass_rates`` ({evaluator: rate}) are
    gates: when one fails, the results are still written, the flow run ends Failed and
    `QualityGateError` is raised.
    Results stream to ``<results_dir>/<project>/<experiment>/results.parquet``.
    """
    return _run_sync(arun_experiment(
        project_name, data=data, task=task, evaluators=evaluators, chain=chain, tags=tags,
        experiment_name=experiment_name, max_concurrency=max_concurrency,
        results_dir=results_dir, backend=backend, resume=resume, retry_errors=retry_errors,
        experiment_id=experiment_id, fail_on_error=fail_on_error,
        min_pass_rates=min_pass_rates, dask_address=dask_address, print_summary=print_summary))
