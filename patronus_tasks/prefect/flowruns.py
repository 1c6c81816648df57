"""An experiment's flow run, kept by the recorder process: created, logged to, ended.

Prefect's flow engine would run the experiment's code inside the flow run; here the rows
run in the experiment's own process and only their records reach Prefect, so the flow
run is made through the API: created Running (a subflow of the run it was called in,
through a task run in that parent, as the engine makes one), its figures logged, its
final state set once its task runs are in.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prefect.client.schemas.actions import FlowRunCreate, StateCreate, TaskRunCreate
from prefect.client.schemas.objects import StateType

from patronus_tasks.prefect import internal
from patronus_tasks.prefect.protocol import Opening, ParentRun

if TYPE_CHECKING:
    from prefect.client.orchestration import PrefectClient
    from prefect.states import State


@dataclass(frozen=True)
class Created:
    """The experiment's flow run, its task run in its parent flow run (if it has one), and
    its series."""

    flow_run_id: str
    parent_task_run: str | None
    series: str


async def create(client: PrefectClient, opening: Opening) -> Created:
    """Create the experiment's flow run (Running), its series among its parameters."""
    series = await series_of(client, opening.project, opening.series, opening.parent)
    flow_id = await internal.create_flow(client, opening.flow_name)
    parent_task_run = await _parent_task_run(client, opening) if opening.parent else None
    body = FlowRunCreate(
        flow_id=flow_id, name=opening.run_name,
        parameters={**opening.parameters, "series": series},
        tags=list(opening.tags), parent_task_run_id=parent_task_run,
        state=StateCreate(type=StateType.RUNNING, name="Running"))
    created = await internal.create_flow_run(client, body.model_dump(mode="json"))
    return Created(str(created["id"]), str(parent_task_run) if parent_task_run else None, series)


async def _parent_task_run(client: PrefectClient, opening: Opening) -> uuid.UUID:
    """The task run standing for the experiment in its parent flow run (as the engine
    makes one for a subflow: the parent's graph shows the experiment there)."""
    assert opening.parent is not None
    task_run_id = uuid.uuid4()
    body = TaskRunCreate(
        id=task_run_id, name=f"{opening.flow_name}-{task_run_id.hex[:8]}",
        flow_run_id=uuid.UUID(opening.parent.flow_run_id), task_key=f"subflow-{opening.flow_name}",
        dynamic_key=task_run_id.hex, tags=list(opening.tags),
        state=StateCreate(type=StateType.RUNNING, name="Running"))
    await internal.create_task_run(client, body.model_dump(mode="json"))
    return task_run_id


async def series_of(client: PrefectClient, project: str, given: str | None,
                    parent: ParentRun | None) -> str:
    """The series: ``given``, else the parent's flow (and deployment) and the project,
    else the project (an experiment run on its own)."""
    if given:
        return given
    if parent is None:
        return project
    owner = parent.flow_name
    if parent.deployment_id is not None:
        deployment = await client.read_deployment(parent.deployment_id)
        owner = f"{owner}/{deployment.name}"
    return f"{owner}/{project}"


async def log(client: PrefectClient, flow_run_id: str, lines: list[tuple[int, str]]) -> None:
    """Log lines (level, message) on the flow run itself."""
    stamp = dt.datetime.now(dt.UTC).isoformat()
    await internal.post_logs(client, [
        {"name": "patronus_tasks", "level": level, "message": message, "timestamp": stamp,
         "flow_run_id": flow_run_id} for level, message in lines])


async def finish(client: PrefectClient, flow_run_id: str, state: State[Any],
                 parent_task_run: str | None) -> None:
    """Set the flow run's final state (forced: nothing else orchestrates it), and its
    parent's task run's."""
    await client.set_flow_run_state(flow_run_id, state, force=True)
    if parent_task_run is not None:
        await client.set_task_run_state(uuid.UUID(parent_task_run), state.model_copy(), force=True)


async def add_tags(client: PrefectClient, flow_run_id: str, tags: list[str]) -> None:
    """Put ``tags`` first among a flow run's (its own and those of the experiment's parent
    run: Prefect lets any client change a flow run's tags, which every list of runs shows).
    First: Prefect's v2 UI shows a run's tags in their order, as many as fit, the rest
    counted in a "+N" (at 1280 px the deployment page has room for one)."""
    if not tags:
        return
    run = await client.read_flow_run(uuid.UUID(flow_run_id))
    merged = list(dict.fromkeys([*tags, *run.tags]))
    if merged != list(run.tags):
        await client.update_flow_run(uuid.UUID(flow_run_id), tags=merged)
