"""patronus-tasks: LLM experiments on Prefect.

Write a ``@task`` (the model call under test) and ``@evaluator``s (how to judge it),
point them at a dataset, and run it: each experiment is a Prefect flow run, each call
a task run, and the results a Parquet file you can query.
"""

from ._server_hook import install as _install_local_server

# Prefect starts its built-in server for the first API call of a process, a user's own
# @flow included: this makes that server one that starts on a slow machine (see
# _local_server), once Prefect loads its server module. It changes no environment variable.
_install_local_server()

from ._chain import Link, Parent  # noqa: E402
from ._client import Client  # noqa: E402
from ._compare import Comparison, EvaluatorComparison, compare_experiments  # noqa: E402
from ._dataset import Dataset, load_dataset, read_csv, read_jsonl  # noqa: E402
from ._exceptions import (  # noqa: E402
    ConfigError,
    DatasetError,
    ExperimentError,
    InvalidResultError,
    PatronusTasksError,
    QualityGateError,
    RemoteAPIError,
    UnparseableResponseError,
)
from ._experiment import Experiment, arun_experiment, run_experiment  # noqa: E402
from ._http import Endpoint  # noqa: E402
from ._openai import ChatTask, LLMJudge, chat_completion, openai_endpoint  # noqa: E402
from ._prefect import experiment_flow_run_name  # noqa: E402
from ._records import ErrorInfo  # noqa: E402
from ._remote import RemoteEvaluator, patronus_endpoint  # noqa: E402
from ._results import EvaluationResult, TaskResult  # noqa: E402
from ._row import Row  # noqa: E402
from ._steps import Evaluator, Task, evaluator, task  # noqa: E402
from ._store import list_experiments, load_experiment  # noqa: E402
from ._summary import EvaluatorStats, Summary  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "ChatTask",
    "Client",
    "Comparison",
    "ConfigError",
    "Dataset",
    "DatasetError",
    "Endpoint",
    "ErrorInfo",
    "EvaluationResult",
    "Evaluator",
    "EvaluatorComparison",
    "EvaluatorStats",
    "Experiment",
    "ExperimentError",
    "InvalidResultError",
    "LLMJudge",
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
    "__version__",
    "arun_experiment",
    "chat_completion",
    "compare_experiments",
    "evaluator",
    "experiment_flow_run_name",
    "list_experiments",
    "load_dataset",
    "load_experiment",
    "openai_endpoint",
    "patronus_endpoint",
    "read_csv",
    "read_jsonl",
    "run_experiment",
    "task",
]
