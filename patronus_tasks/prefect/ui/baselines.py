"""A series' baseline on Prefect: the run each night is judged against besides the previous
one (`results.verdict.Baseline`), kept until someone accepts another.

The server is the registry every worker sees (a file beside the results would be one
worker's, and a bucket's results folder has no lock): the baseline is the latest version
of the series' ``<series>-baseline`` link artifact, which links to the run's results and
names the whole series in its description (as the results link does: two series whose
keys shorten alike are told apart). The first run of a series makes the first version
("first run"); `accept` adds one ("accepted"). A link artifact, not a Prefect Variable:
the key's history in the UI is then which run was the baseline, since when and how, each
version a link to that run's results, where a Variable keeps one value and overwrites it.
A series from before baselines has none until its next run finds its first run (its
oldest results link) and records it.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from patronus_tasks.prefect.ui import made
from patronus_tasks.prefect.ui.artifacts import Target, results_link
from patronus_tasks.prefect.ui.keys import artifact_key
from patronus_tasks.prefect.ui.series import Found, experiment_at, series_link
from patronus_tasks.report.markdown import label, text
from patronus_tasks.results.compare import run_label
from patronus_tasks.results.experiment import Experiment

if TYPE_CHECKING:
    from patronus_tasks.prefect.internal import ApiClient


async def find(series: str, client: ApiClient, pinned: str | None = None) -> Found | None:
    """The run ``series`` is judged against: ``pinned`` (a run's results link, given in
    code), else its baseline (accepted, or its first run; None: it has no run yet)."""
    if pinned is not None:
        return Found(pinned, None, "pinned")
    kept = await series_link(series, "baseline", client)
    if kept is not None:
        run, said = kept
        how = "accepted" if ": accepted " in said else "first run"
        return Found(run.location, run.flow_run_id, how)
    first = await series_link(series, "results", client, oldest=True)  # from before baselines
    return None if first is None else Found(first[0].location, first[0].flow_run_id,
                                            "first run", recorded=False)


def description(series: str, name: str, how: str) -> str:
    """The baseline link's description: the run, how and when it became the baseline, the
    whole series (`series_link` checks it)."""
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"{text(name)}: {how} {when} (series {text(series)})"


async def record(series: str, experiment: Experiment, client: ApiClient,
                 flow_run_id: str | None, how: str = "accepted") -> str:
    """Make ``experiment`` its series' baseline (a new version of ``<series>-baseline`` on
    ``flow_run_id``, the flow run that accepts it or the series' first run); say so."""
    target, _ = results_link(experiment.results_path)
    name = run_label(experiment)
    await made.create(client, "markdown", made.link_data(target, label(name)), flow_run_id,
                      key=artifact_key(series, "baseline"),
                      description=description(series, name, how))
    return (f"{series}: the baseline is now {name} (results {experiment.results_path}); the "
            "next runs are judged against it")


async def record_first(series: str, found: Found | None, experiment: Experiment,
                       target: Target) -> None:
    """The series' first run as its baseline, once: this run when it is the first, or
    the first one found of a series from before baselines."""
    if found is not None and (found.recorded or found.how == "pinned"):
        return
    first = experiment if found is None else experiment_at(found.location, experiment)
    await record(series, first, target.client, target.flow_run_id if found is None else
                 found.flow_run_id, "first run")
