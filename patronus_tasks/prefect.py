"""What a Prefect flow that runs experiments may want from this package."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from patronus_tasks.integrations.prefect import server_hook
from patronus_tasks.integrations.prefect.runs import experiment_flow_run_name

if TYPE_CHECKING:
    from prefect.states import State

    from patronus_tasks.results.experiment import Experiment


def use_built_in_server() -> None:
    """Let Prefect's built-in server, when this process starts one, be this package's:
    it waits up to 120 s for a new database's migrations (Prefect's own gives up after
    20 s, which a fresh 2-core machine needs), runs lean, below normal priority, and dies
    with the process. Call it before a ``@flow`` of yours runs without
    ``PREFECT_API_URL``; experiments and ``patronus-tasks run`` do it themselves."""
    server_hook.install()


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
