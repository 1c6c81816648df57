"""Reading results: an experiment's records and summary, past runs, comparisons, gates,
verdicts, usage, repeats and judge agreement.

May import: `record`, `define` and the ground modules; no Prefect, nothing that runs rows.
"""

from patronus_tasks.record.manifest import MetricValue, UsageTotal
from patronus_tasks.record.records import ErrorInfo
from patronus_tasks.results.compare import Comparison, EvaluatorComparison, compare_experiments
from patronus_tasks.results.experiment import Experiment
from patronus_tasks.results.repeats import RepeatStats
from patronus_tasks.results.store import list_experiments, load_experiment
from patronus_tasks.results.summary import EvaluatorStats, Summary

__all__ = [
    "Comparison",
    "ErrorInfo",
    "EvaluatorComparison",
    "EvaluatorStats",
    "Experiment",
    "MetricValue",
    "RepeatStats",
    "Summary",
    "UsageTotal",
    "compare_experiments",
    "list_experiments",
    "load_experiment",
]
