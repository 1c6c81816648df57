"""An experiment's pictures in the Prefect UI, and its figures on the pages above it.

``<series>-charts`` is a markdown artifact: the run's pass rates with their intervals, its
score distributions, the run against the previous one and the series night by night, as
PNG data URLs (the UI renders an image inside markdown from a ``data:`` URL: nothing for
the browser to fetch, nothing to host), with links to the lists of findings and errors and
to the HTML report. When the experiment is a subflow (a deployment's flow run calling
it), that flow run gets its figures too: an artifact and log lines (Prefect lets any
client add both to any flow run; its state is its own flow's to set).
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from patronus_tasks.prefect.ui import links as _links
from patronus_tasks.prefect.ui.artifacts import (
    Target,
    artifact_key,
    description,
)
from patronus_tasks.record.location import Location
from patronus_tasks.record.manifest import VerdictNote
from patronus_tasks.record.presign import Signed, presigned
from patronus_tasks.report import charts as _charts
from patronus_tasks.report.build import report_after_run
from patronus_tasks.report.cells import markdown_table
from patronus_tasks.report.markdown import code, link, text
from patronus_tasks.results.compare import Comparison
from patronus_tasks.results.experiment import Experiment
from patronus_tasks.results.summary import SUMMARY_COLUMNS, Summary
from patronus_tasks.results.verdict import calling_tags

logger = logging.getLogger("patronus_tasks")
#: `series.history_row` columns that are not an evaluator's figure.
HISTORY_FIXED = frozenset({"started", "experiment", "rows", "task errors", "evaluator errors",
                           "errors", "metrics", "cost USD", "regressed", "verdict"})


def data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def picture(png: bytes | None, alt: str) -> list[str]:
    """A markdown image of ``png`` (nothing when there is no chart)."""
    return [] if png is None else [f"![{alt}]({data_url(png)})", ""]


def _figure(value: object) -> float | None:
    text = str(value or "").strip().removesuffix(" worse")
    try:
        if text.endswith("%"):
            return float(text[:-1]) / 100
        return float(text.removeprefix("mean ")) if text.startswith("mean ") else None
    except ValueError:
        return None


def nights(history: list[dict[str, Any]]) -> list[_charts.Night]:
    """The ``-history`` table's rows (newest first) as the chart's nights, oldest first."""
    out = []
    for row in reversed(history):
        values = {k: _figure(v) for k, v in row.items() if k not in HISTORY_FIXED}
        regressed = [n.strip() for n in str(row.get("regressed") or "").split(",") if n.strip()]
        regressed += [k for k, v in row.items()  # an evaluator's column: "33.3% worse"
                      if k not in HISTORY_FIXED and str(v).endswith(" worse")]
        out.append(_charts.Night(str(row.get("started", ""))[5:19], values, regressed))
    return out


def _counts(summary: Summary) -> tuple[int, int]:
    not_passed = sum(s.verdicts - s.passed for s in summary.evaluators if s.pass_rate is not None)
    return not_passed, summary.task_errors + summary.evaluator_errors


def links_line(experiment: Experiment, summary: Summary, report: Path | Location | None) -> str:
    """Where to look next: the findings, the errors, the HTML report."""
    not_passed, errors = _counts(summary)
    parts = [f"[{not_passed} verdicts did not pass]({_links.findings(experiment)})",
             f"[errors: {errors}]({_links.errors(experiment)})"]
    if report is not None:
        parts.append(report_said(report))
    return " · ".join(parts)


def report_said(report: Path | Location) -> str:
    """How to open the HTML report from the UI: in object storage, a pre-signed link and
    when it stops working; local, the command that opens it on the machine that has it
    (a browser does not follow a ``file://`` link from an ``http://`` page)."""
    where = Location.of(report)
    if where.local is None:
        signed = presigned(str(where))
        if isinstance(signed, Signed):
            return (f"HTML report: {link('report.html', signed.url)} (a pre-signed link, valid "
                    f"until {signed.expires:%Y-%m-%d %H:%M} UTC)")
        return f"HTML report: {code(str(where))} ({text(signed)})"
    command = f"python -m webbrowser {where.local.resolve().as_uri()}"
    return f"HTML report, on {text(socket.gethostname())}: {code(command)}"


def charts_markdown(title: str, experiment: Experiment, summary: Summary,
                    drawn: dict[str, bytes | None], history: list[dict[str, Any]],
                    report: Path | Location | None) -> str:
    """The ``-charts`` artifact: this run, against the previous one, the series."""
    lines = [f"# {text(title)}: charts", "", links_line(experiment, summary, report), ""]
    lines += picture(drawn["rates"], "pass rate per evaluator")
    lines += picture(drawn["scores"], "score distribution per evaluator")
    if drawn["comparison"] is not None:
        lines += ["## Against the previous run", ""]
        lines += picture(drawn["comparison"], "against the previous run")
    if len(history) > 1:
        lines += ["## The series, run by run", ""]
        lines += picture(_charts.history_chart(nights(history)), "the series run by run")
    return "\n".join(lines)


def parent_markdown(title: str, experiment: Experiment, summary: Summary, rates: bytes | None,
                    report: Path | Location | None, flow_run_id: str) -> str:
    """What the experiment's parent flow run shows of it: figures, chart, links."""
    rows = [{"evaluator": s.evaluator, "pass rate": f"{s.pass_rate:.1%}" if s.pass_rate is not None
             else "", "passed": f"{s.passed}/{s.judged}" if s.pass_rate is not None
             else "", "mean score": f"{s.scores['mean']:.3g}" if "mean" in s.scores else "",
             "errors": s.errors} for s in summary.evaluators]
    return "\n".join([f"# {text(title)}", "", text(summary.headline()), "",
                      f"[The experiment's flow run]({_links.flow_run(flow_run_id)}) · "
                      + links_line(experiment, summary, report), "", *markdown_table(rows), "",
                      *picture(rates, "pass rates")])


def _level(line: str, note: VerdictNote) -> int:
    """A warning for what got worse and for a verdict that did (the UI marks warnings)."""
    worse = (line.startswith(("vs previous", "vs baseline")) and " worse: " in line) or (
        line.startswith("verdict:") and bool(note.worse or note.failures))
    return logging.WARNING if worse else logging.INFO


def publish_to_parent(parent: str, title: str, note: VerdictNote, markdown: str | None,
                      target: Target) -> None:
    """The experiment on the parent flow run: an artifact (its Artifacts tab), its tags,
    and log lines (its Logs tab, where a deployment's run opens: the figures, each
    evaluator against the previous run, the verdict), posted last before that run ends."""
    now = dt.datetime.now(dt.UTC).isoformat()
    since = f" since {note.since}, against baseline {note.baseline}" if note.since else ""
    said = [*note.lines, f"verdict: {note.name}{since}" + (f" ({', '.join(note.tags)})" if note.tags else "")]
    logs = [{"name": "patronus_tasks", "level": _level(line, note), "message": f"{title}: {line}",
             "timestamp": now, "flow_run_id": parent, "task_run_id": None} for line in said]
    if markdown is not None:
        target.create("markdown", markdown, None, description(title, note.message), parent)
    target.tag(parent, calling_tags(note))
    target.log(logs)


@dataclass(frozen=True)
class Drawn:
    """A run's charts (PNG, by name; None: nothing to draw), its HTML report's place and
    its ``-charts`` markdown."""

    charts: dict[str, bytes | None]
    report: Path | Location | None
    markdown: str


def draw_run(title: str, experiment: Experiment, summary: Summary, comparison: Comparison | str,
             html_report: bool, history: list[dict[str, Any]],
             note: VerdictNote | None = None) -> Drawn | None:
    """Each chart drawn once (the series' ``history`` too), the HTML report written
    (unless ``html_report`` is False; ``note``: the verdict its header states) and the
    ``-charts`` markdown made: CPU work, all of it in one thread while the artifacts before
    the charts are posted (the history's chart, drawn after them, was 0.2 s at the end of
    every run). None, said in a warning, when it failed: pictures are extras, the run and
    its results stand."""
    try:
        compared = comparison if isinstance(comparison, Comparison) else None
        df = experiment.to_dataframe(SUMMARY_COLUMNS)
        drawn = {name: _charts.draw(name, summary, df, compared)
                 for name in ("rates", "scores", "comparison")}
        report = report_after_run(experiment, compared, drawn, note) if html_report else None
        return Drawn(drawn, report, charts_markdown(title, experiment, summary, drawn, history,
                                                    report))
    except Exception as exc:
        logger.warning("could not draw the charts of %s: %s: %s", title, type(exc).__name__, exc)
        return None


def publish_charts(series: str, title: str, experiment: Experiment, summary: Summary,
                   target: Target, drawn: Drawn | None) -> str | None:
    """Publish ``<series>-charts`` (``drawn``: `draw_run`'s); return what the parent flow
    run shows of the run (None: the charts could not be drawn)."""
    if drawn is None:
        return None
    target.create("markdown", drawn.markdown, artifact_key(series, "charts"),
                  description(title, summary.headline()))
    return parent_markdown(title, experiment, summary, drawn.charts["rates"], drawn.report,
                           target.flow_run_id)
