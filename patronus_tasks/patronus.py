"""The Patronus API: remote evaluators (opt-in, through ``PATRONUS_API_KEY``)."""

from patronus_tasks.exceptions import RemoteAPIError
from patronus_tasks.integrations.patronus import RemoteEvaluator, patronus_endpoint

__all__ = ["RemoteAPIError", "RemoteEvaluator", "patronus_endpoint"]
