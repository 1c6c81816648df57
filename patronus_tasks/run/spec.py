"""An experiment's set-up, checked (`execute.setup.make_spec` checks and builds it): what
the row loop and every backend read."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from patronus_tasks.define.chain import Link
from patronus_tasks.define.dataset import Dataset
from patronus_tasks.define.metrics import Metric
from patronus_tasks.define.names import run_tag
from patronus_tasks.define.prices import PriceTable
from patronus_tasks.define.steps import Evaluator, Task
from patronus_tasks.define.variant import Variant
from patronus_tasks.record.cache import Cache, CallCache, open_cache
from patronus_tasks.record.location import Location
from patronus_tasks.run.modes import RecordMode
from patronus_tasks.run.observers import Reporter

if TYPE_CHECKING:
    from prefect.task_runners import TaskRunner

    from patronus_tasks.results.verdict import Rule

ReplayMode = Literal["resume", "retry", None]
#: Where rows run: ``"prefect"`` (in this process, every call its own Prefect task run),
#: ``"local"`` (in this process, no Prefect), ``"dask"`` (batches on Dask workers), or
#: ``"task_runner"`` (batches through the Prefect ``TaskRunner`` given as ``backend=``).
BackendKind = Literal["prefect", "local", "dask", "task_runner"]
BACKENDS = ("prefect", "local", "dask")



@dataclass
class ExperimentSpec:
    """Everything needed to run one experiment, checked before any call is made."""

    project_name: str
    experiment_name: str
    dataset: Dataset
    links: tuple[Link, ...]
    tags: dict[str, str]
    max_concurrency: int
    out_dir: Location  # a local folder or an object-store prefix
    backend: BackendKind = "prefect"
    experiment_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    replay: ReplayMode = None  # "resume" or "retry": reuse what out_dir already holds
    fail_on_error: int | float | None = None
    min_pass_rates: dict[str, float] = field(default_factory=dict)
    task_runner: TaskRunner[Any] | None = None  # the Prefect TaskRunner of backend "task_runner"
    dask_address: str | None = None
    on_progress: Callable[[int, int], None] | None = None  # (rows done, rows in all)
    series: str | None = None  # see `ExperimentOptions.series`
    fail_on_regression: bool = False
    rule: Rule | None = None  # when a run is worse than the previous one (None: the default)
    baseline: str | None = None  # a run pinned to judge against: its results' link (URL)
    reporters: tuple[Reporter, ...] = ()  # the records sent elsewhere too
    record: RecordMode = "all"  # which calls become task runs
    html_report: bool = True  # report.html beside the results, written after them
    repeats: int = 1  # runs of every row
    cache: Cache | None = None  # the cache of step calls (None: none)
    results_root: Location | None = None  # the results directory (the cache's default home)
    prices: PriceTable = field(default_factory=PriceTable)
    metrics: tuple[Metric, ...] = ()  # dataset-level evaluators, run after the rows
    min_metrics: dict[str, float] = field(default_factory=dict)
    #: A runner's metric gates (`options.giving`): each applies if this experiment computes it.
    given_min_metrics: dict[str, float] = field(default_factory=dict)
    metadata: dict[str, Any] | None = None  # the experiment's own facts (JSON)
    variant: Variant | None = None  # a sweep's cell: what steps asking for ``variant`` get

    @property
    def runs(self) -> int:
        """Runs of rows in all: every row ``repeats`` times."""
        return len(self.dataset) * self.repeats

    def open_cache(self) -> CallCache | None:
        """The cache the rows use (each process, each Dask worker opens its own)."""
        root = self.results_root or self.out_dir.parent.parent
        return open_cache(self.cache, root)

    @property
    def prefect_tags(self) -> list[str]:
        run = run_tag(self.out_dir.name, self.experiment_name)
        return [f"project:{self.project_name}", f"experiment:{self.experiment_name}",
                *([run] if run else []), *(f"{k}:{v}" for k, v in self.tags.items())]

    def steps(self) -> list[Task | Evaluator]:
        """Every task and evaluator of the chain, each once."""
        found: dict[int, Task | Evaluator] = {}
        for link in self.links:
            for step in ([link.task] if link.task else []) + list(link.evaluators):
                found.setdefault(id(step), step)
        return list(found.values())

    def chain_order(self) -> list[tuple[int, str]]:
        return [(i, ev.name) for i, link in enumerate(self.links) for ev in link.evaluators]
