"""Making an experiment's HTML report and writing it beside its results."""

from __future__ import annotations

import logging
from pathlib import Path

from patronus_tasks.record.location import Location
from patronus_tasks.record.manifest import VerdictNote
from patronus_tasks.report.page import ReportInput, render
from patronus_tasks.results.compare import Comparison, compare_experiments
from patronus_tasks.results.experiment import Experiment
from patronus_tasks.results.store import as_experiment

logger = logging.getLogger("patronus_tasks")
#: The report's name in the experiment's folder, beside ``results.parquet``.
REPORT_FILE = "report.html"


def build_report(experiment: Experiment, against: Experiment | Comparison | None = None,
                 drawn: dict[str, bytes | None] | None = None,
                 verdict: VerdictNote | None = None) -> str:
    """The experiment as one self-contained HTML page; ``against``: another run (the
    baseline, compared row by row) or a comparison already made; ``drawn``: its charts
    drawn already (`charts.draw`, by name); ``verdict``: what its header states (else
    the manifest's, once the run has one)."""
    df = experiment.to_dataframe()
    comparison = (compare_experiments(against, experiment) if isinstance(against, Experiment)
                  else against)
    return render(ReportInput(experiment, df, experiment.summary(df), comparison, drawn,
                              verdict or experiment.manifest.verdict))


def write_report(experiment: Experiment | str | Path,
                 against: Experiment | Comparison | str | Path | None = None,
                 path: str | Path | Location | None = None,
                 drawn: dict[str, bytes | None] | None = None,
                 verdict: VerdictNote | None = None) -> Path | Location:
    """Write the report (to ``path``, else beside the results: ``report.html``, or with
    an ``against`` experiment ``report-vs-<its folder>.html``, leaving the run's own
    report as it is; with a `Comparison`, as the post-run writer passes, ``report.html``);
    return where it is (a `Path` when local). Experiments by object or by what
    `load_experiment` takes (a folder, ``project/name``, a name under the default results
    directory)."""
    experiment = as_experiment(experiment)
    if isinstance(against, str | Path):
        against = as_experiment(against)
    if path is not None:
        target = Location.of(path)
    elif isinstance(against, Experiment):
        target = experiment.location / f"report-vs-{against.location.name}.html"
    else:
        target = experiment.location / REPORT_FILE
    target.write_bytes(build_report(experiment, against, drawn, verdict).encode("utf-8"))
    return target.local if target.local is not None else target


def report_after_run(experiment: Experiment, comparison: Comparison | None = None,
                     drawn: dict[str, bytes | None] | None = None,
                     verdict: VerdictNote | None = None) -> Path | Location | None:
    """`write_report` after a run: a report that cannot be made is a warning, never the
    run's failure (its results are written already)."""
    try:
        return write_report(experiment, comparison, drawn=drawn, verdict=verdict)
    except Exception as exc:
        logger.warning("could not write the HTML report of %s: %s: %s", experiment.name,
                       type(exc).__name__, exc)
        return None
