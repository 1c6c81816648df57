"""An HTTP endpoint with retries, a bound on calls in flight and pooled connections."""

from patronus_tasks.exceptions import RemoteAPIError
from patronus_tasks.integrations.http import Endpoint

__all__ = ["Endpoint", "RemoteAPIError"]
