"""``sweep(...)``: every variant of a grid (or a named list) over one dataset, together."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from patronus_tasks.define.dataset import DataInput, aload_data, load_dataset
from patronus_tasks.exceptions import ConfigError
from patronus_tasks.record.location import Location
from patronus_tasks.run import background as _background
from patronus_tasks.run.options import given_flags, pick_data, split_run
from patronus_tasks.settings import default_results_dir
from patronus_tasks.sweep.plan import Plan, make_plan
from patronus_tasks.sweep.result import Sweep
from patronus_tasks.sweep.run import Prepared, Variants, check_options, prepare
from patronus_tasks.sweep.store import SweepFile, VariantEntry, new_folder, sweep_folders

if TYPE_CHECKING:
    from patronus_tasks.sweep.on_prefect import SweepRun

logger = logging.getLogger("patronus_tasks")


def _series(project: str, sweep_name: str | None, given: str | None) -> str:
    """The sweep's series (its artifacts' keys); each variant's is ``<series>/<label>``,
    compared night after night with its own previous run."""
    return given or f"{project}/{sweep_name or 'sweep'}"


def _earlier(root: Location, project: str, name: str | None,
             resume: bool) -> tuple[SweepFile | None, Location | None]:
    if not resume:
        return None, None
    if not name:
        raise ConfigError("resume=True needs the sweep to go on with: give its sweep_name=.")
    folders = sweep_folders(root, project, name)
    if not folders:
        _background.say(f"nothing to resume: no earlier sweep {project}/{name} under {root}; "
                        "every variant runs")
        return None, None
    return SweepFile.read(folders[-1]), folders[-1]


def _file(project: str, name: str, plan: Plan, prepared: Prepared, sha: str,
          earlier: SweepFile | None) -> SweepFile:
    entries = []
    for cell in plan.cells:
        entry = VariantEntry(cell.label, dict(cell.variant.shown))
        if cell.label in prepared.kept and earlier is not None:
            entry = earlier.entry(cell.label)
        entries.append(entry)
    return SweepFile(project, name, plan.baseline, list(plan.keys), entries, dataset_sha256=sha)


def _parameters(file: SweepFile, plan: Plan, dataset_source: str | None,
                common: Mapping[str, Any]) -> dict[str, Any]:
    """What the sweep's flow run shows as its parameters."""
    grid = {k: list(dict.fromkeys(c.variant.shown.get(k, "") for c in plan.cells))
            for k in plan.keys}
    return {"project": file.project, "sweep_name": file.sweep_name,
            "dataset": dataset_source or "(in memory)", "dataset_sha256": file.dataset_sha256,
            "variants": plan.labels, "grid": grid or None, "baseline": plan.baseline,
            "max_concurrency": common.get("max_concurrency", 10)}


async def asweep(project_name: str, *, data: DataInput | None = None,
                 grid: Mapping[str, Any] | None = None,
                 variants: Mapping[str, Mapping[str, Any]] | None = None,
                 baseline: str | Mapping[str, Any] | None = None, sweep_name: str | None = None,
                 share_outputs: bool = True, **options: Any) -> Sweep:
    """Run a sweep (async form of `sweep`)."""
    plan = make_plan(grid, variants, baseline)
    common, wanted = split_run(options)
    check_options(common)
    # A runner's --resume (`options.giving`) goes on with a named sweep not told otherwise.
    resume = bool(common.pop("resume", False) or (sweep_name and given_flags(options).get("resume")))
    series = _series(project_name, sweep_name, common.pop("series", None))
    dataset = load_dataset(pick_data(await aload_data(data),
                                     await aload_data(common.pop("dataset", None))))
    name = sweep_name or dt.datetime.now().strftime("sweep-%Y%m%d-%H%M%S")
    root = Location.of(common.get("results_dir") or default_results_dir())
    earlier, earlier_folder = _earlier(root, project_name, sweep_name, resume)
    if earlier is not None and earlier.dataset_sha256 not in (None, dataset.content_hash()):
        raise ConfigError(f"the dataset changed since the sweep in {earlier_folder} (its content "
                          "hash differs): resuming would set variants of different data side by "
                          "side. Run it as a new sweep (resume=False).")
    prepared = prepare(project_name, plan, dataset, common, name, series, earlier, earlier_folder)
    file = _file(project_name, name, plan, prepared, dataset.content_hash(), earlier)
    file.series = series
    folder = earlier_folder or new_folder(root, project_name, name)
    file.write(folder)
    run = _sweep_run(project_name, name, series, folder, _parameters(
        file, plan, dataset.source, common)) if common.get("backend", "prefect") == "prefect" \
        else None
    return await _run(prepared, file, folder, run, common, wanted, share_outputs)


def _sweep_run(project: str, name: str, series: str, folder: Location,
               parameters: dict[str, Any]) -> SweepRun:
    from patronus_tasks.sweep.on_prefect import SweepRun

    return SweepRun(project, name, series, folder, parameters)


async def _run(prepared: Prepared, file: SweepFile, folder: Location, run: SweepRun | None,
               common: Mapping[str, Any], wanted: dict[str, bool], share: bool) -> Sweep:
    _background.stopped_by.clear()
    runner = Variants(prepared.specs, file, common.get("max_concurrency", 10), share, run)
    try:
        await runner.all()
    except BaseException as exc:
        file.status = "interrupted"
        file.write(folder)
        if run is not None:
            run.interrupted(f"{type(exc).__name__} {exc}".strip())
        raise
    file.status, file.ended_at = "completed", dt.datetime.now(dt.UTC).isoformat()
    file.write(folder)
    sweep = Sweep(folder, file, {**prepared.kept, **runner.experiments}, run)
    if wanted["print_summary"]:
        _background.console_print(sweep.format(), sys.stdout)
    from patronus_tasks.sweep.finish import finish_afterwards

    sweep.afterwards = finish_afterwards(sweep, run, bool(common.get("html_report", True)))
    if run is not None and run.inside_flow_run:  # that flow run must not end before the sweep's
        await asyncio.to_thread(sweep.wait_recorded)
    return sweep


def sweep(project_name: str, *, data: DataInput | None = None,
          grid: Mapping[str, Any] | None = None,
          variants: Mapping[str, Mapping[str, Any]] | None = None,
          baseline: str | Mapping[str, Any] | None = None, sweep_name: str | None = None,
          share_outputs: bool = True, **options: Any) -> Sweep:
    """Run every variant of ``grid`` (every combination of its values) or ``variants`` (a
    named list) over the same data, together, and set them side by side.

    ``grid={"model": ["gpt-4o-mini", "llama-3.1-8b"], "prompt": {"terse": P1, "polite":
    P2}}``: a list of values (labelled by themselves) or a dict of label -> value per key;
    ``variants={"name": {"model": ..., "evaluators": [...]}}``. A key that is one of
    `run_experiment`'s options (``task``, ``evaluators``, ``chain``, ``tags``, ``repeats``,
    ...) overrides the sweep's for that variant; any other key reaches the steps that ask
    for ``variant`` (a read-only mapping of the variant's values).

    Every variant is an experiment of its own, ``<sweep_name>/<label>`` (on Prefect a
    subflow run of the sweep's flow run, tagged ``sweep:<sweep_name>`` and
    ``variant:<label>``, with its own series). They run at once: ``max_concurrency``
    counts every call of every variant, their rows interleaved; a task that several
    variants run with the same inputs (variants differing only in their evaluators, or in
    ``variant`` keys the task never reads) is called once per row (``share_outputs``).
    ``baseline`` (a label, or ``{key: label}``; default the first variant) is what the
    others are compared with (`Sweep.matrix`). ``resume=True`` with the same
    ``sweep_name`` runs only the variants and rows not finished. A variant that fails does
    not stop the others (`Sweep.failed` says why). Every mistake is a `ConfigError`
    before any call. Takes `run_experiment`'s other options for every variant (not its
    ``baseline``, which here names the baseline variant: each variant's own series is
    judged against its own baseline, as `run_experiment` does by default).
    """
    from patronus_tasks.api import _run_sync

    split_run(options)  # a mistake is a ConfigError here, before any loop starts
    return _run_sync(asweep(project_name, data=data, grid=grid, variants=variants,
                            baseline=baseline, sweep_name=sweep_name, share_outputs=share_outputs,
                            **options))
