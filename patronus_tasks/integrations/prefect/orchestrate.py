"""An experiment on Prefect: the flow run, its calls recorded as task runs, its artifacts."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import Any

from prefect.states import Completed, Failed, State

from patronus_tasks.exceptions import QualityGateError
from patronus_tasks.integrations.prefect import artifacts as _artifacts
from patronus_tasks.integrations.prefect import runs as _prefect
from patronus_tasks.integrations.prefect import series as _series
from patronus_tasks.integrations.prefect import server_hook as _server_hook
from patronus_tasks.integrations.prefect import steplogs as _steplogs
from patronus_tasks.integrations.prefect.charts import publish_charts
from patronus_tasks.integrations.prefect.recorder import TaskRunRecorder
from patronus_tasks.results.experiment import Experiment
from patronus_tasks.results.summary import Summary
from patronus_tasks.run.execute import ManifestFile, RunTotals, execute, gate_failures
from patronus_tasks.run.runner import LocalStepRunner
from patronus_tasks.run.spec import ExperimentSpec

logger = logging.getLogger("patronus_tasks")
_BANNED_IN_NAMES = str.maketrans({c: "_" for c in "/%&<>"})


async def _rows_here(spec: ExperimentSpec, flow_run_id: str, tally: RunTotals,
                     run: dict[str, Any]) -> None:
    """Run the rows in this process, each call recorded by a recorder that goes on in the
    background once the rows are done."""
    manifest = ManifestFile(spec.out_dir)
    recorder = TaskRunRecorder(flow_run_id, spec.prefect_tags, on_progress=manifest.note_records,
                               label=f"{spec.project_name}/{spec.experiment_name}").start()
    run["recorder"] = recorder
    try:
        with _steplogs.capture():
            await execute(spec, _prefect.RecordingStepRunner(recorder), flow_run_id, tally,
                          manifest_file=manifest)
    finally:
        recorder.close()
        manifest.note_records(recorder)  # how many Prefect holds so far, with the results


async def _rows_in_batches(spec: ExperimentSpec, flow_run_id: str, tally: RunTotals) -> None:
    """Run the rows in batches through the flow's task runner; each batch waits for its
    records before it ends."""
    from patronus_tasks.integrations.dask import run_batches

    await execute(spec, LocalStepRunner(), flow_run_id, tally,
                  batches=lambda t, replay: run_batches(spec, flow_run_id, t, replay))


def flow_parameters(spec: ExperimentSpec) -> dict[str, Any]:
    """What the experiment's flow run shows as its parameters: what ran, on what data."""
    tasks = [lk.task.name for lk in spec.links if lk.task]
    return {
        "project": spec.project_name, "experiment_name": spec.experiment_name,
        "dataset": spec.dataset.source or "(in memory)",
        "dataset_sha256": spec.dataset.content_hash(), "rows": len(spec.dataset),
        "tags": spec.tags, "task": ", ".join(tasks) or None,
        "evaluators": [e.name for lk in spec.links for e in lk.evaluators],
        "max_concurrency": spec.max_concurrency, "series": spec.series,
        "fail_on_regression": spec.fail_on_regression,
    }


async def _publish(spec: ExperimentSpec, title: str) -> tuple[Experiment, Summary]:
    """Publish the artifacts; return the experiment and its summary (read once)."""
    experiment = Experiment(spec.out_dir)
    df = experiment.to_dataframe(_artifacts.REPORT_COLUMNS)
    summary = experiment.summary(df)
    await _artifacts.publish(_series_key(spec), title, summary, df, experiment.results_path,
                             experiment)
    return experiment, summary


def _series_key(spec: ExperimentSpec) -> str:
    return spec.series or spec.project_name


async def _verdict(spec: ExperimentSpec, title: str, log: Any) -> State:
    """Publish the results and the comparison; the flow run's final state says the
    figures (its message, and the last log lines), failed when a gate failed."""
    previous = await _series.previous_run(_series_key(spec))  # before ours is published
    experiment, summary = await _publish(spec, title)
    comparison = await _series.publish_comparison(_series_key(spec), title, previous, experiment)
    history = await _series.publish_history(_series_key(spec),
                                            _series.history_row(experiment, summary, comparison))
    await publish_charts(_series_key(spec), title, experiment, summary, comparison, history,
                         spec.html_report)  # the report file, the charts, the parent's figures
    failures = gate_failures(spec, experiment, summary)
    if spec.fail_on_regression:
        failures += _series.regression_failures(comparison)
    message = f"{summary.headline()}. Results: {experiment.results_path}"
    for line in (*summary.headlines(), _series.headline(comparison),
                 f"results: {experiment.results_path}"):
        log.info("%s", line)
    if failures:
        for failure in failures:
            log.error("quality gate failed: %s", failure)
        return Failed(message=f"quality gate failed: {'; '.join(failures)}. {message}",
                      data=QualityGateError(failures, experiment))
    return Completed(message=message)


def _task_runner(spec: ExperimentSpec) -> Any:
    if spec.task_runner is None:
        return None
    from patronus_tasks.integrations.dask import make_task_runner

    return make_task_runner(spec.task_runner, spec.dask_address)


async def run_on_prefect(spec: ExperimentSpec) -> Experiment:
    """Run the experiment as one flow run; return as soon as its results are written.

    The records Prefect has not taken yet follow in the background; called inside a flow
    run (a deployment's, say), this waits for them, so that flow run cannot end first.
    A failed gate fails the flow run (after results and artifacts are written) and raises
    `QualityGateError`; an interrupt (Ctrl-C, SIGTERM, cancellation) marks the flow run
    Cancelled, its completed rows kept for a resume.
    """
    run: dict[str, Any] = {}
    spec.series = await _series.series_of(spec.project_name, spec.series)  # the parent's
    title = f"{spec.project_name}/{spec.experiment_name}"

    async def body(**_parameters: Any) -> State:
        from prefect.logging import get_run_logger

        flow_run_id = run["flow_run_id"] = _prefect.current_flow_run_id()
        assert flow_run_id is not None
        _server_hook.hint(get_run_logger())
        tally = RunTotals()
        async with _artifacts.ProgressArtifact(_series_key(spec), lambda: tally.rows,
                                               len(spec.dataset)):
            if spec.backend == "batches":
                await _rows_in_batches(spec, flow_run_id, tally)
            else:
                await _rows_here(spec, flow_run_id, tally, run)
        return await _verdict(spec, title, get_run_logger())

    started = dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    try:
        await _prefect.run_as_flow(
            body, flow_name=spec.project_name.translate(_BANNED_IN_NAMES),
            run_name=f"{spec.experiment_name} @ {started}", tags=spec.prefect_tags,
            parameters=flow_parameters(spec), task_runner=_task_runner(spec))
    except QualityGateError as exc:
        exc.experiment = Experiment(spec.out_dir, run.get("recorder"))
        await _caught_up(run.get("recorder"))
        raise
    except BaseException as exc:
        if run.get("flow_run_id") and not isinstance(exc, Exception):
            await asyncio.shield(_prefect.mark_cancelled(run["flow_run_id"], repr(exc)))
        raise
    await _caught_up(run.get("recorder"))
    return Experiment(spec.out_dir, run.get("recorder"))


async def _caught_up(recorder: TaskRunRecorder | None) -> None:
    """Inside a flow run, wait for the records (that flow run must not end first)."""
    if recorder is None or _prefect.current_flow_run_id() is None:
        return

    def report(r: TaskRunRecorder) -> None:
        logger.info("waiting for Prefect to record %s", r.describe())

    await recorder.until_recorded(report)
