"""A sweep on Prefect: one flow run, each variant's experiment a subflow run of it.

The recorder process makes the sweep's flow run first (tagged ``sweep:<name>``, its
variants and grid among its parameters); each variant's experiment is recorded as any
experiment is (its own task runs, artifacts and series), as a subflow of the sweep's.
Once the rows are done, the sweep's process makes the matrix and the chart and hands
them over (`SweepEnd`); the sweep's flow run ends after its variants' do, its state's
message naming the best variant.
"""

from __future__ import annotations

import datetime as dt
import pickle
import time
import uuid
from typing import Any

from patronus_tasks.prefect import internal
from patronus_tasks.prefect.protocol import Closing, Opening, ParentRun, SweepEnd
from patronus_tasks.prefect.recorder.recording import Recording, open_recording
from patronus_tasks.prefect.runs.opening import flow_name, parent_run, with_context_tags
from patronus_tasks.prefect.runs.orchestrate import RecorderKeeper
from patronus_tasks.prefect.server import hook as server_hook
from patronus_tasks.record.location import Location
from patronus_tasks.run.spec import ExperimentSpec

#: Seconds `SweepRun.flow_run_id` waits for the recorder process to say the flow run's id.
FLOW_RUN_WAIT = 30.0


class SweepRun:
    """The sweep's flow run (made by the recorder process) and its variants' keepers."""

    def __init__(self, project: str, name: str, series: str, folder: Location,
                 parameters: dict[str, Any]) -> None:
        server_hook.install()  # should this process start Prefect's built-in server, ours
        internal.warn_outside_range()
        self.project, self.parent = project, parent_run()
        started = dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
        self.recording: Recording = open_recording(Opening(
            key=uuid.uuid4().hex, project=project, title=f"{project}/{name}",
            flow_name=flow_name(project), run_name=f"sweep {name} @ {started}",
            tags=with_context_tags([f"project:{project}", f"sweep:{name}"]),
            parameters=parameters, results=pickle.dumps(folder), rows=0, series=series,
            parent=self.parent, kind="sweep"))
        self.children: list[str] = []

    @property
    def inside_flow_run(self) -> bool:
        """Called inside a flow run (a deployment's): it must not end before the sweep's."""
        return self.parent is not None

    def keeper(self, spec: ExperimentSpec) -> RecorderKeeper:
        """A variant's keeper: its experiment a subflow of the sweep's flow run, its verdict
        not waiting for its records (the sweep waits for all of them at once)."""
        parent = ParentRun("", flow_name(self.project), key=self.recording.key)
        keeper = RecorderKeeper(spec, parent)
        keeper.waits = False
        self.children.append(keeper.recording.key)
        return keeper

    def end(self, artifacts: list[tuple[str, str, str]], message: str, tags: list[str],
            failed: bool) -> None:
        """Hand the sweep's end to the recorder process (it ends after its variants)."""
        self.recording.close(Closing(self.recording.key, "completed", sweep=SweepEnd(
            tuple(artifacts), message, tuple(tags), failed, tuple(self.children))))

    def interrupted(self, why: str) -> None:
        self.recording.close(Closing(self.recording.key, "interrupted", why=why, sweep=SweepEnd(
            children=tuple(self.children))))

    def flow_run_id(self, timeout: float = FLOW_RUN_WAIT) -> str | None:
        """The sweep's flow run, once the recorder process has made it (None: it could not)."""
        deadline = time.monotonic() + timeout
        while self.recording.flow_run_id is None and not self.recording.done:
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)
        return self.recording.flow_run_id

    def wait(self, timeout: float | None = None) -> bool:
        return self.recording.wait(timeout)
