"""The Patronus SDK 0.1.x's ``patronus.experiments``, here: a program written for it runs
with ``from patronus.experiments import ...`` changed to ``from patronus_tasks.experiments
import ...`` (and ``patronus.evals`` / ``patronus.datasets`` likewise), offline, on
Prefect: every call a task run, the results Parquet, failures kept as data.

One engine underneath: `run_experiment` adapts the SDK's tasks, evaluators, chains and
datasets onto this package's row loop, recording, results and UI (README, "Coming from
the Patronus SDK 0.1.x").

May import: `api`, `evals`, `datasets`, `define`, `record`, `results`, `tracing` and the
ground modules.
"""

from patronus_tasks.datasets.datasets import Dataset, RemoteDatasetLoader, Row
from patronus_tasks.experiments.adapters import (
    BaseEvaluatorAdapter,
    EvaluatorAdapter,
    FuncEvaluatorAdapter,
    StructuredEvaluatorAdapter,
)
from patronus_tasks.experiments.experiment import ChainLink, Experiment, Tags, run_experiment
from patronus_tasks.experiments.types import EvalParent, EvalsMap, TaskResult

__all__ = ["BaseEvaluatorAdapter", "ChainLink", "Dataset", "EvalParent", "EvalsMap",
           "EvaluatorAdapter", "Experiment", "FuncEvaluatorAdapter", "RemoteDatasetLoader",
           "Row", "StructuredEvaluatorAdapter", "Tags", "TaskResult", "run_experiment"]
