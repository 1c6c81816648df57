"""An experiment run by Prefect's own engine: one flow run whose task runner runs the rows.

For ``backend="dask"`` (a `DaskTaskRunner`) and any Prefect ``TaskRunner``: the flow run
is the engine's, in this process; its rows go in batches through its task runner
(`taskrunner`), and at its end it publishes and says its verdict as the recorder process
does for the default path (`postrun`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from prefect.client.orchestration import get_client
from prefect.logging import get_run_logger
from prefect.states import State

from patronus_tasks.exceptions import QualityGateError
from patronus_tasks.integrations.prefect import flowruns, postrun
from patronus_tasks.integrations.prefect import runs as _runs
from patronus_tasks.integrations.prefect.artifacts import Target
from patronus_tasks.integrations.prefect.opening import opening
from patronus_tasks.integrations.prefect.protocol import Closing, Opening, ParentRun
from patronus_tasks.integrations.prefect.taskrunner import OnTaskRunner
from patronus_tasks.results.experiment import Experiment
from patronus_tasks.run.execute import execute, gate_failures
from patronus_tasks.run.spec import ExperimentSpec


async def run_on_task_runner(spec: ExperimentSpec, parent: ParentRun | None) -> Experiment:
    """Run the experiment as one flow run of Prefect's engine; raise `QualityGateError`
    when a gate failed; mark it Cancelled when interrupted."""
    o = opening(spec, parent)
    run: dict[str, str | None] = {}

    async def body(**_parameters: Any) -> State:
        run["flow_run_id"] = flow_run_id = _runs.current_flow_run_id()
        assert flow_run_id is not None
        return await _rows_then_verdict(spec, o, flow_run_id)

    try:
        await _runs.run_as_flow(body, flow_name=o.flow_name, run_name=o.run_name,
                                tags=list(o.tags), parameters=o.parameters,
                                task_runner=_task_runner(spec))
    except QualityGateError as exc:
        exc.experiment = Experiment(spec.out_dir)
        raise
    except BaseException as exc:
        if run.get("flow_run_id") and not isinstance(exc, Exception):
            await asyncio.shield(_runs.mark_cancelled(str(run["flow_run_id"]), repr(exc)))
        raise
    return Experiment(spec.out_dir)


async def _rows_then_verdict(spec: ExperimentSpec, o: Opening, flow_run_id: str) -> State:
    """The flow's body, top to bottom: the rows, the gates, the results published, the
    verdict it ends with."""
    _, calls = await execute(spec, OnTaskRunner(), flow_run_id)
    closing = Closing(o.key, "completed", tuple(gate_failures(spec, Experiment(spec.out_dir))),
                      spec.fail_on_regression, calls)
    async with get_client() as client:
        series = await flowruns.series_of(client, o.project, o.series, o.parent)
        verdict = await postrun.publish(
            postrun.Publishing.of(o, Target(client, flow_run_id, flow_run_id), series), closing)
    log = get_run_logger()
    for level, line in verdict.lines:
        log.log(level, "%s", line)
    if verdict.failures:
        verdict.state.data = QualityGateError(verdict.failures, Experiment(spec.out_dir))
    return verdict.state


def _task_runner(spec: ExperimentSpec) -> Any:
    """The flow run's task runner: Dask's for ``"dask"``, else the one given."""
    if spec.backend == "dask":
        from patronus_tasks.integrations.dask import dask_task_runner

        return dask_task_runner(spec.dask_address)
    return spec.task_runner
