"""A series' accepted baseline off Prefect: a small file in the project's results folder.

On Prefect the server keeps a series' baseline (`prefect.ui.baselines`): every worker asks
the same server. A run not kept on Prefect (``backend="local"``) has no server to ask;
what every process that reads its results sees is its results folder, so the accepted
baseline is kept beside them: ``<results>/<project>/baselines.json``, ``{series: {"run":
its folder, "name": its name, "accepted_at": when}}`` (one project's series in one file:
a run's folder is under its project's).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from patronus_tasks.record.location import Location
from patronus_tasks.record.manifest import VerdictNote
from patronus_tasks.results.compare import compare_experiments, run_label
from patronus_tasks.results.experiment import Experiment
from patronus_tasks.results.verdict import Baseline, Rule, judge

FILE = "baselines.json"


def series_of(experiment: Experiment) -> str:
    """The series a run is judged in: its manifest's (on Prefect), else its project."""
    return experiment.manifest.series or experiment.project


def _read(path: Location) -> dict[str, Any]:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):  # none yet, or not ours to trust: none accepted
        return {}
    return found if isinstance(found, dict) else {}


def accept_here(experiment: Experiment) -> str:
    """Make ``experiment`` its series' baseline in its project's results folder; say so."""
    path = experiment.location.parent / FILE
    kept = _read(path)
    series, name = series_of(experiment), run_label(experiment)
    kept[series] = {"run": experiment.location.name, "name": name,
                    "accepted_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
    path.write_bytes((json.dumps(kept, indent=2) + "\n").encode())
    return (f"{series}: the baseline is now {name} ({experiment.location}), kept in {path}; "
            "the next runs are judged against it")


def accepted_here(project: Location, series: str) -> Experiment | None:
    """The run accepted as ``series``' baseline in the project folder ``project``, if any
    (and still there)."""
    found = _read(project / FILE).get(series)
    if not isinstance(found, dict) or not isinstance(found.get("run"), str):
        return None
    folder = project / found["run"]
    return Experiment(folder) if (folder / "manifest.json").exists() else None


def judged_here(experiment: Experiment, rule: Rule, pinned: str | None = None) -> VerdictNote | None:
    """A run not kept on Prefect against its baseline: ``pinned`` (a run's results link,
    ``baseline=``) or the one accepted beside its results; None when it has neither."""
    base = (Experiment(Location.of(pinned).parent) if pinned is not None
            else accepted_here(experiment.location.parent, series_of(experiment)))
    if base is None or base.location == experiment.location:
        return None
    comparison = compare_experiments(base, experiment)
    how = "pinned" if pinned is not None else "accepted"
    return judge(experiment.summary(), None, rule, baseline=Baseline(comparison.a, how, comparison))
