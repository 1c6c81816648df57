"""Experiments: setting one up, running it (on Prefect or locally), and its results."""

from __future__ import annotations

import asyncio
import contextvars
import datetime as dt
import json
import subprocess
import sys
import uuid
from collections.abc import Callable, Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import pandas as pd

from . import _parquet
from ._chain import Link, build_chain
from ._dataset import DataInput, Dataset, load_dataset
from ._exceptions import ConfigError
from ._params import ROW_FIELDS
from ._records import STATUS_ERROR
from ._runner import LocalStepRunner, RowRunner, StepRunner, run_rows
from ._settings import default_results_dir
from ._steps import Evaluator, Task
from ._summary import Summary, summarize

T = TypeVar("T")
Orchestrator = Literal["prefect", "local"]
Mode = Literal["engine", "fast"]


@dataclass
class ExperimentSpec:
    """Everything needed to run one experiment, checked before any call is made."""

    project_name: str
    experiment_name: str
    dataset: Dataset
    links: tuple[Link, ...]
    tags: dict[str, str]
    max_concurrency: int
    out_dir: Path
    mode: Mode = "engine"
    experiment_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def prefect_tags(self) -> list[str]:
        return [f"project:{self.project_name}", f"experiment:{self.experiment_name}",
                *(f"{k}:{v}" for k, v in self.tags.items())]

    def steps(self) -> list[Task | Evaluator]:
        """Every task and evaluator of the chain, each once."""
        found: dict[int, Task | Evaluator] = {}
        for link in self.links:
            for step in ([link.task] if link.task else []) + list(link.evaluators):
                found.setdefault(id(step), step)
        return list(found.values())

    def chain_order(self) -> list[tuple[int, str]]:
        return [(i, ev.name) for i, link in enumerate(self.links) for ev in link.evaluators]


def _check_columns(links: Sequence[Link], dataset: Dataset) -> None:
    """Fail before any call when a step needs a column the dataset does not have."""
    columns = set(dataset.columns)
    for idx, link in enumerate(links):
        for step in ([link.task] if link.task else []) + list(link.evaluators):
            needed = sorted(n for n in step.signature.required if n in ROW_FIELDS)
            if isinstance(step, Evaluator) and any(lk.task for lk in links[: idx + 1]):
                needed = [n for n in needed if n != "evaluated_model_output"]
            missing = [n for n in needed if n not in columns]
            if missing:
                raise ConfigError(
                    f"{step.kind} {step.name!r} (chain link {idx}) needs column {missing[0]!r}, "
                    f"which {dataset.source or 'the dataset'} lacks. Columns: "
                    f"{', '.join(sorted(columns))}. Add the column, map one onto it "
                    f"({missing[0]}_field= in read_csv/read_jsonl), or give the parameter a default."
                )


def _check_tags(tags: Mapping[str, Any] | None) -> dict[str, str]:
    tags = dict(tags or {})
    bad = [k for k, v in tags.items() if not isinstance(k, str) or not isinstance(v, str)]
    if bad:
        raise ConfigError(f"tags must map str to str; fix the values of {bad} (use str()).")
    return tags


def _free_dir(results_dir: Path, project: str, name: str) -> Path:
    """The experiment's folder; a finished run of the same name keeps its own."""
    base = _parquet.experiment_dir(results_dir, project, name)
    path, n = base, 1
    while (path / _parquet.RESULTS_FILE).exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def make_spec(project_name: str, *, data: DataInput, task: Task | None = None,
              evaluators: Sequence[Evaluator] | None = None,
              chain: Sequence[Mapping[str, Any]] | None = None,
              tags: Mapping[str, str] | None = None, experiment_name: str | None = None,
              max_concurrency: int = 10, results_dir: str | Path | None = None,
              mode: Mode = "engine") -> ExperimentSpec:
    """Check every argument and build the `ExperimentSpec`; raise `ConfigError` on mistakes."""
    if not project_name or not isinstance(project_name, str):
        raise ConfigError("project_name must be a non-empty string.")
    if mode not in ("engine", "fast"):
        raise ConfigError(f"mode must be 'engine' or 'fast', not {mode!r}.")
    if not isinstance(max_concurrency, int) or max_concurrency < 1:
        raise ConfigError(f"max_concurrency must be a whole number >= 1, not {max_concurrency!r}.")
    links = build_chain(task, evaluators, chain)
    dataset = load_dataset(data)
    _check_columns(links, dataset)
    name = experiment_name or dt.datetime.now().strftime("exp-%Y%m%d-%H%M%S")
    root = Path(results_dir) if results_dir is not None else default_results_dir()
    return ExperimentSpec(project_name, name, dataset, links, _check_tags(tags),
                          max_concurrency, _free_dir(root, project_name, name), mode)


#: Called as ``listener(spec, rows_done)`` after each row; the command line's progress bar.
progress_listeners: list[Callable[[ExperimentSpec, int], None]] = []
#: Called with each finished `Experiment` of this process; how the command line finds them.
finished_listeners: list[Callable[[Experiment], None]] = []


class _Tally:
    """Counts rows and records as they stream past, for the manifest and progress."""

    def __init__(self) -> None:
        self.rows = self.records = self.task_errors = self.evaluator_errors = 0

    def add(self, records: list[dict[str, Any]]) -> None:
        self.rows += 1
        self.records += len(records)
        for r in records:
            if r.get("status") == STATUS_ERROR:
                if r.get("error_stage") == "evaluator":
                    self.evaluator_errors += 1
                else:
                    self.task_errors += 1


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
        "evaluator_errors": tally.evaluator_errors,
        "dataset": {"source": spec.dataset.source, "rows": len(spec.dataset),
                    "sha256": spec.dataset.content_hash()},
        "links": [{"task": lk.task.name if lk.task else None,
                   "evaluators": [{"name": e.name, "criteria": e.criteria} for e in lk.evaluators]}
                  for lk in spec.links],
        "package_version": __version__, "git_commit": _git_commit(),
        "python": sys.version.split()[0],
    }


def _write_manifest(spec: ExperimentSpec, manifest: dict[str, Any]) -> None:
    path = spec.out_dir / _parquet.MANIFEST_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=2, default=str))
    tmp.replace(path)


async def execute(spec: ExperimentSpec, runner: StepRunner, flow_run_id: str | None = None,
                  tally: _Tally | None = None) -> tuple[dict[str, Any], int]:
    """Run every row, stream records to Parquet, write the manifest.

    Returns the manifest and the number of step calls made. This is the whole
    experiment minus orchestration: the Prefect flow is a thin wrapper around it.
    """
    started = dt.datetime.now(dt.UTC)
    sink = _parquet.ParquetSink(spec.out_dir, spec.dataset.df)
    tally = tally or _Tally()
    _write_manifest(spec, _manifest(spec, tally, "running", started, flow_run_id))

    def on_records(records: list[dict[str, Any]]) -> None:
        tally.add(records)
        sink.add(records)
        for listener in progress_listeners:
            listener(spec, tally.rows)

    with ThreadPoolExecutor(max_workers=spec.max_concurrency) as pool:
        row_runner = RowRunner(spec.links, runner, tags=spec.tags,
                               limit=spec.max_concurrency, pool=pool)
        try:
            await run_rows(spec.dataset.rows(), row_runner, spec.max_concurrency, on_records)
        except BaseException:
            # Interrupted: keep every completed row as a part, and say so.
            sink.flush()
            _write_manifest(spec, _manifest(spec, tally, "interrupted", started, flow_run_id))
            raise
    manifest = _manifest(spec, tally, "completed", started, flow_run_id)
    sink.finalize(manifest)
    _write_manifest(spec, manifest)
    return manifest, row_runner.calls


class Experiment:
    """A finished experiment: its folder, manifest and results.

    ``to_dataframe()`` reads the records back from Parquet: one row per (sample, chain
    link, evaluator), with the dataset's columns beside the results.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        manifest = self.path / _parquet.MANIFEST_FILE
        self.manifest: dict[str, Any] = json.loads(manifest.read_text()) if manifest.exists() else {}

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

    def to_dataframe(self) -> pd.DataFrame:
        return _parquet.read_results(self.path).to_pandas()

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
        records = self.to_dataframe() if df is None else df
        return summarize(records, order, location=str(self.results_path))

    def format_summary(self) -> str:
        return self.summary().format(f"Experiment {self.project}/{self.name}")


async def _run(spec: ExperimentSpec, orchestrator: Orchestrator) -> Experiment:
    if orchestrator == "local":
        await execute(spec, LocalStepRunner())
    else:
        from ._orchestrate import run_on_prefect

        await run_on_prefect(spec)
    return Experiment(spec.out_dir)


async def arun_experiment(project_name: str, *, data: DataInput, task: Task | None = None,
                          evaluators: Sequence[Evaluator] | None = None,
                          chain: Sequence[Mapping[str, Any]] | None = None,
                          tags: Mapping[str, str] | None = None,
                          experiment_name: str | None = None, max_concurrency: int = 10,
                          results_dir: str | Path | None = None,
                          orchestrator: Orchestrator = "prefect", mode: Mode = "engine",
                          print_summary: bool = True) -> Experiment:
    """Run an experiment (async form of `run_experiment`)."""
    if orchestrator not in ("prefect", "local"):
        raise ConfigError(f"orchestrator must be 'prefect' or 'local', not {orchestrator!r}.")
    spec = make_spec(project_name, data=data, task=task, evaluators=evaluators, chain=chain,
                     tags=tags, experiment_name=experiment_name,
                     max_concurrency=max_concurrency, results_dir=results_dir, mode=mode)
    steps = spec.steps()
    try:
        for step in steps:  # look-ups and connections, before any row is run
            await step.setup()
        experiment = await _run(spec, orchestrator)
    finally:
        for step in steps:
            await step.aclose()
    for listener in finished_listeners:
        listener(experiment)
    if print_summary:
        print(experiment.format_summary())
    return experiment


def _run_sync(coro: Coroutine[Any, Any, T]) -> T:
    try:
        asyncio.get_running_loop()
        running = True
    except RuntimeError:
        running = False  # not inside the except block: user tracebacks must not chain to it
    if not running:
        return asyncio.run(coro)
    # Called from running async code (a notebook, an async flow): use a loop of our own.
    ctx = contextvars.copy_context()
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(ctx.run, asyncio.run, coro).result()


def run_experiment(project_name: str, *, data: DataInput, task: Task | None = None,
                   evaluators: Sequence[Evaluator] | None = None,
                   chain: Sequence[Mapping[str, Any]] | None = None,
                   tags: Mapping[str, str] | None = None, experiment_name: str | None = None,
                   max_concurrency: int = 10, results_dir: str | Path | None = None,
                   orchestrator: Orchestrator = "prefect", mode: Mode = "engine",
                   print_summary: bool = True) -> Experiment:
    """Run an experiment: every row through the task and evaluators (or the ``chain``).

    With ``orchestrator="prefect"`` (the default) the experiment is one Prefect flow run
    and every task and evaluator call its own task run, on ``PREFECT_API_URL`` or
    Prefect's built-in local server; ``"local"`` runs the same logic with no Prefect.
    ``mode="engine"`` runs each call through Prefect's task engine (Prefect's retries
    and timeouts); ``mode="fast"`` runs calls in plain asyncio with the same retries and
    timeouts and records each as its own task run through bulk events, at a fraction of
    the CPU: for large experiments.
    Results stream to ``<results_dir>/<project>/<experiment>/results.parquet``.
    """
    return _run_sync(arun_experiment(
        project_name, data=data, task=task, evaluators=evaluators, chain=chain, tags=tags,
        experiment_name=experiment_name, max_concurrency=max_concurrency,
        results_dir=results_dir, orchestrator=orchestrator, mode=mode,
        print_summary=print_summary))
