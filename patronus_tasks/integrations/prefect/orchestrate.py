"""An experiment on Prefect: its flow run, its calls recorded as task runs, its verdict.

The default path runs the rows here and hands every call to the recorder process
(`recording`), which keeps the flow run: nothing of Prefect is in front of the results.
Rows in batches through a Prefect task runner (Dask) run in a flow run of Prefect's own
engine in this process (`engine`).
"""

from __future__ import annotations

import asyncio
import logging
import sys

from patronus_tasks.exceptions import QualityGateError
from patronus_tasks.integrations.prefect import calls as _calls
from patronus_tasks.integrations.prefect import server_hook
from patronus_tasks.integrations.prefect.opening import opening, parent_run
from patronus_tasks.integrations.prefect.protocol import Closing
from patronus_tasks.integrations.prefect.recording import Recording, open_recording
from patronus_tasks.results.experiment import Experiment
from patronus_tasks.run.execute import ManifestFile, execute, gate_failures
from patronus_tasks.run.loop import RunTotals
from patronus_tasks.run.spec import ExperimentSpec

logger = logging.getLogger("patronus_tasks")


async def run_on_prefect(spec: ExperimentSpec) -> Experiment:
    """Run the experiment as one flow run; return as soon as its results are written.

    Its flow run, task runs, artifacts and final state follow from the recorder process.
    Called inside a flow run (a deployment's, say), this waits for them, so that flow run
    cannot end first. A failed gate raises `QualityGateError` (``fail_on_regression``
    waits for the comparison with the previous run: the server knows that run); an
    interrupt (Ctrl-C, SIGTERM) keeps the completed rows and ends the flow run Cancelled.
    """
    server_hook.install()  # should this process start Prefect's built-in server, ours
    if spec.backend != "prefect":  # rows on a task runner: a flow run of Prefect's engine
        from patronus_tasks.integrations.prefect.engine import run_on_task_runner

        return await run_on_task_runner(spec, parent_run())
    parent = parent_run()
    manifest = ManifestFile(spec.out_dir)
    recording = open_recording(opening(spec, parent), on_progress=manifest.note_records)
    note = server_hook.startup_note()  # a user's flow started the built-in server here
    if note:
        print(f"patronus-tasks: {note}", file=sys.stderr, flush=True)
    tally = recording.tally = RunTotals()
    try:
        _, calls = await execute(spec, _calls.Recorded(recording, spec.record), tally=tally,
                                 manifest_file=manifest)
    except BaseException as exc:
        recording.close(Closing(recording.key, "interrupted", why=repr(exc)))
        raise
    experiment = Experiment(spec.out_dir, recording, live=manifest)
    failures = gate_failures(spec, experiment)
    recording.close(Closing(recording.key, "completed", tuple(failures),
                            spec.fail_on_regression, calls))
    failures = await _verdict(spec, recording, failures)
    if parent is not None:
        await _caught_up(recording)
    if failures:
        raise QualityGateError(failures, experiment)
    return experiment


async def _verdict(spec: ExperimentSpec, recording: Recording, failures: list[str]) -> list[str]:
    """The gates that failed: those checked here, and (``fail_on_regression``) the
    comparison with the previous run, which the recorder process makes."""
    if not spec.fail_on_regression:
        return failures
    said = await asyncio.to_thread(recording.wait_verdict)
    return failures if said is None else said


async def _caught_up(recording: Recording) -> None:
    """Inside a flow run, wait for the records (that flow run must not end first)."""

    def report(r: Recording) -> None:
        logger.info("waiting for %s", r.describe())

    await recording.until_recorded(report)
