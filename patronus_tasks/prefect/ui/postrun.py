"""After an experiment's rows: its artifacts, the comparison with its series' previous
run, and the verdict its flow run ends with, top to bottom.

Runs where the records are kept (the recorder process, or the flow of Dask batches),
after the results are written: nothing here is in front of the results.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from patronus_tasks.prefect.flowruns import add_tags
from patronus_tasks.prefect.protocol import Closing, Opening
from patronus_tasks.prefect.states import RunState, completed, failed
from patronus_tasks.prefect.ui import artifacts as _artifacts
from patronus_tasks.prefect.ui import baselines as _baselines
from patronus_tasks.prefect.ui import series as _series
from patronus_tasks.prefect.ui.charts import draw_run, publish_charts, publish_to_parent
from patronus_tasks.record.location import Location
from patronus_tasks.record.manifest import VerdictNote
from patronus_tasks.results.experiment import Experiment
from patronus_tasks.results.verdict import Rule, judge, rule_of

if TYPE_CHECKING:
    import pandas as pd

    from patronus_tasks.results.summary import Summary


@dataclass
class Verdict:
    """What the experiment's flow run ends with: its state, the lines it logs, the gates
    that failed (those checked here, ``fail_on_regression``, included) and the verdict
    against the previous run (`results.verdict`), which the experiment's process keeps."""

    state: RunState
    lines: list[tuple[int, str]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    note: VerdictNote | None = None


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
    baseline: str | None = None  # a run pinned in code to judge against (its results' link)

    @classmethod
    def of(cls, opening: Opening, target: _artifacts.Target, series: str) -> Publishing:
        """The experiment that ``opening`` opened, to publish at ``target`` in ``series``."""
        parent = opening.parent.flow_run_id if opening.parent else None
        return cls(target, series, opening.title, opening.out_dir, parent, opening.html_report,
                   opening.baseline)


async def publish(p: Publishing, closing: Closing) -> Verdict:
    """Top to bottom: the series' previous run and baseline (asked before this run is
    published), the results read and set against them, the verdict (a gate that failed,
    ``closing.gate_failures`` or a regression, fails it), the artifacts, the comparison,
    the history and the charts published; the verdict said on this flow run (tags) and on
    its parent (tags, figures)."""
    run = await _against_previous(p, closing)
    note = judge(run.summary, run.seen.comparison, run.rule, closing.gate_failures, run.seen.baseline)
    history = _artifacts.history_table(_series.history_row(run.experiment, run.summary, note),
                                       run.earlier)
    # Drawn while the artifacts before them are posted: matplotlib's ~1 s (more on a
    # loaded machine) was the end of every small run, after all of them.
    drawing = asyncio.ensure_future(asyncio.to_thread(
        draw_run, p.title, run.experiment, run.summary, run.seen.comparison, p.html_report,
        history, note))
    await _artifacts.publish(p.series, p.title, run.summary, run.df, run.experiment.results_path,
                             p.target, run.experiment)
    await _artifacts.publish_comparison(p.series, p.title, run.seen.markdown, run.seen.headline,
                                        p.target)
    await _baselines.record_first(p.series, run.found, run.experiment, p.target)
    await _artifacts.publish_history(p.series, history, p.target)
    parent_md = await publish_charts(p.series, p.title, run.experiment, run.summary, p.target,
                                     drawing)
    await add_tags(p.target.client, p.target.flow_run_id, note.tags)
    if p.parent is not None:
        await publish_to_parent(p.parent, p.title, note, parent_md, p.target.client)
    return _verdict(run.experiment, note)


@dataclass(frozen=True)
class _Run:
    """The run's results, read, and set against the series' previous run and baseline."""

    experiment: Experiment
    df: pd.DataFrame
    summary: Summary
    rule: Rule
    seen: _series.InSeries
    found: _series.Found | None
    earlier: list[dict[str, Any]]  # the series' history as its previous run left it


async def _against_previous(p: Publishing, closing: Closing) -> _Run:
    """The results read and compared in threads: the server is asked for the previous run
    and the baseline and the series' history meanwhile, and the recorder's poster, on this
    loop, is not held up."""
    asking = asyncio.gather(_series.previous_run(p.series, p.target.client),
                            _baselines.find(p.series, p.target.client, p.baseline),
                            _artifacts.earlier_history(p.series, p.target.client))
    try:
        experiment, df, summary = await asyncio.to_thread(_read, p.out_dir)
    except BaseException:
        asking.cancel()
        raise
    previous, found, earlier = await asking
    rule = closing.rule or rule_of(None, closing.fail_on_regression)
    seen = await asyncio.to_thread(_series.in_series, p.title, previous, experiment, summary,
                                   p.target.ids, rule, found)
    return _Run(experiment, df, summary, rule, seen, found, earlier)


def _read(out_dir: Location) -> tuple[Experiment, pd.DataFrame, Summary]:
    experiment = Experiment(out_dir)
    df = experiment.to_dataframe(_artifacts.REPORT_COLUMNS)
    return experiment, df, experiment.summary(df)


def _verdict(experiment: Experiment, note: VerdictNote) -> Verdict:
    message = f"{note.message}. Results: {experiment.results_path}"
    level = logging.WARNING if note.worse else logging.INFO
    compared = ("vs previous", "vs baseline")
    lines = [(logging.INFO, line) for line in note.lines if not line.startswith(compared)]
    lines += [(level, line) for line in note.lines if line.startswith(compared)]
    lines.append((logging.INFO, f"results: {experiment.results_path}"))
    # Prefect's own state names: the UI's run lists filter by name ("All except scheduled"
    # lists Prefect's names only), so a run in a state named "Regressed" would vanish from
    # its deployment's page. The verdict leads the message and is in the tags.
    if not note.failures:
        return Verdict(completed(message), lines, note=note)
    lines += [(logging.ERROR, f"quality gate failed: {f}") for f in note.failures]
    return Verdict(failed(message), lines, note.failures, note)
