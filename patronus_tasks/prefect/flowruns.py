"""An experiment's flow run, kept by the recorder process: created, logged to, ended.

Prefect's flow engine would run the experiment's code inside the flow run; here the rows
run in the experiment's own process and only their records reach Prefect, so the flow
run is made through the API: created Running (a subflow of the run it was called in,
through a task run in that parent, as the engine makes one), its figures logged, its
final state set once its task runs are in. The bodies are those of Prefect's models
(`FlowRunCreate`, `TaskRunCreate`, `StateCreate`), the defaults left to the server: the
recorder process sends them without Prefect loaded (`lean`).
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from patronus_tasks.prefect import internal
from patronus_tasks.prefect.protocol import Opening, ParentRun

if TYPE_CHECKING:
    from patronus_tasks.prefect.internal import ApiClient
    from patronus_tasks.prefect.states import RunState

#: A run created Running (what Prefect's `StateCreate` sends; the server stamps it).
_RUNNING = {"type": "RUNNING", "name": "Running"}


@dataclass(frozen=True)
class Created:
    """The experiment's flow run, its task run in its parent flow run (if it has one), and
    its series."""

    flow_run_id: str
    parent_task_run: str | None
    series: str


async def create(client: ApiClient, opening: Opening) -> Created:
    """Create the experiment's flow run (Running), its series among its parameters."""
    series = await series_of(client, opening.project, opening.series, opening.parent)
    flow_id = await internal.create_flow(client, opening.flow_name)
    parent_task_run = await _parent_task_run(client, opening) if opening.parent else None
    body = {"flow_id": flow_id, "name": opening.run_name,
            "parameters": _json({**opening.parameters, "series": series}),
            "tags": list(opening.tags), "parent_task_run_id": parent_task_run,
            "state": _RUNNING}
    created = await internal.create_flow_run(client, body)
    return Created(str(created["id"]), parent_task_run, series)


def _json(value: Any) -> Any:
    """``value`` as JSON reads it back (what is not JSON, as its text)."""
    return orjson.loads(orjson.dumps(value, default=str, option=orjson.OPT_NON_STR_KEYS))


async def _parent_task_run(client: ApiClient, opening: Opening) -> str:
    """The task run standing for the experiment in its parent flow run (as the engine
    makes one for a subflow: the parent's graph shows the experiment there)."""
    assert opening.parent is not None
    task_run_id = uuid.uuid4()
    body = {"id": str(task_run_id), "name": f"{opening.flow_name}-{task_run_id.hex[:8]}",
            "flow_run_id": opening.parent.flow_run_id,
            "task_key": f"subflow-{opening.flow_name}", "dynamic_key": task_run_id.hex,
            "tags": list(opening.tags), "state": _RUNNING}
    await internal.create_task_run(client, body)
    return str(task_run_id)


async def series_of(client: ApiClient, project: str, given: str | None,
                    parent: ParentRun | None) -> str:
    """The series: ``given``, else the parent's flow (and deployment) and the project,
    else the project (an experiment run on its own)."""
    if given:
        return given
    if parent is None:
        return project
    owner = parent.flow_name
    if parent.deployment_id is not None:
        deployment = await internal.read_deployment(client, parent.deployment_id)
        owner = f"{owner}/{deployment['name']}"
    return f"{owner}/{project}"


async def log(client: ApiClient, flow_run_id: str, lines: list[tuple[int, str]]) -> None:
    """Log lines (level, message) on the flow run itself."""
    stamp = dt.datetime.now(dt.UTC).isoformat()
    await internal.post_logs(client, [
        {"name": "patronus_tasks", "level": level, "message": message, "timestamp": stamp,
         "flow_run_id": flow_run_id} for level, message in lines])


async def finish(client: ApiClient, flow_run_id: str, state: RunState,
                 parent_task_run: str | None) -> None:
    """Set the flow run's final state (forced: nothing else orchestrates it), and its
    parent's task run's."""
    await internal.set_state(client, "flow_runs", flow_run_id, state.body(flow_run_id=flow_run_id))
    if parent_task_run is not None:
        await internal.set_state(client, "task_runs", parent_task_run,
                                 state.body(task_run_id=parent_task_run))


async def add_tags(client: ApiClient, flow_run_id: str, tags: list[str]) -> None:
    """Put ``tags`` first among a flow run's (its own and those of the experiment's parent
    run: Prefect lets any client change a flow run's tags, which every list of runs shows).
    First: Prefect's v2 UI shows a run's tags in their order, as many as fit, the rest
    counted in a "+N" (at 1280 px the deployment page has room for one)."""
    if not tags:
        return
    had = list((await internal.read_flow_run(client, flow_run_id)).get("tags") or [])
    merged = list(dict.fromkeys([*tags, *had]))
    if merged != had:
        await internal.update_flow_run(client, flow_run_id, {"tags": merged})
