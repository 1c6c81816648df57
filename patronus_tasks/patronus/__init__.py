"""The Patronus v1 HTTP API: remote evaluators, remote datasets, one-off evaluations and
experiment results on the platform. Everything here is opt-in (``PATRONUS_API_KEY``).

May import: `http`, `define`, `record`, `results` and the ground modules (`exceptions`,
`settings`); nothing of Prefect.
"""

from patronus_tasks.exceptions import RemoteAPIError
from patronus_tasks.patronus.datasets import RemoteDataset
from patronus_tasks.patronus.endpoint import patronus_endpoint
from patronus_tasks.patronus.evaluators import RemoteEvaluator
from patronus_tasks.patronus.export import PatronusReporter

__all__ = ["PatronusReporter", "RemoteAPIError", "RemoteDataset", "RemoteEvaluator",
           "patronus_endpoint"]
