"""An experiment on Prefect: the flow run, its step runner, artifacts and records."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from . import _artifacts, _prefect
from ._events import EventStepRunner, TaskRunRecorder
from ._experiment import Experiment, ExperimentSpec, _Tally, execute

logger = logging.getLogger("patronus_tasks")
_BANNED_IN_NAMES = str.maketrans({c: "_" for c in "/%&<>"})


async def _execute(spec: ExperimentSpec, flow_run_id: str | None, tally: _Tally
                   ) -> tuple[dict[str, Any], int]:
    if spec.mode == "engine":
        return await execute(spec, _prefect.PrefectStepRunner(), flow_run_id, tally)
    assert flow_run_id is not None
    async with TaskRunRecorder(flow_run_id, spec.prefect_tags) as recorder:
        outcome = await execute(spec, EventStepRunner(recorder), flow_run_id, tally)
    if recorder.lost:
        logger.error("%d of %d task-run records could not be sent to Prefect",
                     recorder.lost, recorder.lost + recorder.sent)
    return outcome


async def _publish(spec: ExperimentSpec) -> None:
    experiment = Experiment(spec.out_dir)
    df = experiment.to_dataframe()
    await _artifacts.publish(spec.project_name, spec.experiment_name, experiment.summary(df), df,
                             experiment.results_path)


async def run_on_prefect(spec: ExperimentSpec) -> dict[str, Any]:
    """Run the experiment as one flow run; return once the server has recorded it all."""

    async def body() -> tuple[dict[str, Any], int]:
        tally = _Tally()
        async with _artifacts.ProgressArtifact(spec.project_name, spec.experiment_name,
                                               lambda: tally.rows, len(spec.dataset)):
            outcome = await _execute(spec, _prefect.current_flow_run_id(), tally)
        await _publish(spec)
        return outcome

    started = dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    manifest, calls = await _prefect.run_as_flow(
        body, flow_name=spec.project_name.translate(_BANNED_IN_NAMES),
        run_name=f"{spec.experiment_name} @ {started}", tags=spec.prefect_tags)
    await _prefect.wait_until_recorded(manifest["flow_run_id"], calls)
    return manifest
