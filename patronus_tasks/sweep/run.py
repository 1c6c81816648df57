"""Running a sweep: every variant's experiment at once, in this process's event loop.

Each variant is an experiment of its own (``<sweep name>/<label>``: its folder, manifest,
results, report; on Prefect its flow run, a subflow of the sweep's), set up and checked
before any call. They run together: one limit on calls for all of them, task outputs
shared where their inputs are the same (`shared`). A variant that fails is said and kept
apart; the others go on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from patronus_tasks.define.dataset import Dataset
from patronus_tasks.define.steps import Step
from patronus_tasks.exceptions import ConfigError, QualityGateError
from patronus_tasks.execute.run import run_kept
from patronus_tasks.execute.setup import make_spec, release_claim
from patronus_tasks.record.location import Location
from patronus_tasks.record.parquet import MANIFEST_FILE
from patronus_tasks.results.experiment import Experiment
from patronus_tasks.run import observers
from patronus_tasks.run.loop import InProcess
from patronus_tasks.run.runner import LocalStepRunner
from patronus_tasks.run.spec import ExperimentSpec
from patronus_tasks.sweep.plan import Cell, Plan
from patronus_tasks.sweep.shared import SharedCalls, SweepSteps, shareable
from patronus_tasks.sweep.store import SweepFile, VariantEntry, variant_name

#: Options a sweep takes for itself, not for its variants.
NOT_FOR_SWEEPS = {
    "experiment_name": "a sweep names its variants' experiments <sweep_name>/<label>: give "
                       "sweep_name= instead",
    "experiment_id": "resume a sweep by its sweep_name= (resume=True)",
    "retry_errors": "resume=True goes on with a sweep's unfinished variants and rows",
    "dask_address": "a sweep runs its variants in this process",
}


def check_options(options: Mapping[str, Any]) -> None:
    """Options that mean nothing for a sweep, said with the fix."""
    for name, why in NOT_FOR_SWEEPS.items():
        if options.get(name) not in (None, False):
            raise ConfigError(f"sweep() takes no {name}=: {why}.")
    backend = options.get("backend", "prefect")
    if backend not in ("prefect", "local"):
        raise ConfigError(f"a sweep runs its variants together in this process: backend must be "
                          f"'prefect' or 'local', not {backend!r}.")


def _tags(common: Mapping[str, Any], cell: Cell, sweep_name: str) -> Any:
    own = cell.options.get("tags", common.get("tags")) or {}
    if not isinstance(own, Mapping):
        return own  # not a dict: make_spec says so
    return {**(common.get("tags") or {}), **own, "sweep": sweep_name, "variant": cell.label}


def variant_options(common: Mapping[str, Any], cell: Cell, sweep_name: str, series: str,
                    earlier: VariantEntry | None) -> dict[str, Any]:
    """The options of one variant's experiment: the sweep's, the variant's own over them,
    its name, tags (``sweep``, ``variant``), series and (resumed) the run it goes on with."""
    options = {**common, **cell.options}
    metadata = options.get("metadata")
    options.update(
        experiment_name=variant_name(sweep_name, cell.label), series=f"{series}/{cell.label}",
        tags=_tags(common, cell, sweep_name), resume=False,
        metadata={**(metadata if isinstance(metadata, Mapping) else {}),
                  "sweep": {"name": sweep_name, "variant": cell.label, **cell.variant.shown}})
    if earlier is not None and earlier.experiment_id is not None:
        options.update(resume=True, experiment_id=earlier.experiment_id)
    return options


def check_taken(cell: Cell, spec: ExperimentSpec) -> None:
    """A variant's parameter that no step can read (no step asks for ``variant``)."""
    if not cell.variant.values or any("variant" in s.signature.names for s in spec.steps()):
        return
    key = next(iter(cell.variant.values))
    raise ConfigError(
        f"grid key {key!r} reaches no step of variant {cell.label!r}: no task or evaluator "
        f"asks for `variant`, and {key!r} is not one of run_experiment's options. Add a "
        f"`variant` parameter to the step that uses it (def answer(evaluated_model_input, "
        f"variant): ... variant[{key!r}]), or drop the key.")


@dataclass
class Prepared:
    """The variants to run (their checked specs) and those a resume keeps as they are."""

    specs: dict[str, ExperimentSpec] = field(default_factory=dict)
    kept: dict[str, Experiment] = field(default_factory=dict)

    def release(self) -> None:
        for spec in self.specs.values():
            release_claim(spec.out_dir)


def prepare(project: str, plan: Plan, dataset: Dataset, common: Mapping[str, Any],
            sweep_name: str, series: str, earlier: SweepFile | None,
            earlier_folder: Location | None = None) -> Prepared:
    """Every variant's experiment set up and checked (its folder claimed), or none: a
    mistake in any is a `ConfigError` before any call. Resumed: a variant completed
    before is kept, the others go on with their run."""
    prepared = Prepared()
    try:
        for cell in plan.cells:
            entry = earlier.entry(cell.label) if earlier is not None and any(
                v.label == cell.label for v in earlier.variants) else None
            done = _completed(entry, earlier_folder)
            if done is not None:
                prepared.kept[cell.label] = done
                continue
            spec = make_spec(project, data=dataset,
                             **variant_options(common, cell, sweep_name, series, entry))
            spec.variant = cell.variant
            prepared.specs[cell.label] = spec
            check_taken(cell, spec)
    except BaseException:
        prepared.release()
        raise
    return prepared


def _completed(entry: VariantEntry | None, folder: Location | None) -> Experiment | None:
    """A resumed variant's experiment when it completed (nothing of it runs again)."""
    if entry is None or folder is None or entry.status != "completed" or not entry.experiment:
        return None
    return Experiment(folder.parent / entry.experiment)


class Setups:
    """Each step's ``setup`` once for every variant that runs it; ``aclose`` at the end."""

    def __init__(self) -> None:
        self.started: dict[int, asyncio.Task[None]] = {}
        self.steps: dict[int, Step] = {}

    async def of(self, spec: ExperimentSpec) -> None:
        for step in spec.steps():
            if id(step) not in self.started:
                self.steps[id(step)] = step
                self.started[id(step)] = asyncio.create_task(step.setup())
            await asyncio.shield(self.started[id(step)])

    async def close(self) -> None:
        for step in self.steps.values():
            await step.aclose()


def sharing(specs: Mapping[str, ExperimentSpec]) -> SharedCalls:
    """Which tasks several variants run with inputs that can be alike."""
    members: dict[int, int] = {}
    for spec in specs.values():
        for task in {id(lk.task): lk.task for lk in spec.links if lk.task and shareable(lk.task)}:
            members[task] = members.get(task, 0) + 1
    return SharedCalls(members)


class Variants:
    """The variants' experiments, run together: one limit, shared outputs; each one's
    outcome noted in the sweep's file (``entries``)."""

    def __init__(self, specs: Mapping[str, ExperimentSpec], file: SweepFile, limit: int,
                 share: bool, run: Any = None) -> None:
        self.specs, self.file, self.run = specs, file, run
        self.slots = asyncio.Semaphore(limit)
        self.shared = sharing(specs) if share else None
        self.setups = Setups()
        self.experiments: dict[str, Experiment] = {}

    async def all(self) -> None:
        try:
            async with asyncio.TaskGroup() as group:
                for label, spec in self.specs.items():
                    group.create_task(self.one(label, spec))
        finally:
            await self.setups.close()
            self.file.shared_calls += self.shared.shared if self.shared is not None else 0

    def _keeper(self, spec: ExperimentSpec) -> Any:
        from patronus_tasks.api import LocalKeeper

        keeper = self.run.keeper(spec) if self.run is not None else LocalKeeper(spec)
        inner = keeper.backend.steps if isinstance(keeper.backend, InProcess) else LocalStepRunner()
        steps = SweepSteps(inner, self.slots, self.shared, dict(spec.variant.values)
                           if spec.variant is not None else {})
        if isinstance(keeper.backend, InProcess):
            keeper.backend.steps = steps
        return keeper

    async def one(self, label: str, spec: ExperimentSpec) -> None:
        """One variant: its failure is its own (said in the sweep's file), never the sweep's."""
        entry = self.file.entry(label)
        entry.experiment, entry.experiment_id = spec.out_dir.name, spec.experiment_id
        try:
            await self.setups.of(spec)
            experiment = await run_kept(spec, self._keeper(spec))
        except QualityGateError as exc:
            experiment, entry.gate_failures = exc.experiment, list(exc.failures)  # type: ignore[assignment]
        except Exception as exc:
            entry.status, entry.error = "failed", f"{type(exc).__name__}: {exc}"
            release_claim(spec.out_dir)  # only when nothing was written there
            if not (spec.out_dir / MANIFEST_FILE).exists():  # a resume starts it afresh
                entry.experiment = entry.experiment_id = None
            return
        except BaseException:
            entry.status = "interrupted"
            raise
        entry.status = "completed"
        self.experiments[label] = experiment
        for observer in observers.current():
            if observer.on_finished is not None:
                observer.on_finished(experiment)
