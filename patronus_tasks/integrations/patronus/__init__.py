"""The Patronus v1 HTTP API: remote evaluators, remote datasets, one-off evaluations and
experiment results on the platform. Everything here is opt-in (``PATRONUS_API_KEY``)."""

from patronus_tasks.integrations.patronus.datasets import RemoteDataset
from patronus_tasks.integrations.patronus.endpoint import (
    API_KEY_ENV,
    API_URL_ENV,
    DEFAULT_API_URL,
    UI_URL_ENV,
    patronus_endpoint,
)
from patronus_tasks.integrations.patronus.evaluators import RemoteEvaluator
from patronus_tasks.integrations.patronus.export import PatronusReporter

__all__ = ["API_KEY_ENV", "API_URL_ENV", "DEFAULT_API_URL", "UI_URL_ENV", "PatronusReporter",
           "RemoteDataset", "RemoteEvaluator", "patronus_endpoint"]
