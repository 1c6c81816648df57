"""Dataset-level evaluators (metrics): ``@metric`` functions of all of an experiment's
results, and ready ones. Pass them as ``metrics=[...]``; gate on them with
``min_metrics={"f1": 0.8}``."""

from patronus_tasks.define.metrics import Metric, metric
from patronus_tasks.record.manifest import MetricValue
from patronus_tasks.results.metrics import accuracy_by, evaluate_metrics, precision_recall_f1

__all__ = ["Metric", "MetricValue", "accuracy_by", "evaluate_metrics", "metric",
           "precision_recall_f1"]
