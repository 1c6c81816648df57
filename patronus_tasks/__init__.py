"""patronus-tasks: LLM experiments on Prefect.

Write a ``@task`` (the model call under test) and ``@evaluator``s (how to judge it),
point them at a dataset, and run it: each experiment is a Prefect flow run, each call
a task run, and the results a Parquet file you can query.

This module only names things: each is imported from where it lives when first used
(importing them all took ~0.7 s, which the command line and the recorder process paid
for names they never use). Nothing happens on import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from patronus_tasks._version import __version__

if TYPE_CHECKING:
    from patronus_tasks.api import arun_experiment, run_experiment
    from patronus_tasks.client import Client
    from patronus_tasks.define.chain import Link, Parent
    from patronus_tasks.define.dataset import Dataset, load_dataset, read_csv, read_jsonl
    from patronus_tasks.define.row import Row
    from patronus_tasks.define.simple import simple_evaluator, simple_task
    from patronus_tasks.define.step_results import EvaluationResult, TaskResult, Usage
    from patronus_tasks.define.steps import Evaluator, Task, evaluator, task
    from patronus_tasks.exceptions import (
        ConfigError,
        DatasetError,
        ExperimentError,
        InvalidResultError,
        JudgeError,
        PatronusTasksError,
        QualityGateError,
        RemoteAPIError,
        UnparseableResponseError,
    )
    from patronus_tasks.patronus import RemoteEvaluator
    from patronus_tasks.record.cache import Cache
    from patronus_tasks.results.experiment import Experiment
    from patronus_tasks.results.summary import Summary
    from patronus_tasks.review import review
    from patronus_tasks.sweep.api import asweep, sweep
    from patronus_tasks.sweep.result import Sweep
    from patronus_tasks.trace import span, traced
    from patronus_tasks.tracing import init

#: Where each public name lives.
_HOMES = {
    "arun_experiment": "api", "run_experiment": "api", "Client": "client",
    "Link": "define.chain", "Parent": "define.chain",
    "Dataset": "define.dataset", "load_dataset": "define.dataset", "read_csv": "define.dataset",
    "read_jsonl": "define.dataset", "Row": "define.row",
    "simple_evaluator": "define.simple", "simple_task": "define.simple",
    "EvaluationResult": "define.step_results", "TaskResult": "define.step_results",
    "Usage": "define.step_results", "Cache": "record.cache",
    "Evaluator": "define.steps", "Task": "define.steps", "evaluator": "define.steps",
    "task": "define.steps",
    **dict.fromkeys(["ConfigError", "DatasetError", "ExperimentError", "InvalidResultError",
                     "JudgeError", "PatronusTasksError", "QualityGateError", "RemoteAPIError",
                     "UnparseableResponseError"], "exceptions"),
    "RemoteEvaluator": "patronus", "Experiment": "results.experiment",
    "Summary": "results.summary", "review": "review", "init": "tracing", "traced": "trace",
    "span": "trace", "sweep": "sweep.api", "asweep": "sweep.api", "Sweep": "sweep.result",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'patronus_tasks' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"patronus_tasks.{home}"), name)
    globals()[name] = value  # once: later reads are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


# What the Patronus SDK has at its top level, and the core. The rest lives in named
# modules, each with its own __all__: patronus_tasks.results (reading, comparing, past
# runs), .metrics (dataset-level evaluators), .prices, .openai, .http, .patronus, .prefect;
# the SDK 0.1.x's API in .experiments, .evals and .datasets (`init` and `traced` here).
__all__ = [
    "Cache",
    "Client",
    "ConfigError",
    "Dataset",
    "DatasetError",
    "EvaluationResult",
    "Evaluator",
    "Experiment",
    "ExperimentError",
    "InvalidResultError",
    "JudgeError",
    "Link",
    "Parent",
    "PatronusTasksError",
    "QualityGateError",
    "RemoteAPIError",
    "RemoteEvaluator",
    "Row",
    "Summary",
    "Sweep",
    "Task",
    "TaskResult",
    "UnparseableResponseError",
    "Usage",
    "__version__",
    "arun_experiment",
    "asweep",
    "evaluator",
    "init",
    "load_dataset",
    "read_csv",
    "read_jsonl",
    "review",
    "run_experiment",
    "simple_evaluator",
    "simple_task",
    "span",
    "sweep",
    "task",
    "traced",
]
