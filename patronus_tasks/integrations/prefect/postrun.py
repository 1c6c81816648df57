"""After an experiment's rows: its artifacts, the comparison with its series' previous
run, and the verdict its flow run ends with, top to bottom.

Runs where the records are kept (the recorder process, or the flow of Dask batches),
after the results are written: nothing here is in front of the results.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from prefect.states import Completed, Failed, State

from patronus_tasks.integrations.prefect import artifacts as _artifacts
from patronus_tasks.integrations.prefect import series as _series
from patronus_tasks.integrations.prefect.charts import publish_charts
from patronus_tasks.integrations.prefect.protocol import Closing, Opening
from patronus_tasks.record.location import Location
from patronus_tasks.results.experiment import Experiment
from patronus_tasks.results.summary import Summary


@dataclass
class Verdict:
    """What the experiment's flow run ends with: its state, the lines it logs, and the
    gates that failed (those checked here, ``fail_on_regression``, included)."""

    state: State
    lines: list[tuple[int, str]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Publishing:
    """An experiment to publish: where (`artifacts.Target`), under which series and title,
    its results, its parent flow run (a deployment's), whether to write its HTML report."""

    target: _artifacts.Target
    series: str
    title: str
    out_dir: Location
    parent: str | None = None
    html_report: bool = True

    @classmethod
    def of(cls, opening: Opening, target: _artifacts.Target, series: str) -> Publishing:
        """The experiment that ``opening`` opened, to publish at ``target`` in ``series``."""
        parent = opening.parent.flow_run_id if opening.parent else None
        return cls(target, series, opening.title, opening.out_dir, parent, opening.html_report)


async def publish(p: Publishing, closing: Closing) -> Verdict:
    """Top to bottom: the series' previous run (asked before this one is published), the
    results read and set against it, their artifacts, the comparison, the history and
    the charts published; the verdict said (a gate that failed, ``closing.gate_failures``
    or a regression, fails it)."""
    previous = await _series.previous_run(p.series, p.target.client)
    experiment = Experiment(p.out_dir)
    df = experiment.to_dataframe(_artifacts.REPORT_COLUMNS)
    summary = experiment.summary(df)
    seen = _series.in_series(p.title, previous, experiment, summary, p.target.ids)
    await _artifacts.publish(p.series, p.title, summary, df, experiment.results_path, p.target,
                             experiment)
    await _artifacts.publish_comparison(p.series, p.title, seen.markdown, seen.headline, p.target)
    history = await _artifacts.publish_history(p.series, seen.history_row, p.target)
    await publish_charts(p.series, p.title, experiment, summary, seen.comparison, history,
                         p.target, p.parent, p.html_report)  # the report, the charts, the parent's
    regressed = seen.regressions if closing.fail_on_regression else []
    return _verdict(experiment, summary, seen.headline, [*closing.gate_failures, *regressed])


def _verdict(experiment: Experiment, summary: Summary, compared: str,
             failures: list[str]) -> Verdict:
    message = f"{summary.headline()}. Results: {experiment.results_path}"
    lines = [(logging.INFO, line) for line in (*summary.headlines(), compared,
                                               f"results: {experiment.results_path}")]
    if not failures:
        return Verdict(Completed(message=message), lines)
    lines += [(logging.ERROR, f"quality gate failed: {f}") for f in failures]
    return Verdict(Failed(message=f"quality gate failed: {'; '.join(failures)}. {message}"),
                   lines, failures)
