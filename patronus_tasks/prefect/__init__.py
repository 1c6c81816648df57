"""Everything of Prefect: where experiments meet it, and the face a ``@flow`` of yours uses.

    runs/      an experiment as a flow run: the engine, the task runner, Dask, the calls
    recorder/  the recorder process: its channel, backlog, pacing, task-run and flow-run posting
    ui/        what the Prefect UI shows: artifacts, charts, series, links, progress
    server/    the Prefect servers: the built-in one, ``server up``, the production stack
    internal.py, events.py, clients.py (lean.py, client_settings.py), flowruns.py, states.py
               Prefect's internals this package relies on, its event format, its clients
               (the recorder's over plain httpx when the environment gives their settings),
               flow runs and their states through the API

May import: Prefect, and every layer of this package below it (`define`, `run`,
`record`, `results`, `report`, the ground modules); nothing imports it but `api`, `cli`,
`client` and the package's face. Importing this module is cheap: the recorder process
imports its submodules through it, so the face's functions import what they need when
called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prefect.states import State

    from patronus_tasks.results.experiment import Experiment


def use_built_in_server() -> None:
    """Let Prefect's built-in server, when this process starts one, be this package's:
    it waits up to 120 s for a new database's migrations (Prefect's own gives up after
    20 s, which a fresh 2-core machine needs), runs lean, below normal priority, and dies
    with the process. Call it before a ``@flow`` of yours runs without
    ``PREFECT_API_URL``; experiments and ``patronus-tasks run`` do it themselves."""
    from patronus_tasks.prefect.server import hook

    hook.install()


def experiment_flow_run_name() -> str:
    """A flow run name saying which experiment and when: ``<experiment or project> @ <time>``.

    For flows whose parameters include ``experiment_name`` and/or ``project``:
    ``@flow(flow_run_name=experiment_flow_run_name)``.
    """
    from prefect.runtime import flow_run

    params = flow_run.parameters or {}
    name = params.get("experiment_name") or params.get("project") or flow_run.flow_name
    when = flow_run.scheduled_start_time
    return f"{name} @ {when:%Y-%m-%d %H:%M:%S}" if when else str(name)


def verdict_state(experiment: Experiment, timeout: float | None = 300) -> State[Any]:
    """The state a flow that ran ``experiment`` ends in: ``return verdict_state(exp)``.

    Completed, its message the verdict against the previous run of its series
    (``Regressed``, ``Errors``, ``Improved``, ``Unchanged``, ``First run``;
    `results.verdict`) and the figures ("Regressed: result_matches_gold worse: 3 worse / 0
    better rows; 66.7% → 33.3% ..."), its data the manifest; the run's tags (``regressed``,
    ``regressed:<evaluator>``, ``errors``), which the recorder adds, show in every list.
    Its name stays Prefect's own: the UI's run lists filter by state name, and a run in a
    state named "Regressed" is left out of its deployment's page. A gate that failed raised
    `QualityGateError` already: the flow run fails with it. Waits (up to ``timeout`` s)
    for the recording, which says the verdict; an experiment not kept on Prefect
    (``backend="local"``) gets one from its figures alone.
    """
    from prefect.states import Completed, Failed

    from patronus_tasks.results.verdict import Rule, judge

    experiment.wait_recorded(timeout)
    manifest = experiment.manifest
    note = manifest.verdict or judge(experiment.summary(), None, Rule())
    kind = Failed if note.failures else Completed
    return kind(message=note.message, data=manifest.to_json())


__all__ = ["experiment_flow_run_name", "use_built_in_server", "verdict_state"]
