"""An experiment on Prefect: its flow run, its calls recorded as task runs, its verdict.

The default path runs the rows here and hands every call to the recorder process
(`recording`), which keeps the flow run: nothing of Prefect is in front of the results.
Rows in batches through a Prefect task runner (Dask) run in a flow run of Prefect's own
engine in this process.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import pickle
import sys
import uuid
from typing import Any

from patronus_tasks.exceptions import QualityGateError
from patronus_tasks.integrations.prefect import calls as _calls
from patronus_tasks.integrations.prefect import server_hook
from patronus_tasks.integrations.prefect import steplogs as _steplogs
from patronus_tasks.integrations.prefect.protocol import Closing, Opening, ParentRun
from patronus_tasks.integrations.prefect.recording import Recording, open_recording
from patronus_tasks.record.manifest_file import ManifestFile
from patronus_tasks.results.experiment import Experiment
from patronus_tasks.run.execute import RunTotals, execute, gate_failures
from patronus_tasks.run.spec import ExperimentSpec

logger = logging.getLogger("patronus_tasks")
_BANNED_IN_NAMES = str.maketrans({c: "_" for c in "/%&<>"})


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


def parent_run() -> ParentRun | None:
    """The flow run this code runs in (a user's ``@flow``, a deployment's), if any.

    Only a process that loaded Prefect can be in one: others never import it here."""
    if "prefect.context" not in sys.modules:
        return None
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    if ctx is None or ctx.flow_run is None:
        return None
    deployment = ctx.flow_run.deployment_id
    return ParentRun(str(ctx.flow_run.id), ctx.flow.name if ctx.flow else ctx.flow_run.name,
                     str(deployment) if deployment else None)


def _tags(spec: ExperimentSpec) -> tuple[str, ...]:
    """The experiment's tags, and those of a ``prefect.tags`` block it runs in."""
    tags = list(spec.prefect_tags)
    if "prefect.context" in sys.modules:
        from prefect.context import TagsContext

        tags += sorted(TagsContext.get().current_tags)
    return tuple(dict.fromkeys(tags))


def opening(spec: ExperimentSpec, parent: ParentRun | None) -> Opening:
    """The experiment's flow run as the recorder process creates it."""
    started = dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    return Opening(
        key=uuid.uuid4().hex, project=spec.project_name,  # this run's: a resume is another
        title=f"{spec.project_name}/{spec.experiment_name}",
        flow_name=spec.project_name.translate(_BANNED_IN_NAMES),
        run_name=f"{spec.experiment_name} @ {started}", tags=_tags(spec),
        parameters=flow_parameters(spec), results=pickle.dumps(spec.out_dir), rows=spec.runs,
        series=spec.series, parent=parent, record=spec.record, persisting=_persisting(),
        html_report=spec.html_report)


def _persisting() -> bool | None:
    """Whether the server stores events: known when it is this process's built-in one."""
    server = server_hook.built_in()
    return None if server is None else bool(server.persisting)


async def run_on_prefect(spec: ExperimentSpec) -> Experiment:
    """Run the experiment as one flow run; return as soon as its results are written.

    Its flow run, task runs, artifacts and final state follow from the recorder process.
    Called inside a flow run (a deployment's, say), this waits for them, so that flow run
    cannot end first. A failed gate raises `QualityGateError` (``fail_on_regression``
    waits for the comparison with the previous run: the server knows that run); an
    interrupt (Ctrl-C, SIGTERM) keeps the completed rows and ends the flow run Cancelled.
    """
    server_hook.install()  # should this process start Prefect's built-in server, ours
    if spec.backend == "batches":
        from patronus_tasks.integrations.prefect.batches import run_in_batches

        return await run_in_batches(spec, parent_run())
    parent = parent_run()
    manifest = ManifestFile(spec.out_dir)
    recording = open_recording(opening(spec, parent), on_progress=manifest.note_records)
    note = server_hook.startup_note()  # a user's flow started the built-in server here
    if note:
        print(f"patronus-tasks: {note}", file=sys.stderr, flush=True)
    tally = recording.tally = RunTotals()
    try:
        with _steplogs.capture():
            _, calls = await execute(spec, _calls.RecordingStepRunner(recording, spec.record),
                                     tally=tally, manifest_file=manifest)
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
