"""An experiment on Prefect: the flow run, its step runner, artifacts and records."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import Any

from . import _artifacts, _local_server, _prefect
from ._events import EventStepRunner, TaskRunRecorder
from ._exceptions import ConfigError, QualityGateError
from ._experiment import Experiment, ExperimentSpec, _Tally, execute, gate_failures
from ._summary import Summary

logger = logging.getLogger("patronus_tasks")
_BANNED_IN_NAMES = str.maketrans({c: "_" for c in "/%&<>"})


async def _execute(spec: ExperimentSpec, flow_run_id: str | None, tally: _Tally,
                   last: list[str]) -> tuple[dict[str, Any], int]:
    """Run the rows; put each event recorder's last task run in ``last`` (what to wait for)."""
    if spec.task_runner is not None:
        from ._dask import run_batches

        assert flow_run_id is not None
        return await execute(spec, _prefect.PrefectStepRunner(), flow_run_id, tally,
                             batches=lambda t: run_batches(spec, flow_run_id, t, last))
    if spec.mode == "engine":
        return await execute(spec, _prefect.PrefectStepRunner(), flow_run_id, tally)
    assert flow_run_id is not None
    async with TaskRunRecorder(flow_run_id, spec.prefect_tags) as recorder:
        outcome = await execute(spec, EventStepRunner(recorder), flow_run_id, tally)
    if recorder.last_task_run_id:
        last.append(recorder.last_task_run_id)
    if recorder.lost:
        logger.error("%d of %d task-run records could not be sent to Prefect",
                     recorder.lost, recorder.lost + recorder.sent)
    return outcome


def _task_runner(spec: ExperimentSpec) -> Any:
    if spec.task_runner is None:
        return None
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():
        raise ConfigError(
            "rows on Dask workers report to a Prefect server they can reach: set "
            "PREFECT_API_URL (e.g. `patronus-tasks server up`); the built-in server is "
            "private to this process.")
    from ._dask import make_task_runner

    return make_task_runner(spec.task_runner, spec.dask_address)


async def _publish(spec: ExperimentSpec) -> tuple[Experiment, Summary]:
    """Publish the artifacts; return the experiment and its summary (read once)."""
    experiment = Experiment(spec.out_dir)
    df = experiment.to_dataframe(_artifacts.REPORT_COLUMNS)
    summary = experiment.summary(df)
    await _artifacts.publish(spec.project_name, spec.experiment_name, summary, df,
                             experiment.results_path)
    return experiment, summary


async def run_on_prefect(spec: ExperimentSpec) -> None:
    """Run the experiment as one flow run; return once the server has recorded it all.

    A failed gate fails the flow run (after results and artifacts are written) and
    raises `QualityGateError`; an interrupt (Ctrl-C, SIGTERM, cancellation) marks the flow
    run Cancelled, its completed rows kept for a resume.
    """
    run: dict[str, Any] = {"calls": 0, "last": []}

    async def body() -> None:
        from prefect.logging import get_run_logger

        run["flow_run_id"] = _prefect.current_flow_run_id()
        _local_server.hint(get_run_logger())
        tally = _Tally()
        async with _artifacts.ProgressArtifact(spec.project_name, spec.experiment_name,
                                               lambda: tally.rows, len(spec.dataset)):
            _, run["calls"] = await _execute(spec, run["flow_run_id"], tally, run["last"])
        experiment, summary = await _publish(spec)
        failures = gate_failures(spec, experiment, summary)
        if failures:
            raise QualityGateError(failures, experiment)

    started = dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    try:
        await _prefect.run_as_flow(
            body, flow_name=spec.project_name.translate(_BANNED_IN_NAMES),
            run_name=f"{spec.experiment_name} @ {started}", tags=spec.prefect_tags,
            task_runner=_task_runner(spec))
    except BaseException as exc:
        if run.get("flow_run_id") and not isinstance(exc, Exception):
            await asyncio.shield(_prefect.mark_cancelled(run["flow_run_id"], repr(exc)))
        raise
    finally:
        if run.get("flow_run_id"):
            await asyncio.shield(_prefect.wait_until_recorded(run["flow_run_id"], run["calls"],
                                                              last=run["last"]))
