"""Prefect orchestration: an experiment as a flow run, each step call as a task run."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from prefect import flow
from prefect import tags as prefect_tags
from prefect.context import FlowRunContext
from prefect.task_runners import TaskRunner

from patronus_tasks.prefect import flowruns, internal
from patronus_tasks.prefect.clients import get_client
from patronus_tasks.prefect.internal import ApiClient
from patronus_tasks.prefect.states import cancelled

T = TypeVar("T")
FINAL_STATES = ["COMPLETED", "FAILED", "CRASHED", "CANCELLED"]


def current_flow_run_id() -> str | None:
    """The id of the flow run this code runs in, if any."""
    ctx = FlowRunContext.get()
    return str(ctx.flow_run.id) if ctx and ctx.flow_run else None


async def run_as_flow(body: Callable[..., Awaitable[T]], *, flow_name: str, run_name: str,
                      tags: list[str], parameters: dict[str, Any] | None = None,
                      task_runner: TaskRunner[Any] | None = None) -> T:
    """Run ``body`` as one Prefect flow run (a subflow when called inside a flow).

    ``parameters`` are what the flow run shows on its Parameters tab: ``body`` takes them
    as keywords (``**kwargs``); the signature Prefect reads lists them one by one.
    """
    options: dict[str, Any] = {"task_runner": task_runner} if task_runner is not None else {}
    parameters = parameters or {}
    body.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY) for name in parameters])
    experiment_flow = flow(
        name=flow_name, flow_run_name=lambda: run_name, persist_result=False,
        validate_parameters=False, **options,
    )(body)
    with prefect_tags(*tags):
        return await experiment_flow(**parameters)


async def mark_cancelled(flow_run_id: str, why: str) -> None:
    """Force a flow run into Cancelled: it was interrupted, and can be resumed."""
    async with get_client() as client:
        await flowruns.finish(client, flow_run_id, cancelled(f"interrupted: {why}"), None)


async def count_task_runs(flow_run_id: str, client: ApiClient | None = None) -> int:
    """How many task runs of this flow run the server has recorded in a final state."""
    body = {
        "flow_runs": {"id": {"any_": [flow_run_id]}},
        "task_runs": {"state": {"type": {"any_": FINAL_STATES}}},
    }
    if client is None:
        async with get_client() as client:
            return await count_task_runs(flow_run_id, client)
    return await internal.count_task_runs(client, body)
