"""An experiment's options, declared once.

`run_experiment`, `arun_experiment`, `Client.experiment` and `make_spec` all take them as
``**options: Unpack[...]``: the types live in the TypedDicts here, the defaults in
`DEFAULTS`, and an unknown name is a `ConfigError` listing the known ones (a typo must
not be silently ignored by a ``**kwargs``).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, TypedDict, Union

from patronus_tasks.define.chain import ChainLink
from patronus_tasks.define.dataset import DataInput
from patronus_tasks.define.metrics import Metric
from patronus_tasks.define.prices import PriceInput
from patronus_tasks.define.steps import Evaluator, Task
from patronus_tasks.exceptions import ConfigError
from patronus_tasks.record.cache import Cache
from patronus_tasks.record.location import Location
from patronus_tasks.run.observers import Reporter

if TYPE_CHECKING:  # Prefect is imported only where rows run on it
    from prefect.task_runners import TaskRunner

#: Where rows run: in this process recorded on Prefect, in this process with no Prefect,
#: in batches on Dask; or any Prefect ``TaskRunner`` instance.
BackendOption: TypeAlias = Union[Literal["prefect", "local", "dask"], "TaskRunner[Any]"]
#: What batches of rows go through: Dask, or a Prefect ``TaskRunner``.
TaskRunnerOption: TypeAlias = Union[Literal["dask"], "TaskRunner[Any]"]
#: The cache of step calls: None (steps with cache=True only), True (every step but
#: cache=False ones), False (none), a folder or URL for its store, or a `Cache(...)`.
CacheOption: TypeAlias = Union[bool, str, "os.PathLike[str]", Location, Cache, None]


class ExperimentOptions(TypedDict, total=False):
    """What to run and how (everything but the project and the data)."""

    task: Task | None
    evaluators: Sequence[Evaluator] | Evaluator | None
    chain: Sequence[ChainLink] | ChainLink | None
    tags: Mapping[str, str] | None
    experiment_name: str | None
    max_concurrency: int
    results_dir: str | Path | None
    backend: BackendOption
    resume: bool
    retry_errors: bool
    experiment_id: str | None
    fail_on_error: int | float | None
    min_pass_rates: Mapping[str, float] | None
    dask_address: str | None
    on_progress: Callable[[int, int], None] | None  # called with (rows done, rows in all)
    # The runs compared with each other and sharing Prefect artifact keys; None: the
    # deployment (or flow) the experiment runs in, and its project.
    series: str | None
    # Fail when the series' previous run did better: True or "significant" (p < 0.05), or
    # "worse" (the pass rate or mean score fell by regression_threshold, or more rows got
    # worse than better); see results.verdict.
    fail_on_regression: bool | str
    # The fall in pass rate (or mean score) called "worse": a number (0.05: 5 points), or
    # {evaluator: number, "*": the rest}.
    regression_threshold: float | Mapping[str, float] | None
    # The run to judge this one against besides the previous one (a name, folder or path:
    # `load_experiment`); None: the series' accepted baseline (its first run until one is).
    baseline: str | Path | None
    dataset: DataInput | None  # the Patronus SDK's name of ``data=``
    reporters: Sequence[Reporter] | None  # results sent elsewhere too
    # Which calls become Prefect task runs: "all" (and the spans inside them), "calls" (no
    # spans), or "failures" (errors and verdicts that did not pass; the rest counted in the
    # figures): coarser levels for a server that limits the rate.
    record: str
    # Write report.html (charts, figures, every record) beside the results, after them.
    html_report: bool
    repeats: int  # run every row this many times (pass@k, pass^k, flipping rows)
    cache: CacheOption  # see `CacheOption`
    prices: Mapping[str, PriceInput] | None  # {model: (input, output) USD per million tokens}
    # Dataset-level evaluators (`patronus_tasks.metrics`): `@metric`s or plain functions.
    metrics: Sequence[Metric | Callable[..., object]] | Metric | None
    min_metrics: Mapping[str, float] | None  # gates: {metric value name: minimum}
    metadata: Mapping[str, Any] | None  # the experiment's own facts (JSON), in its manifest


class RunOptions(ExperimentOptions, total=False):
    """`ExperimentOptions` and what a caller wants back."""

    print_summary: bool
    display_hist: bool  # score histograms in the printed summary


DEFAULTS: dict[str, Any] = {
    "task": None, "evaluators": None, "chain": None, "tags": None, "experiment_name": None,
    "max_concurrency": 10, "results_dir": None, "backend": "prefect", "resume": False,
    "retry_errors": False, "experiment_id": None, "fail_on_error": None,
    "min_pass_rates": None, "dask_address": None, "on_progress": None, "series": None,
    "fail_on_regression": False, "dataset": None, "reporters": None, "record": "all",
    "html_report": True, "repeats": 1, "cache": None, "prices": None, "metrics": None,
    "min_metrics": None, "regression_threshold": None, "metadata": None, "baseline": None,
}
RUN_DEFAULTS: dict[str, Any] = {**DEFAULTS, "print_summary": True, "display_hist": True}


def resolved(options: Mapping[str, Any], defaults: Mapping[str, Any] = DEFAULTS) -> dict[str, Any]:
    """``options`` over ``defaults``; an unknown name is a `ConfigError` naming the fix."""
    for name in options:
        if name not in defaults:
            near = difflib.get_close_matches(name, list(defaults), n=1)
            hint = f" Did you mean {near[0]!r}?" if near else ""
            raise ConfigError(f"unknown experiment option {name!r}.{hint} Known options: "
                              f"{', '.join(sorted(defaults))}.")
    return {**defaults, **options}


#: What a runner (``patronus-tasks run``) asks of every experiment started in its block
#: (`giving`): ``resume`` and ``retry_errors`` (for an experiment not given them itself),
#: and gates besides each experiment's own: ``min_pass_rates`` for the evaluators it has,
#: ``min_metrics`` for the metrics it computes (known once computed: see
#: `ExperimentSpec.given_min_metrics`). Inside the experiment, a gate that fails fails its
#: flow run too, not only the command's exit code.
_GIVEN: ContextVar[dict[str, Any]] = ContextVar("patronus_tasks_given", default={})  # noqa: B039


@contextmanager
def giving(**options: Any) -> Iterator[None]:
    """Let every experiment started while the block runs take ``options`` (see `_GIVEN`)."""
    token = _GIVEN.set({**_GIVEN.get(), **options})
    try:
        yield
    finally:
        _GIVEN.reset(token)


def given_flags(options: Mapping[str, Any]) -> dict[str, bool]:
    """The runner's ``resume``/``retry_errors`` for an experiment whose own ``options`` do
    not say (an explicit ``resume=False`` stays: a baseline started fresh on purpose)."""
    given = _GIVEN.get()
    return {f: True for f in ("resume", "retry_errors") if given.get(f) and f not in options}


def stricter(own: Mapping[str, float] | None, given: Mapping[str, float],
             names: set[str]) -> dict[str, float]:
    """``own`` gates with the ``given`` ones that name one of ``names``; of two gates on
    one name the stricter holds (a command never loosens a flow's gate)."""
    merged = dict(own or {})
    for name, minimum in given.items():
        if name in names:
            merged[name] = max(minimum, merged.get(name, minimum))
    return merged


def given_gates(own: Mapping[str, float] | None, evaluators: set[str]) -> dict[str, float]:
    """The experiment's ``min_pass_rates`` with the runner's for its ``evaluators``."""
    return stricter(own, _GIVEN.get().get("min_pass_rates") or {}, evaluators)


def given_metric_gates() -> dict[str, float]:
    """The runner's ``min_metrics``, each a gate where the experiment computes it."""
    return dict(_GIVEN.get().get("min_metrics") or {})


def split_run(options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, bool]]:
    """The experiment's options, and what the caller wants back (``print_summary``,
    ``display_hist``), checked."""
    full = resolved(options, RUN_DEFAULTS)
    wanted = {name: bool(full.pop(name)) for name in set(RUN_DEFAULTS) - set(DEFAULTS)}
    return {k: v for k, v in full.items() if k in options}, wanted


def pick_data(data: DataInput | None, dataset: DataInput | None) -> DataInput:
    """``data=``, or ``dataset=`` (the Patronus SDK's name for it): exactly one of them."""
    if data is not None and dataset is not None:
        raise ConfigError("pass data= or dataset= (its older name), not both.")
    if data is None and dataset is None:
        raise ConfigError("an experiment needs data=: a list of dicts, a DataFrame, a Dataset, "
                          "a file path or a remote dataset (dataset= is accepted too).")
    return data if data is not None else dataset
