"""An experiment whose rows run in batches through a Prefect task runner (Dask).

The batches are Prefect task runs submitted through the flow's task runner, so the
experiment is a flow run of Prefect's own engine in this process; its verdict is made as
the recorder process makes it for the default path (`postrun`), at the end of the flow.
"""

from __future__ import annotations

import asyncio
from typing import Any

from prefect.client.orchestration import get_client
from prefect.logging import get_run_logger
from prefect.states import State
from prefect.task_runners import TaskRunner

from patronus_tasks.exceptions import QualityGateError
from patronus_tasks.integrations.prefect import flowruns, postrun
from patronus_tasks.integrations.prefect import runs as _runs
from patronus_tasks.integrations.prefect.artifacts import Target
from patronus_tasks.integrations.prefect.protocol import ParentRun
from patronus_tasks.results.experiment import Experiment
from patronus_tasks.run.execute import RunTotals, execute, gate_failures
from patronus_tasks.run.runner import LocalStepRunner
from patronus_tasks.run.spec import ExperimentSpec


def _task_runner(spec: ExperimentSpec) -> TaskRunner[Any]:
    from patronus_tasks.integrations.dask import make_task_runner

    assert spec.task_runner is not None, "backend 'batches' runs on a task runner"
    return make_task_runner(spec.task_runner, spec.dask_address)


async def _body(spec: ExperimentSpec, parent: ParentRun | None) -> State:
    """The flow's body: the batches, then the verdict."""
    from patronus_tasks.integrations.dask import run_batches
    from patronus_tasks.integrations.prefect.orchestrate import opening

    flow_run_id = _runs.current_flow_run_id()
    assert flow_run_id is not None
    await execute(spec, LocalStepRunner(), flow_run_id, RunTotals(),
                  batches=lambda t, replay: run_batches(spec, flow_run_id, t, replay))
    o = opening(spec, parent)
    async with get_client() as client:
        series = await flowruns.series_of(client, o.project, o.series, parent)
        failures = gate_failures(spec, Experiment(spec.out_dir))
        publishing = postrun.Publishing(
            Target(client, flow_run_id, flow_run_id), series, o.title, spec.out_dir,
            parent.flow_run_id if parent else None, spec.html_report)
        verdict = await postrun.publish(publishing, failures, spec.fail_on_regression)
    log = get_run_logger()
    for level, line in verdict.lines:
        log.log(level, "%s", line)
    if verdict.failures:
        verdict.state.data = QualityGateError(verdict.failures, Experiment(spec.out_dir))
    return verdict.state


async def run_in_batches(spec: ExperimentSpec, parent: ParentRun | None) -> Experiment:
    """Run the experiment's batches as one flow run of Prefect's engine; raise
    `QualityGateError` when a gate failed; mark it Cancelled when interrupted."""
    from patronus_tasks.integrations.prefect.orchestrate import flow_parameters, opening

    o = opening(spec, parent)
    run: dict[str, str | None] = {}

    async def body(**_parameters: Any) -> State:
        run["flow_run_id"] = _runs.current_flow_run_id()
        return await _body(spec, parent)

    try:
        await _runs.run_as_flow(body, flow_name=o.flow_name, run_name=o.run_name,
                                tags=list(o.tags), parameters=flow_parameters(spec),
                                task_runner=_task_runner(spec))
    except QualityGateError as exc:
        exc.experiment = Experiment(spec.out_dir)
        raise
    except BaseException as exc:
        if run.get("flow_run_id") and not isinstance(exc, Exception):
            await asyncio.shield(_runs.mark_cancelled(str(run["flow_run_id"]), repr(exc)))
        raise
    return Experiment(spec.out_dir)

