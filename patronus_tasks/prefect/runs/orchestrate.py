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

from patronus_tasks.execute.run import run_kept
from patronus_tasks.prefect import internal
from patronus_tasks.prefect.protocol import Closing, ParentRun
from patronus_tasks.prefect.recorder.recording import Recording, open_recording
from patronus_tasks.prefect.runs.calls import Recorded
from patronus_tasks.prefect.runs.opening import opening, parent_run
from patronus_tasks.prefect.server import hook as server_hook
from patronus_tasks.record.manifest_file import ManifestFile
from patronus_tasks.results.experiment import Experiment
from patronus_tasks.run import background as _background
from patronus_tasks.run.background import WaitLine
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
    internal.warn_outside_range()
    if spec.backend != "prefect":  # rows on a task runner: a flow run of Prefect's engine
        from patronus_tasks.prefect.runs.engine import run_on_task_runner

        return await run_on_task_runner(spec, parent_run())
    keeper = RecorderKeeper(spec, parent_run())
    note = server_hook.startup_note()  # a user's flow started the built-in server here
    if note:
        print(f"patronus-tasks: {note}", file=sys.stderr, flush=True)
    return await run_kept(spec, keeper)


class RecorderKeeper:
    """``"prefect"``: the rows run here (`Recorded`), each call handed to the recorder
    process, which keeps the flow run, publishes the results and says the verdict."""

    flow_run_id = None  # the recorder process's, told later (`manifest_file` notes it)

    def __init__(self, spec: ExperimentSpec, parent: ParentRun | None) -> None:
        self.spec, self.parent = spec, parent
        #: Inside a flow run, the verdict waits for the records (that run must not end
        #: first); a sweep's variant does not: the sweep waits for them all at once.
        self.waits = parent is not None
        self.manifest_file = ManifestFile(spec.out_dir)
        self.recording = open_recording(opening(spec, parent),
                                        on_progress=self.manifest_file.note_records)
        self.tally = self.recording.tally = RunTotals()
        self.backend = Recorded(self.recording, spec.record)

    def interrupted(self, exc: BaseException) -> None:
        total = len(self.spec.dataset) * self.spec.repeats
        why = (f"{_stopped_by(exc)} after {self.tally.rows} of {total} rows (they are kept: "
               "resume=True goes on with the rest)")
        self.recording.close(Closing(self.recording.key, "interrupted", why=why))

    def experiment(self) -> Experiment:
        """The experiment, returned while Prefect catches up with its records."""
        return Experiment(self.spec.out_dir, self.recording, live=self.manifest_file)

    async def verdict(self, failures: list[str], calls: int) -> list[str]:
        """The gates that failed: those checked here, and (``fail_on_regression``) the
        comparison with the previous run, which the recorder process makes. Inside a
        flow run, once the records are in (that flow run must not end first)."""
        spec, recording = self.spec, self.recording
        recording.close(Closing(recording.key, "completed", tuple(failures),
                                spec.fail_on_regression, calls, rule=spec.rule))
        if spec.fail_on_regression:
            said = await asyncio.to_thread(recording.wait_verdict)
            failures = failures if said is None else said
        if self.waits:
            line = WaitLine("the flow run waits for {what} ({seconds:.0f} s so far; the "
                            "results are written already)")
            await recording.until_recorded(lambda r: _waiting(r, line))
        return failures


def _waiting(recording: Recording, line: WaitLine) -> None:
    """Inside a flow run, the wait for its records, in its log and on the console (the log
    alone left the command silent for a minute after its last row)."""
    what = recording.describe()
    logger.info("waiting for %s", what)
    line.say(what)


def _stopped_by(exc: BaseException) -> str:
    """What stopped the rows, as a person says it (it was ``CancelledError()``)."""
    interrupt = isinstance(exc, KeyboardInterrupt | asyncio.CancelledError)
    if interrupt and _background.stopped_by:
        return f"stopped by {_background.stopped_by[-1]}"
    if isinstance(exc, KeyboardInterrupt):
        return "stopped by Ctrl-C"
    if isinstance(exc, asyncio.CancelledError):
        return "cancelled (Ctrl-C, or its flow run cancelled)"
    return f"stopped by {type(exc).__name__}: {exc}"
