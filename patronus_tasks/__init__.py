"""patronus-tasks: LLM experiments on Prefect.

Write a ``@task`` (the model call under test) and ``@evaluator``s (how to judge it),
point them at a dataset, and run it: each experiment is a Prefect flow run, each call
a task run, and the results a Parquet file you can query.
"""

from patronus_tasks.integrations.prefect.server_hook import install as _install_local_server

# Prefect starts its built-in server for the first API call of a process, a user's own
# @flow included: this makes that server one that starts on a slow machine (see
# integrations/prefect/local_server), once Prefect loads its server module. It changes no
# environment variable.
_install_local_server()

from patronus_tasks.api import arun_experiment, run_experiment  # noqa: E402
from patronus_tasks.client import Client  # noqa: E402
from patronus_tasks.define.chain import Link, Parent  # noqa: E402
from patronus_tasks.define.dataset import Dataset, load_dataset, read_csv, read_jsonl  # noqa: E402
from patronus_tasks.define.row import Row  # noqa: E402
from patronus_tasks.define.simple import simple_evaluator, simple_task  # noqa: E402
from patronus_tasks.define.step_results import EvaluationResult, TaskResult, Usage  # noqa: E402
from patronus_tasks.define.steps import Evaluator, Task, evaluator, task  # noqa: E402
from patronus_tasks.exceptions import (  # noqa: E402
    ConfigError,
    DatasetError,
    ExperimentError,
    InvalidResultError,
    PatronusTasksError,
    QualityGateError,
    RemoteAPIError,
    UnparseableResponseError,
)
from patronus_tasks.integrations.patronus import RemoteEvaluator  # noqa: E402
from patronus_tasks.record.cache import Cache  # noqa: E402
from patronus_tasks.results.experiment import Experiment  # noqa: E402
from patronus_tasks.results.summary import Summary  # noqa: E402

__version__ = "0.1.0"

# What the Patronus SDK has at its top level, and the core. The rest lives in named
# modules, each with its own __all__: patronus_tasks.results (reading, comparing, past
# runs), .metrics (dataset-level evaluators), .prices, .openai, .http, .patronus, .prefect.
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
    "Link",
    "Parent",
    "PatronusTasksError",
    "QualityGateError",
    "RemoteAPIError",
    "RemoteEvaluator",
    "Row",
    "Summary",
    "Task",
    "TaskResult",
    "UnparseableResponseError",
    "Usage",
    "__version__",
    "arun_experiment",
    "evaluator",
    "load_dataset",
    "read_csv",
    "read_jsonl",
    "run_experiment",
    "simple_evaluator",
    "simple_task",
    "task",
]
