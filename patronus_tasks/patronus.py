"""The Patronus API: remote evaluators and datasets, and experiment results on the
platform (opt-in, through ``PATRONUS_API_KEY``)."""

from patronus_tasks.exceptions import RemoteAPIError
from patronus_tasks.integrations.patronus import (
    PatronusReporter,
    RemoteDataset,
    RemoteEvaluator,
    patronus_endpoint,
)

__all__ = ["PatronusReporter", "RemoteAPIError", "RemoteDataset", "RemoteEvaluator",
           "patronus_endpoint"]
