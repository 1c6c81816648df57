"""After an experiment's rows: its artifacts, the comparison with its series' previous
run, and the verdict its flow run ends with, top to bottom.

In three parts, after the results are written (nothing here is in front of them): the
server asked (`asking`), the post-run computed (`compute`: CPU, no client) and its
changes applied (`writes`). On the default path the recorder process asks and applies
and the experiment's process computes; a Dask run's flow, or a recorder whose
experiment's process is gone, does all three (`publish`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from patronus_tasks.prefect.protocol import Closing, Opening
from patronus_tasks.prefect.states import completed, failed
from patronus_tasks.prefect.ui import artifacts as _artifacts
from patronus_tasks.prefect.ui import baselines as _baselines
from patronus_tasks.prefect.ui import series as _series
from patronus_tasks.prefect.ui.artifacts import Target
from patronus_tasks.prefect.ui.asking import Asked, ask
from patronus_tasks.prefect.ui.charts import draw_run, publish_charts, publish_to_parent
from patronus_tasks.prefect.ui.writes import Verdict, Write, apply
from patronus_tasks.record.location import Location
from patronus_tasks.record.manifest import VerdictNote
from patronus_tasks.results.experiment import Experiment
from patronus_tasks.results.verdict import Rule, judge, rule_of

if TYPE_CHECKING:
    import pandas as pd

    from patronus_tasks.prefect.internal import ApiClient
    from patronus_tasks.results.summary import Summary

__all__ = ["Plan", "Verdict", "applying", "compute", "publish"]


@dataclass(frozen=True)
class Plan:
    """An experiment to publish: its flow run (``run_key`` gives its calls' task-run
    ids), series and title, its results, its parent flow run (a deployment's), whether to
    write its HTML report, a run pinned in code to judge against (its results' link)."""

    flow_run_id: str
    run_key: str
    series: str
    title: str
    out_dir: Location
    parent: str | None = None
    html_report: bool = True
    baseline: str | None = None

    @classmethod
    def of(cls, opening: Opening, flow_run_id: str, series: str) -> Plan:
        """The experiment that ``opening`` opened, as flow run ``flow_run_id`` of ``series``."""
        parent = opening.parent.flow_run_id if opening.parent else None
        return cls(flow_run_id, opening.key, series, opening.title, opening.out_dir, parent,
                   opening.html_report, opening.baseline)


async def publish(plan: Plan, closing: Closing, client: ApiClient) -> Verdict:
    """All of it in this process (a Dask run's flow; the recorder process when the
    experiment's process is gone): the series asked, then `compute` in a thread while what
    it makes is applied on the server."""
    asked = await ask(plan.series, client, plan.baseline)
    return await applying(client, partial(compute, plan, closing, asked))


async def applying(client: ApiClient, work: Callable[[Callable[[Write], None]], Verdict]) -> Verdict:
    """Run ``work`` in a thread, applying each `Write` it emits as it comes (the CPU of
    the next ones overlaps the posting of the first); its verdict."""
    loop = asyncio.get_running_loop()
    made: asyncio.Queue[Write | None] = asyncio.Queue()

    def emit(write: Write) -> None:
        loop.call_soon_threadsafe(made.put_nowait, write)

    def run() -> Verdict:
        try:
            return work(emit)
        finally:
            loop.call_soon_threadsafe(made.put_nowait, None)

    computing = asyncio.ensure_future(asyncio.to_thread(run))
    try:
        while (write := await made.get()) is not None:
            await apply(client, write)
    except BaseException:
        computing.add_done_callback(lambda done: done.exception())  # its error is not ours to say
        raise
    return await computing


def compute(plan: Plan, closing: Closing, asked: Asked, emit: Callable[[Write], None]) -> Verdict:
    """Top to bottom, CPU work (a thread of the experiment's process, which has the
    results' modules loaded): the results read and set against the series' previous run
    and baseline (``asked`` before this run was published), the verdict (a gate that
    failed, ``closing.gate_failures`` or a regression, fails it), the artifacts, the
    comparison, the history and the charts, each handed to ``emit`` as made; the verdict
    said on this flow run (tags) and on its parent (tags, figures)."""
    target = Target(plan.flow_run_id, plan.run_key, emit)
    run = _against_previous(plan, closing, asked, target)
    note = judge(run.summary, run.seen.comparison, run.rule, closing.gate_failures, run.seen.baseline)
    history = _artifacts.history_table(_series.history_row(run.experiment, run.summary, note),
                                       asked.earlier)
    _artifacts.publish(plan.series, plan.title, run.summary, run.df, run.experiment.results_path,
                       target, run.experiment)
    _artifacts.publish_comparison(plan.series, plan.title, run.seen.markdown, run.seen.headline,
                                  target)
    _baselines.record_first(plan.series, asked.found, run.experiment, target)
    _artifacts.publish_history(plan.series, history, target)
    drawn = draw_run(plan.title, run.experiment, run.summary, run.seen.comparison,
                     plan.html_report, history, note)
    parent_md = publish_charts(plan.series, plan.title, run.experiment, run.summary, target, drawn)
    target.tag(plan.flow_run_id, note.tags)
    if plan.parent is not None:
        publish_to_parent(plan.parent, plan.title, note, parent_md, target)
    return _verdict(run.experiment, note)


@dataclass(frozen=True)
class _Run:
    """The run's results, read, and set against the series' previous run and baseline."""

    experiment: Experiment
    df: pd.DataFrame
    summary: Summary
    rule: Rule
    seen: _series.InSeries


def _against_previous(plan: Plan, closing: Closing, asked: Asked, target: Target) -> _Run:
    experiment, df, summary = _read(plan.out_dir)
    rule = closing.given_rule() or rule_of(None, closing.fail_on_regression)
    seen = _series.in_series(plan.title, asked.previous, experiment, summary, target.ids, rule,
                             asked.found)
    return _Run(experiment, df, summary, rule, seen)


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
        return Verdict.of(completed(message), lines, [], note)
    lines += [(logging.ERROR, f"quality gate failed: {f}") for f in note.failures]
    return Verdict.of(failed(message), lines, list(note.failures), note)
