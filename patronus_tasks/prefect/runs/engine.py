"""An experiment run by Prefect's own engine: one flow run whose task runner runs the rows.

For ``backend="dask"`` (a `DaskTaskRunner`) and any Prefect ``TaskRunner``: the flow run
is the engine's, in this process; its rows go in batches through its task runner
(`taskrunner`), and at its end it publishes and says its verdict as the recorder process
does for the default path (`postrun`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from prefect.logging import get_run_logger
from prefect.states import State

from patronus_tasks.exceptions import QualityGateError
from patronus_tasks.execute.run import run_kept
from patronus_tasks.prefect import flowruns
from patronus_tasks.prefect.clients import get_client
from patronus_tasks.prefect.protocol import Closing, Opening, ParentRun
from patronus_tasks.prefect.runs import flow as _runs
from patronus_tasks.prefect.runs.opening import opening
from patronus_tasks.prefect.runs.taskrunner import OnTaskRunner
from patronus_tasks.prefect.ui import postrun
from patronus_tasks.record.manifest_file import note_verdict
from patronus_tasks.results.experiment import Experiment
from patronus_tasks.run.spec import ExperimentSpec


async def run_on_task_runner(spec: ExperimentSpec, parent: ParentRun | None) -> Experiment:
    """Run the experiment as one flow run of Prefect's engine; raise `QualityGateError`
    when a gate failed; mark it Cancelled when interrupted."""
    o = opening(spec, parent)
    run: dict[str, str | None] = {}

    async def body(**_parameters: Any) -> State:
        run["flow_run_id"] = flow_run_id = _runs.current_flow_run_id()
        assert flow_run_id is not None
        return await EngineKeeper(spec, o, flow_run_id).run()

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


class EngineKeeper:
    """Rows on a task runner: the flow run is the engine's, this one; at its end it
    publishes the results and says the verdict as the recorder process does."""

    tally = manifest_file = None

    def __init__(self, spec: ExperimentSpec, opened: Opening, flow_run_id: str) -> None:
        self.spec, self.opened, self.flow_run_id = spec, opened, flow_run_id
        self.backend = OnTaskRunner()
        self.state: State | None = None  # what the flow run ends with, once said

    async def run(self) -> State:
        """The flow's body: the experiment, top to bottom; the state its flow run ends
        with (a failed gate's error its data: the flow run raises it)."""
        try:
            await run_kept(self.spec, self)
        except QualityGateError as exc:
            assert self.state is not None
            self.state.data = exc
        assert self.state is not None
        return self.state

    def interrupted(self, exc: BaseException) -> None:
        pass  # the flow run is ended Cancelled from outside it (`run_on_task_runner`)

    def experiment(self) -> Experiment:
        return Experiment(self.spec.out_dir)

    async def verdict(self, failures: list[str], calls: int) -> list[str]:
        """Publish the results and the comparison; log the figures on the flow run; keep
        the state it ends with."""
        o = self.opened
        closing = Closing(o.key, "completed", tuple(failures), self.spec.fail_on_regression,
                          calls, rule=self.spec.rule)
        async with get_client() as client:
            series = await flowruns.series_of(client, o.project, o.series, o.parent)
            plan = dataclasses.replace(postrun.Plan.of(o, self.flow_run_id, series),
                                       run_key=self.flow_run_id)
            verdict = await postrun.publish(plan, closing, client)
        log = get_run_logger()
        for level, line in verdict.lines:
            log.log(level, "%s", line)
        if (note := verdict.verdict_note()) is not None:  # what `verdict_state` reads, as on the default path
            note_verdict(self.spec.out_dir, note)
        self.state = verdict.state.to_prefect()
        return verdict.failures


def _task_runner(spec: ExperimentSpec) -> Any:
    """The flow run's task runner: Dask's for ``"dask"``, else the one given."""
    if spec.backend == "dask":
        from patronus_tasks.prefect.runs.dask import dask_task_runner

        return dask_task_runner(spec.dask_address)
    return spec.task_runner
