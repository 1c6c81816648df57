"""Artifacts made through the API, as Prefect's artifact classes make them: the same
bodies (``POST /artifacts/``: a table as JSON with NaN as null, a link as markdown, a
progress as its percentage), without Prefect's models: the recorder process publishes
them without Prefect loaded (`lean`).

Prefect's client also emits a ``prefect.artifact.created`` (``updated``) event for each,
through its events worker; these are not sent: nothing here or in the UI reads them, and
posted with the task runs' events they took a share of a rate-limited server's budget
(and of the waits its ``Retry-After`` asks for) from the task runs that need it.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from patronus_tasks.prefect import internal

if TYPE_CHECKING:
    from patronus_tasks.prefect.internal import ApiClient


def table_data(table: list[dict[str, Any]] | dict[str, list[Any]]) -> str:
    """A table artifact's data (Prefect's `TableArtifact.format`: NaN as null)."""
    return json.dumps(_without_nan(table))


def _without_nan(item: Any) -> Any:
    if isinstance(item, list):
        return [_without_nan(x) for x in item]
    if isinstance(item, dict):
        return {k: _without_nan(v) for k, v in item.items()}
    return None if isinstance(item, float) and math.isnan(item) else item


def link_data(link: str, text: str | None) -> str:
    """A link artifact's data (Prefect's `LinkArtifact.format`)."""
    return f"[{text}]({link})" if text else f"[{link}]({link})"


async def create(client: ApiClient, kind: str, data: Any, flow_run_id: str | None,
                 key: str | None = None, description: str | None = None) -> str:
    """Make an artifact of type ``kind`` (``table``, ``markdown``, ``progress``) on the
    flow run (None: on none, as outside a run); its id."""
    made = await internal.create_artifact(client, {
        "key": key, "type": kind, "description": description, "data": data,
        "flow_run_id": None if flow_run_id is None else str(flow_run_id), "task_run_id": None})
    return str(made["id"])
