"""The Patronus SDK 0.1.x's `run_experiment` (``patronus.experiments.experiment``), on this
package's engine: the same row loop, recording, results and Prefect UI as every
experiment here; the SDK's tasks, evaluators, chains and datasets adapted onto it.

Where the SDK misbehaves, this does what its users would want (README, "Coming from the
Patronus SDK 0.1.x"): failed rows stay in the DataFrame with their error; ``task=``
beside ``chain=`` and a bare ``@evaluator`` function are errors that say the fix; a
summary of bare-number evaluators prints; weights also give a weighted score.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import warnings
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypedDict

import pandas as pd

from patronus_tasks.datasets.datasets import SDK_NAMES, Dataset, DatasetLoader, Row
from patronus_tasks.define import dataset as _dataset
from patronus_tasks.define import steps as _steps
from patronus_tasks.define.row import Row as EngineRow
from patronus_tasks.exceptions import ConfigError
from patronus_tasks.experiments.adapters import BaseEvaluatorAdapter, adapted, to_step, told_apart
from patronus_tasks.experiments.types import EvalParent, TaskResult, canonical_name, step_name
from patronus_tasks.record.records import FIXED_NAMES
from patronus_tasks.results.experiment import Experiment as Results
from patronus_tasks.results.weights import weighted_scores
from patronus_tasks.tracing import default_project, patronus_endpoint_of_init

Tags = dict[str, str]
TaskFn = Callable[..., Any]


class ChainLink(TypedDict, total=False):
    """One link of ``chain=``: a task (or None) and the evaluators of its result."""

    task: TaskFn | None
    evaluators: Sequence[Any]


#: The SDK's connection and tracing options: accepted, unused offline (the Patronus API
#: is configured by `patronus_tasks.init` or PATRONUS_API_KEY / PATRONUS_API_URL).
_SDK_ONLY = ("service", "api_key", "api_url", "otel_endpoint", "otel_exporter_otlp_protocol",
             "ui_url", "timeout_s", "integrations", "verify_ssl")


def run_experiment(dataset: Any = None, task: TaskFn | None = None, evaluators: Sequence[Any] | None = None,
                   chain: Sequence[ChainLink] | None = None, tags: Tags | None = None,
                   max_concurrency: int = 10, project_name: str | None = None,
                   experiment_name: str | None = None, **kwargs: Any) -> Any:
    """Run an experiment as the SDK does, ``dataset`` first: a list of dicts, a DataFrame,
    a `Dataset`, a loader, a coroutine or a callable giving one. Outside an event loop it
    blocks and returns the `Experiment`; inside one it returns a task to ``await``.

    Options of this package go in ``kwargs`` too (``results_dir=``, ``backend=``,
    ``cache=``, ``metadata=``...); the SDK's connection options are accepted and unused.
    """
    if dataset is None:
        raise ConfigError(
            "run_experiment needs the dataset first: run_experiment(dataset, task=..., "
            "evaluators=[...])" + (" (data= is the SDK 0.0.x name; this is the 0.1.x form)"
                                   if "data" in kwargs else ""))
    run = _arun(dataset, task, evaluators, chain, tags, max_concurrency, project_name,
                experiment_name, kwargs)
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(run)
    return loop.create_task(run)


async def _arun(dataset: Any, task: TaskFn | None, evaluators: Sequence[Any] | None,
                chain: Sequence[ChainLink] | None, tags: Tags | None, max_concurrency: int,
                project_name: str | None, experiment_name: str | None,
                kwargs: dict[str, Any]) -> Experiment:
    made = await Experiment.create(dataset, task, evaluators, chain, tags, max_concurrency,
                                   project_name, experiment_name, **kwargs)
    return await made.run()


def _endpoint(kwargs: Mapping[str, Any]) -> Any:
    """The Patronus API given to this experiment (``api_key=``, ``api_url=``, over
    `init`'s), if any: its remote evaluators use it."""
    if kwargs.get("api_key") is None and kwargs.get("api_url") is None:
        return None
    return patronus_endpoint_of_init(api_key=kwargs.get("api_key"), api_url=kwargs.get("api_url"))


#: One link: its task, and its adapters each with its evaluator id (`told_apart`).
Link = tuple[TaskFn | None, list[tuple[BaseEvaluatorAdapter, str]]]


def _links(task: TaskFn | None, evaluators: Sequence[Any] | None,
           chain: Sequence[ChainLink] | None) -> list[Link]:
    if chain is not None and evaluators is not None:
        raise ConfigError("pass evaluators= or chain=, not both: with chain=, each link's "
                          "evaluators go in it ({'task': ..., 'evaluators': [...]}).")
    if chain is not None and task is not None:
        raise ConfigError("task= beside chain= would be ignored (the SDK drops it silently): "
                          "put the task in the chain's first link ({'task': task, ...}).")
    given: Any = chain if chain is not None else [{"task": task, "evaluators": evaluators or []}]
    if isinstance(given, Mapping):
        given = [given]
    links = []
    for link in given:
        adapters = [adapted(e) for e in _listed(link.get("evaluators"))]
        links.append((link.get("task"), list(zip(adapters, told_apart(adapters), strict=True))))
    _say_told_apart(links)
    return links


def _say_told_apart(links: list[Link]) -> None:
    """Once per experiment: which evaluators share a name, and what each is recorded as."""
    renamed = [f"{a.evaluator_id!r} as {step_name(eid, a.criteria)!r}"
               for _, named in links for a, eid in named if eid != a.evaluator_id]
    if renamed:
        warnings.warn(
            "evaluators of one link share a name (the SDK 0.1.x runs them all); each is "
            f"recorded under its own: {', '.join(renamed)} (the first keeps its name). Give "
            "each its own evaluator_id to choose the names.", UserWarning, stacklevel=2)


def _listed(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


def _with_weights(metadata: Mapping[str, Any] | None, links: list[Link]) -> dict[str, Any] | None:
    """The experiment's metadata with ``evaluator_weights`` ({canonical name: weight as
    given}), as the SDK sends it; one evaluator with two weights is a `TypeError`."""
    weights: dict[str, Any] = {}
    for _, named in links:
        for adapter, evaluator_id in named:
            if adapter.weight is None:
                continue
            name = canonical_name(evaluator_id, adapter.criteria)
            if name in weights and str(weights[name]) != str(adapter.weight):
                raise TypeError(f"evaluator {name!r} is given two weights: "
                                f"{weights[name]!r} and {adapter.weight!r}; give it one")
            weights[name] = adapter.weight
    if not weights:
        return dict(metadata) if metadata is not None else None
    return {**(metadata or {}), "evaluator_weights": {**weights, **dict(
        (metadata or {}).get("evaluator_weights") or {})}}


def _engine_link(link: Link, endpoint: Any = None) -> dict[str, Any]:
    task, named = link
    return {"task": None if task is None else task_step(task),
            "evaluators": [to_step(a, endpoint, eid) for a, eid in named]}


def task_step(fn: TaskFn) -> _steps.Task:
    """A plain task function, called as the SDK calls it (``row=, parent=, tags=``), as
    this package's task step: one Prefect task run per row, named after the function."""
    if isinstance(fn, _steps.Task):
        return fn
    _check_task_signature(fn)
    name = getattr(fn, "__name__", type(fn).__name__)
    options = {"name": name, "version": _steps.source_hash(fn, name)}
    if inspect.iscoroutinefunction(fn):
        async def run_async(row: EngineRow, parent: Any, tags: dict[str, str]) -> Any:
            view = Row(row)
            return _task_result(await fn(row=view, parent=EvalParent.of_engine(parent),
                                         tags=_tags(view, tags)), name)
        return _steps.FunctionTask(run_async, **options)

    def run(row: EngineRow, parent: Any, tags: dict[str, str]) -> Any:
        view = Row(row)
        return _task_result(fn(row=view, parent=EvalParent.of_engine(parent),
                               tags=_tags(view, tags)), name)
    return _steps.FunctionTask(run, **options)


def _tags(row: Row, experiment: dict[str, str]) -> dict[str, str]:
    """A task's tags, as the SDK gives them: the row's ``tags``, the experiment's over them."""
    return {**{str(k): str(v) for k, v in (row.tags or {}).items()}, **experiment}


def _check_task_signature(fn: TaskFn) -> None:
    """The SDK calls a task ``task(row=, parent=, tags=)``: a function that cannot take
    them would fail on every row; say so before the first."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    missing = [n for n in ("row", "parent", "tags") if n not in params]
    if missing:
        name = getattr(fn, "__name__", repr(fn))
        raise TypeError(f"task {name!r} is called as {name}(row=..., parent=..., tags=...) but "
                        f"takes no {', '.join(missing)}: add them, or **kwargs, to its signature")


def _task_result(value: Any, name: str) -> Any:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, TaskResult):
        return value.to_engine()
    raise TypeError(f"task {name!r} returned {type(value).__name__}: return a str, a "
                    "TaskResult (from patronus_tasks.experiments) or None (the row stops)")


async def _dataset_of(value: Any) -> Any:
    """The SDK's dataset forms as this package's data."""
    if inspect.iscoroutine(value) or (isinstance(value, Awaitable) and not isinstance(
            value, DatasetLoader)):
        return await _dataset_of(await value)
    if isinstance(value, _dataset.Dataset | _dataset.DatasetLoader):
        return value
    if isinstance(value, pd.DataFrame):
        return Dataset.from_dataframe(value)
    if isinstance(value, list | tuple):
        return Dataset.from_records(value)
    if callable(value):
        return await _dataset_of(value())
    raise ValueError(f"dataset must be a list of dicts, a DataFrame, a Dataset, a DatasetLoader, "
                     f"or a coroutine or callable giving one, not {type(value).__name__}")


class Experiment:
    """An experiment as the SDK's: made by `run_experiment`, or by ``await
    Experiment.create(...)`` then ``await experiment.run()``; then ``to_dataframe()``,
    ``to_csv()``, ``project``, ``experiment``, ``dataset``, ``tags``, ``metadata``, and this
    package's results behind it (``results``: `patronus_tasks.results.Experiment`, its
    summary, path, manifest)."""

    def __init__(self, project: str, tags: Tags, metadata: dict[str, Any] | None,
                 dataset: Any, run_options: dict[str, Any]) -> None:
        self.tags, self.metadata, self.dataset = tags, metadata, dataset
        self.project: dict[str, Any] = {"id": None, "name": project}
        self._project_name = project
        self.experiment: dict[str, Any] | None = None
        self.results: Results | None = None
        self._run_options = run_options

    @classmethod
    async def create(cls, dataset: Any, task: TaskFn | None = None,
                     evaluators: Sequence[Any] | None = None,
                     chain: Sequence[ChainLink] | None = None, tags: Tags | None = None,
                     max_concurrency: int = 10, project_name: str | None = None,
                     experiment_name: str | None = None, **kwargs: Any) -> Experiment:
        """The experiment checked and its dataset loaded, not run yet (``await run()``)."""
        options = {k: v for k, v in kwargs.items() if k not in _SDK_ONLY}
        links = _links(task, evaluators, chain)
        metadata = _with_weights(options.pop("metadata", None), links)
        endpoint = _endpoint(kwargs)
        options.setdefault("print_summary", True)
        options.update(chain=[_engine_link(lk, endpoint) for lk in links], tags=tags,
                       max_concurrency=max_concurrency, experiment_name=experiment_name,
                       metadata=metadata)
        return cls(project_name or default_project(), tags or {}, metadata,
                   await _dataset_of(dataset), options)

    async def run(self) -> Experiment:
        """Run its rows (once); the experiment itself, finished."""
        from patronus_tasks.api import arun_experiment

        if self.results is not None:
            raise RuntimeError("this experiment has run already: create another one")
        self.results = await arun_experiment(self._project_name, data=self.dataset,
                                             **self._run_options)
        manifest = self.results.manifest
        self.experiment = {"project_id": None, "id": manifest["experiment_id"],
                           "name": manifest["experiment_name"], "tags": self.tags,
                           "metadata": self.metadata}
        return self

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or self.__dict__.get("results") is None:
            raise AttributeError(name)
        return getattr(self.__dict__["results"], name)

    def _finished(self) -> Results:
        if self.results is None:
            raise RuntimeError("the experiment has not run yet: await experiment.run() first")
        return self.results

    def to_dataframe(self) -> pd.DataFrame:
        """One row per evaluation, as the SDK's (``link_idx``, ``evaluator_id``,
        ``criteria``, ``task.output``, ``eval.score``, ``eval.pass``...), plus what it drops:
        failed and skipped calls (``status``, ``error_stage``, ``error_message``), the
        ``weight`` and the row's ``weighted_score``; then the dataset's columns, under the
        SDK's names."""
        return _sdk_frame(self._finished().to_dataframe())

    def to_csv(self, path_or_buf: Any = None, **kwargs: Any) -> Any:
        return self.to_dataframe().to_csv(path_or_buf, **kwargs)


#: Past the SDK's columns: what it drops (failures, weights).
_KEPT = ["weight", "weighted_score", "status", "error_stage", "error_type", "error_message"]


def _sdk_frame(df: pd.DataFrame) -> pd.DataFrame:
    """The records as the SDK's DataFrame: its columns in its order, then `_KEPT`, then
    the dataset's columns under the SDK's names."""
    scores = weighted_scores(df)
    if len(scores) and "repeat" in df.columns:
        df = df.merge(scores, on=["sid", "repeat"], how="left")
    out = pd.DataFrame({
        "link_idx": df["link_index"], "task.name": df["task_name"],
        "evaluator_id": [_evaluator_id(n, c) for n, c in zip(df["evaluator_name"], df["criteria"],
                                                             strict=True)],
        "criteria": df["criteria"], "task.output": df["task_output"],
        "task.metadata": df["task_metadata"].map(_loads), "task.tags": df["task_tags"].map(_loads),
        "eval.score": df["score"], "eval.pass": df["pass"], "eval.text_output": df["text_output"],
        "eval.metadata": df["evaluation_metadata"].map(_loads),
        "eval.explanation": df["explanation"], "eval.tags": df["evaluation_tags"].map(_loads),
        "eval.evaluation_duration": pd.to_timedelta(df["evaluation_duration_s"], unit="s"),
        **{name: df[name] if name in df.columns else None for name in _KEPT},
    })
    dataset = [c for c in df.columns if c not in FIXED_NAMES and c not in ("sid", "weighted_score")]
    return pd.concat([out, df[["sid", *dataset]].rename(columns=SDK_NAMES)], axis=1)


def _evaluator_id(name: Any, criteria: Any) -> Any:
    if name is None or (isinstance(name, float) and pd.isna(name)):
        return None
    suffix = f":{criteria}" if isinstance(criteria, str) and criteria else ""
    return name[: -len(suffix)] if suffix and name.endswith(suffix) else name


def _loads(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value
