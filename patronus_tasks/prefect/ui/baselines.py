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
from patronus_tasks.prefect.ui.asking import Found
from patronus_tasks.prefect.ui.keys import artifact_key
from patronus_tasks.prefect.ui.series import experiment_at
from patronus_tasks.prefect.ui.writes import Write, apply
from patronus_tasks.report.markdown import label, text
from patronus_tasks.results.compare import run_label
from patronus_tasks.results.experiment import Experiment

if TYPE_CHECKING:
    from patronus_tasks.prefect.internal import ApiClient


def description(series: str, name: str, how: str) -> str:
    """The baseline link's description: the run, how and when it became the baseline, the
    whole series (`series_link` checks it)."""
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"{text(name)}: {how} {when} (series {text(series)})"


def baseline_write(series: str, experiment: Experiment, flow_run_id: str | None,
                   how: str = "accepted") -> Write:
    """``experiment`` as its series' baseline: a new version of ``<series>-baseline`` on
    ``flow_run_id`` (the flow run that accepts it, or the series' first run)."""
    target, _ = results_link(experiment.results_path)
    name = run_label(experiment)
    return Write("artifact", flow_run_id, made.link_data(target, label(name)), "markdown",
                 artifact_key(series, "baseline"), description(series, name, how))


async def record(series: str, experiment: Experiment, client: ApiClient,
                 flow_run_id: str | None, how: str = "accepted") -> str:
    """Make ``experiment`` its series' baseline (`baseline_write`); say so."""
    await apply(client, baseline_write(series, experiment, flow_run_id, how))
    return (f"{series}: the baseline is now {run_label(experiment)} (results "
            f"{experiment.results_path}); the next runs are judged against it")


def record_first(series: str, found: Found | None, experiment: Experiment,
                 target: Target) -> None:
    """The series' first run as its baseline, once: this run when it is the first, or
    the first one found of a series from before baselines."""
    if found is not None and (found.recorded or found.how == "pinned"):
        return
    first = experiment if found is None else experiment_at(found.location, experiment)
    target.emit(baseline_write(series, first, target.flow_run_id if found is None else
                               found.flow_run_id, "first run"))
