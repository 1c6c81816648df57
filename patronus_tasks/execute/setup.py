"""Setting an experiment up: every argument checked before any call is made, the backend
resolved (Prefect and prefect-dask looked for), an earlier run found to resume."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import multiprocessing
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

from typing_extensions import Unpack

from patronus_tasks.define.chain import Link, build_chain
from patronus_tasks.define.dataset import DataInput, Dataset, load_dataset
from patronus_tasks.define.metrics import check_metrics
from patronus_tasks.define.names import cleaned, safe_name
from patronus_tasks.define.params import ROW_FIELDS
from patronus_tasks.define.prices import PriceTable
from patronus_tasks.define.steps import Evaluator
from patronus_tasks.exceptions import ConfigError
from patronus_tasks.procs import alive
from patronus_tasks.record import otel as _otel
from patronus_tasks.record import parquet as _parquet
from patronus_tasks.record.cache import cache_setting
from patronus_tasks.record.location import Location
from patronus_tasks.record.manifest import Manifest
from patronus_tasks.record.manifest_file import read_manifest
from patronus_tasks.results.gates import check_fail_on_error, check_thresholds
from patronus_tasks.results.verdict import rule_of
from patronus_tasks.run.background import say
from patronus_tasks.run.modes import RECORD_MODES
from patronus_tasks.run.options import (
    BackendOption,
    ExperimentOptions,
    TaskRunnerOption,
    given_flags,
    given_gates,
    given_metric_gates,
    pick_data,
    resolved,
)
from patronus_tasks.run.spec import BACKENDS, BackendKind, ExperimentSpec, ReplayMode
from patronus_tasks.settings import default_results_dir

if TYPE_CHECKING:
    from prefect.task_runners import TaskRunner


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


def _check_metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The experiment's metadata, which its manifest keeps as JSON."""
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping):
        raise ConfigError(f"metadata must be a dict, not {type(metadata).__name__}.")
    try:
        return dict(json.loads(json.dumps(dict(metadata))))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"metadata must be JSON (str, numbers, lists, dicts): {exc}") from None


def _check_tags(tags: Mapping[str, Any] | None) -> dict[str, str]:
    tags = dict(tags or {})
    bad = [k for k, v in tags.items() if not isinstance(k, str) or not isinstance(v, str)]
    if bad:
        raise ConfigError(f"tags must map str to str; fix the values of {bad} (use str()).")
    return tags


#: A run's claim on its folder, made before anything else is written there: two runs of
#: one name started at once each get a folder of their own (their parts were numbered
#: alike in one folder, and the second run crashed). It holds the claiming process's id.
CLAIM_FILE = ".claimed"


def _free_dir(results_dir: Location, project: str, name: str) -> Location:
    """The experiment's folder: the first of ``name``, ``name-2``, ... that no run has
    used, claimed. A run that stopped halfway keeps its folder too (a new run written
    into it mixed the two runs' rows: `resume=True` goes on with it instead)."""
    base = _parquet.experiment_dir(results_dir, project, name)
    path, n = base, 1
    while _used(path) or not _claim(path):
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def _used(path: Location) -> bool:
    return (path / _parquet.MANIFEST_FILE).exists() or (path / _parquet.RESULTS_FILE).exists()


def _claim(path: Location) -> bool:
    """Claim a local folder: its claim file is made only where none is (one process of
    several wins), or where the one that made it is gone (on this host) before writing
    its manifest. On object storage, which has no such create, a folder with no manifest
    is taken."""
    if path.local is None:
        return True
    claim = path.local / CLAIM_FILE
    try:
        path.local.mkdir(parents=True, exist_ok=True)
        with claim.open("x") as out:
            out.write(_claimer())
        return True
    except FileExistsError:
        return _take_over(claim)
    except OSError:  # not writable: `make_writable` says so, naming results_dir=
        return True


def _claimer() -> str:
    """Who claims: this process on this host (a folder shared between hosts, on NFS, holds
    other hosts' claims, never taken over from here)."""
    return f"{os.getpid()}@{socket.gethostname()}"


def _take_over(claim: Path) -> bool:
    """Take a claim whose process is gone, renaming it away first: of several processes
    that saw it dead, one rename succeeds (a read and a write let two take it)."""
    if not claim.is_file():  # a file where the folder would be: the next name
        return False
    pid, _, host = claim.read_text().strip().partition("@")
    if not pid.isdigit() or host not in ("", socket.gethostname()) or alive(int(pid)):
        return False
    taken = claim.with_name(f"{CLAIM_FILE}.{os.getpid()}")
    try:
        os.rename(claim, taken)
        taken.unlink()
        with claim.open("x") as out:
            out.write(_claimer())
    except OSError:  # another process took it first
        return False
    return True


def release_claim(path: Location) -> None:
    """Give back this process's claim on a folder it wrote nothing to (its setup failed):
    a corrected retry gets the same folder, and a resume finds the runs after it."""
    if path.local is None or (path / _parquet.MANIFEST_FILE).exists():
        return
    claim = path.local / CLAIM_FILE
    with contextlib.suppress(OSError):
        if claim.read_text().strip() == _claimer():
            claim.unlink()
            path.local.rmdir()  # only when empty


def _series(base: Location) -> list[Location]:
    """The folders holding a run in ``base``, ``base-2``, ...: a folder claimed by a run
    still starting is no run, and no end of them either."""
    found: list[Location] = []
    path, n = base, 1
    while True:
        has_run = (path / _parquet.MANIFEST_FILE).exists()
        if not has_run and not (path.local is not None and path.local.is_dir()):
            return found
        found += [path] if has_run else []
        n += 1
        path = base.with_name(f"{base.name}-{n}")


def _runs_of(results_dir: Location, project: str, name: str) -> list[Location]:
    """Folders of earlier runs of this experiment, oldest first: those of its folder
    series (``name``, ``name-2``, ...; also the one named as before names were made
    unique, ``nightly_a`` for ``nightly a``) whose manifest names this very project and
    experiment. Another name's run there (``x-2`` is also a second run of ``x``; a
    ``nightly/a`` in ``nightly_a``) is another experiment: never resumed as this one."""
    runs = [(m.started_at, path) for base in _bases(results_dir, project, name)
            for path in _series(base)
            if _is_run_of(m := _manifest_of(path), project, name)]
    return [path for _, path in sorted(runs, key=lambda run: run[0])]


def _bases(results_dir: Location, project: str, name: str) -> list[Location]:
    """The experiment's folder, and the one it had before names were made unique."""
    return list(dict.fromkeys(_parquet.experiment_dir(results_dir, project, name, naming)
                              for naming in (safe_name, cleaned)))


def _is_run_of(manifest: Manifest, project: str, name: str) -> bool:
    return (manifest.project, manifest.experiment_name) == (project, name)


def _manifest_of(path: Location) -> Manifest:
    manifest = read_manifest(path)
    if manifest is None:  # its folder held one when it was found
        raise ConfigError(f"the manifest.json in {path} is gone; run it as a new experiment.")
    return manifest


def _to_resume(root: Location, project: str, name: str,
               experiment_id: str | None) -> Location | None:
    runs = _runs_of(root, project, name)
    if experiment_id is None:
        return runs[-1] if runs else None
    for path in runs:
        if _manifest_of(path).experiment_id == experiment_id:
            return path
    _refuse_another_names(root, project, name, experiment_id)
    raise ConfigError(f"no experiment with id {experiment_id!r} named {name!r} in project "
                      f"{project!r} under {root}; check the id (manifest.json) and the name.")


def _refuse_another_names(root: Location, project: str, name: str, experiment_id: str) -> None:
    """A `ConfigError` naming both when ``experiment_id`` is a run of another experiment
    of the project: resumed as ``name``, its rows would be taken for this one's."""
    for path in (f.parent for base in _bases(root, project, name)
                 for f in base.parent.glob(f"*/{_parquet.MANIFEST_FILE}")):
        other = None
        with contextlib.suppress(ConfigError):  # a damaged manifest is no match
            other = read_manifest(path)
        if other is not None and other.experiment_id == experiment_id:
            raise ConfigError(
                f"experiment_id {experiment_id!r} is a run of {other.project}/"
                f"{other.experiment_name!r} (in {path}), not of {project}/{name!r}: resumed "
                f"as {name!r} its rows would be taken for this experiment's. Give "
                f"experiment_name={other.experiment_name!r} to go on with it, or leave "
                f"experiment_id= out to run {name!r} on its own.")


def _resumed(spec: ExperimentSpec, path: Location, replay: ReplayMode) -> ExperimentSpec:
    manifest = _manifest_of(path)
    previous = manifest.dataset.sha256
    if previous and previous != spec.dataset.content_hash():
        raise ConfigError(
            f"the dataset changed since the run in {path} (content hash differs): resuming "
            "would mix results of different data. Run it as a new experiment instead.")
    if manifest.repeats != spec.repeats:
        raise ConfigError(
            f"the run in {path} ran every row {manifest.repeats} time(s), this one "
            f"asks for repeats={spec.repeats}: resuming would mix them. Resume with "
            f"repeats={manifest.repeats}, or run it as a new experiment.")
    spec.out_dir, spec.replay = path, replay
    spec.experiment_id = manifest.experiment_id or spec.experiment_id
    return spec


def _backend(backend: BackendOption, dask_address: str | None
             ) -> tuple[BackendKind, TaskRunner[Any] | None]:
    """``backend`` resolved once: its kind, and the task runner given (``"task_runner"``)."""
    if dask_address is not None and backend != "dask":
        raise ConfigError(f"dask_address= is for backend='dask', not {backend!r}: drop one of them.")
    if backend in ("prefect", "local"):
        return backend, None
    if backend == "dask" or _is_task_runner(backend):
        _check_batches(backend)
        return ("dask", None) if backend == "dask" else ("task_runner", backend)
    raise ConfigError(f"backend must be one of {', '.join(map(repr, BACKENDS))} or a Prefect "
                      f"TaskRunner, not {backend!r}.")


def _is_task_runner(value: object) -> TypeGuard[TaskRunner[Any]]:
    from prefect.task_runners import TaskRunner

    return isinstance(value, TaskRunner)


def _check_batches(backend: TaskRunnerOption) -> None:
    """Batches on other processes need prefect-dask (for "dask") and a server they reach."""
    is_dask = backend == "dask" or type(backend).__module__.startswith("prefect_dask")
    if backend == "dask":
        try:
            import prefect_dask  # noqa: F401
        except ImportError:
            raise ConfigError("backend='dask' needs prefect-dask: pip install "
                              "'patronus-tasks[dask]'") from None
    from prefect.settings import PREFECT_API_URL

    if is_dask and not PREFECT_API_URL.value():
        raise ConfigError(
            "rows on Dask workers report to a Prefect server they can reach: set "
            "PREFECT_API_URL (e.g. `patronus-tasks server up`, then `eval \"$(patronus-tasks "
            "server env)\"`: its URL and auth string); the built-in server is private to "
            "this process.")


def _check_not_a_worker_import() -> None:
    """No experiment starts while a new worker process imports the user's script again.

    Multiprocessing's ``spawn`` (Dask's `LocalCluster`, process pools) runs the parent's
    ``__main__`` once more in each worker, under the name ``__mp_main__``, before the
    worker does anything: there, a script's top-level experiment would be a second one,
    its model calls paid again. ``_inheriting`` is how multiprocessing itself tells that
    phase (its "bootstrapping phase" error)."""
    if not getattr(multiprocessing.current_process(), "_inheriting", False):
        return
    script = getattr(sys.modules.get("__mp_main__"), "__file__", None) or "your script"
    raise ConfigError(
        f"an experiment was started while a worker process imports {script} again: "
        "multiprocessing's spawn (Dask's LocalCluster, DaskTaskRunner() without an address, "
        "process pools) runs a script's top-level code once more in every worker, so it would "
        "run a second time, its model calls paid again. Start experiments under "
        "`if __name__ == \"__main__\":` in that script (see the README's Dask section); "
        "backend='dask' without a cluster of your own needs no guard.")


def _evaluator_names(links: tuple[Link, ...]) -> set[str]:
    return {e.name for link in links for e in link.evaluators}


def _not_a_project_name(given: object) -> str:
    if isinstance(given, str):
        return "project_name must be a non-empty string."
    return (f"project_name must be a non-empty string, not {type(given).__name__}: this "
            "run_experiment is the SDK 0.0.x form, run_experiment(project_name, data=..., "
            "task=..., evaluators=[...]); for the SDK 0.1.x form, run_experiment(dataset, "
            "task=..., evaluators=[...]), import it from patronus_tasks.experiments.")


def _pinned(baseline: str | Path | None, results_dir: str | Path | None) -> str | None:
    """The link to the results of the run ``baseline=`` names (checked before any row
    runs: a run judged against nothing would read "Unchanged")."""
    if baseline is None:
        return None
    from patronus_tasks.record.location import link_target
    from patronus_tasks.results.store import load_experiment

    try:
        found = load_experiment(baseline, results_dir)
    except ConfigError as exc:
        raise ConfigError(f"baseline={str(baseline)!r}: {exc}") from None
    return link_target(found.results_path)


def make_spec(project_name: str, *, data: DataInput | None = None,
              **options: Unpack[ExperimentOptions]) -> ExperimentSpec:
    """Check every argument and build the `ExperimentSpec`; raise `ConfigError` on mistakes."""
    _check_not_a_worker_import()
    if not project_name or not isinstance(project_name, str):
        raise ConfigError(_not_a_project_name(project_name))
    o = resolved(options)
    kind, task_runner = _backend(o["backend"], o["dask_address"])
    concurrency = o["max_concurrency"]
    if not isinstance(concurrency, int) or concurrency < 1:
        raise ConfigError(f"max_concurrency must be a whole number >= 1, not {concurrency!r}.")
    check_fail_on_error(o["fail_on_error"])
    repeats = o["repeats"]
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ConfigError(f"repeats must be a whole number >= 1 (runs of every row), not {repeats!r}.")
    metrics = check_metrics(o["metrics"])
    min_metrics = check_thresholds(o["min_metrics"], "min_metrics", rates=False)
    if min_metrics and not metrics:
        raise ConfigError("min_metrics= gates on dataset-level metrics: pass them as metrics=[...] "
                          "(see patronus_tasks.metrics).")
    if o["record"] not in RECORD_MODES:
        raise ConfigError(f"record must be one of {', '.join(map(repr, RECORD_MODES))}, not "
                          f"{o['record']!r}: 'all' makes every call a task run, 'failures' only "
                          "errors and verdicts that did not pass.")
    rule = rule_of(o["regression_threshold"], o["fail_on_regression"])
    if o["fail_on_regression"] and kind == "local":
        raise ConfigError("fail_on_regression compares with the previous run of the series, "
                          "which the Prefect server knows: use backend='prefect' (or Dask).")
    links = build_chain(o["task"], o["evaluators"], o["chain"])
    o.update(given_flags(options))  # a runner's (`options.giving`)
    dataset = load_dataset(pick_data(data, o["dataset"]))
    _check_columns(links, dataset)
    if (o["resume"] or o["retry_errors"]) and not o["experiment_name"] and not o["experiment_id"]:
        raise ConfigError(  # unnamed, each run is a new exp-<time>: nothing could be resumed
            f"{'retry_errors' if o['retry_errors'] else 'resume'}=True needs the run to go on "
            "with: give its experiment_name= (--experiment-name; patronus-tasks list shows "
            "them) or experiment_id=.")
    name = o["experiment_name"] or dt.datetime.now().strftime("exp-%Y%m%d-%H%M%S")
    root = Location.of(o["results_dir"] if o["results_dir"] is not None else default_results_dir())
    earlier = None
    if o["resume"] or o["retry_errors"] or o["experiment_id"]:
        earlier = _to_resume(root, project_name, name, o["experiment_id"])
        if earlier is None:  # said: a resume that quietly ran every row again paid for every call
            say(f"nothing to resume: no earlier run of {project_name}/{name} under {root}; "
                "every row runs (as a new experiment)")
    out_dir = earlier or _free_dir(root, project_name, name)
    try:
        spec = ExperimentSpec(project_name, name, dataset, links, _check_tags(o["tags"]),
                              concurrency, out_dir, kind,
                              fail_on_error=o["fail_on_error"],
                              min_pass_rates=given_gates(o["min_pass_rates"], _evaluator_names(links)),
                              task_runner=task_runner, dask_address=o["dask_address"],
                              on_progress=o["on_progress"], series=o["series"],
                              fail_on_regression=rule.fail_on is not None, rule=rule,
                              baseline=_pinned(o["baseline"], o["results_dir"]),
                              reporters=(*(o["reporters"] or ()), *_otel.reporters()), record=o["record"],
                              html_report=bool(o["html_report"]), repeats=repeats,
                              cache=cache_setting(o["cache"]), results_root=root,
                              prices=PriceTable(o["prices"]), metrics=metrics,
                              min_metrics=min_metrics, given_min_metrics=given_metric_gates(),
                              metadata=_check_metadata(o["metadata"]))
        if earlier is not None:
            spec = _resumed(spec, earlier, "retry" if o["retry_errors"] else "resume")
        _parquet.make_writable(spec.out_dir)
    except BaseException:  # nothing written: the folder goes back
        release_claim(out_dir)
        raise
    return spec
