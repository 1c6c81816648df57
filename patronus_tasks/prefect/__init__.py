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

import uuid
from pathlib import Path
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
    """A flow run name saying which experiment and when: ``<experiment or project> @ <month-day
    hour:minute>`` (``text-to-sql @ 11-28 02:00``). Short: at 1,280 px the Prefect UI's
    deployment page gives a run's tags what its flow's and its own name leave, and with the
    year and the seconds the verdict's tag was left out (the run's card says its whole date).

    For flows whose parameters include ``experiment_name`` and/or ``project``:
    ``@flow(flow_run_name=experiment_flow_run_name)``.
    """
    from prefect.runtime import flow_run

    params = flow_run.parameters or {}
    name = params.get("experiment_name") or params.get("project") or flow_run.flow_name
    when = flow_run.scheduled_start_time
    return f"{name} @ {when:%m-%d %H:%M}" if when else str(name)


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


def accept_baseline(run: str | Path, results_dir: str | Path | None = None) -> str:
    """Make ``run`` (a name, run folder or path, as `load_experiment` takes it) the
    baseline of its series: the runs after it are judged against it (and against their
    previous run); a regression against the old baseline stops being kept. Returns what it
    says (the series, its new baseline).

    A run recorded on Prefect: the server keeps it (the ``<series>-baseline`` artifact; it
    needs ``PREFECT_API_URL``, and the auth string of a `patronus-tasks server up` stack),
    so every worker sees it; inside a flow run (the bundled ``accept-baseline``
    deployment), on that flow run. Any other: a file beside the results
    (``<results>/<project>/baselines.json``)."""
    import httpx

    from patronus_tasks.exceptions import ConfigError
    from patronus_tasks.results.baselines import accept_here, series_of
    from patronus_tasks.results.store import load_experiment

    experiment = load_experiment(run, results_dir)
    recorded = experiment.manifest.flow_run_id
    if recorded is None:
        return accept_here(experiment)
    from prefect.runtime import flow_run
    from prefect.settings import get_current_settings
    from prefect.utilities.asyncutils import run_coro_as_sync

    from patronus_tasks.prefect import internal
    from patronus_tasks.prefect.clients import get_client
    from patronus_tasks.prefect.ui import baselines

    url = get_current_settings().api.url
    if not url:  # Prefect would start a server of its own, and forget it at the exit
        raise ConfigError(_elsewhere(experiment, "no PREFECT_API_URL is set"))

    async def accept() -> str:
        async with get_client() as client:
            try:
                await internal.read_flow_run(client, str(uuid.UUID(recorded)))
            except httpx.HTTPStatusError as exc:
                if exc.response.status_code != 404:
                    raise
                raise ConfigError(_elsewhere(experiment, f"the Prefect API at {url} has no flow "
                                                         f"run {recorded}")) from None
            return await baselines.record(series_of(experiment), experiment, client, flow_run.id)

    return str(run_coro_as_sync(accept()))


def _elsewhere(experiment: Experiment, why: str) -> str:
    return (f"{experiment.name} was recorded on a Prefect server, which keeps its series' "
            f"baseline, and {why}: point PREFECT_API_URL at that server (a `patronus-tasks "
            "server up` stack: eval \"$(patronus-tasks server env)\" where it runs) and accept "
            "again")


__all__ = ["accept_baseline", "experiment_flow_run_name", "use_built_in_server", "verdict_state"]
