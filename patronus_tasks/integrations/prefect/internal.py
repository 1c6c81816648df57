"""Every use of Prefect's private interfaces, in one place.

Prefect's public client has no bulk way to record task runs or to ask which of a set of
ids the server holds, so these go through its HTTP client (``client._client``) to
endpoints of the REST API: ``POST /events`` (the event format of `events`, also
internal), ``POST /logs/``, and the filter and count endpoints. The contract test
(tests/test_recording.py) runs the same calls through Prefect's own task engine and
compares what the API returns; the Prefect range in pyproject.toml is what it passed on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx
    from prefect.client.orchestration import PrefectClient


async def _post(client: PrefectClient, path: str, **kwargs: Any) -> httpx.Response:
    response = await client._client.post(path, **kwargs)
    response.raise_for_status()
    return response


async def post_events(client: PrefectClient, body: bytes) -> None:
    """Send a JSON array of events (already serialised) for the server to record."""
    await _post(client, "/events", content=body, headers={"content-type": "application/json"})


async def post_logs(client: PrefectClient, logs: list[dict[str, Any]]) -> None:
    await _post(client, "/logs/", json=logs)


async def count_task_runs(client: PrefectClient, body: dict[str, Any]) -> int:
    """``POST /task_runs/count`` with a filter body."""
    return int((await _post(client, "/task_runs/count", json=body)).json())


async def filter_task_runs(client: PrefectClient, body: dict[str, Any]) -> list[dict[str, Any]]:
    """``POST /task_runs/filter``: the task runs as JSON (no model parsing: faster)."""
    return list((await _post(client, "/task_runs/filter", json=body)).json())


async def filter_events(client: PrefectClient, body: dict[str, Any]) -> dict[str, Any]:
    """``POST /events/filter``: one page of events and the total."""
    return dict((await _post(client, "/events/filter", json=body)).json())


async def create_flow_run(client: PrefectClient, body: dict[str, Any]) -> dict[str, Any]:
    """``POST /flow_runs/`` (the public client's takes a `Flow` object, which the recorder
    process does not have: the experiment's code runs elsewhere)."""
    return dict((await _post(client, "/flow_runs/", json=body)).json())


async def create_task_run(client: PrefectClient, body: dict[str, Any]) -> dict[str, Any]:
    """``POST /task_runs/`` (the public client's takes a `Task` object)."""
    return dict((await _post(client, "/task_runs/", json=body)).json())


def watch_responses(client: PrefectClient, hook: Callable[[httpx.Response], None]) -> None:
    """Call ``hook`` with every response the client gets, retried ones included (Prefect's
    client retries a 429 itself: the recorder still wants to know the server limits it)."""

    async def seen(response: httpx.Response) -> None:
        hook(response)

    client._client.event_hooks["response"].append(seen)
