"""Prefect UI artifacts of an experiment: summary table, report, link to results, progress.

Keys derive from the experiment's series (`series`), so the runs of one nightly
deployment build one artifact history in the Prefect UI; each version's description
carries its headline figures, so the history reads as the nightly figures.
"""

from __future__ import annotations

import re
import socket
import warnings
from pathlib import Path
from typing import Any

import pandas as pd
from prefect.artifacts import (
    Artifact,
    LinkArtifact,
    MarkdownArtifact,
    TableArtifact,
    aupdate_progress_artifact,
)
from prefect.artifacts import ProgressArtifact as _Progress

from patronus_tasks.record.location import Location, link_target
from patronus_tasks.record.records import STATUS_ERROR
from patronus_tasks.results.summary import SUMMARY_COLUMNS, EvaluatorStats, Summary

FAILURES_SHOWN = 10
#: Characters of one table cell (explanations, error messages) before the ellipsis.
CELL_CHARS = 120


def artifact_key(series: str, kind: str) -> str:
    """``<series>-<kind>`` in the lowercase-and-dashes form Prefect requires."""
    slug = re.sub(r"[^a-z0-9]+", "-", series.lower()).strip("-")
    return f"{slug[:80].strip('-') or 'experiment'}-{kind}"


def pct(value: float | None, signed: bool = False) -> str:
    """A rate for a table cell (``+`` on differences); empty when there is none."""
    return "" if value is None else (f"{value:+.1%}" if signed else f"{value:.1%}")


def num(value: float | None) -> str:
    """A score for a table cell; empty when there is none."""
    return "" if value is None else f"{value:.3g}"


def summary_rows(summary: Summary) -> list[dict[str, Any]]:
    """One table row per (link, evaluator), as a person reads it: percentages, counts of
    what went wrong (the row's task errors are the link's: those rows never reached the
    evaluator), the link only when there is more than one."""
    many = summary.links > 1
    return [_summary_row(s, summary, many) for s in summary.evaluators]


def _summary_row(s: EvaluatorStats, summary: Summary, with_link: bool) -> dict[str, Any]:
    row: dict[str, Any] = {"link": s.link_index} if with_link else {}
    row.update({
        "evaluator": s.evaluator, "pass rate": pct(s.pass_rate),
        "passed": f"{s.passed}/{s.verdicts + s.errors}" if s.pass_rate is not None else "",
        "mean score": num(s.scores.get("mean")), "min": num(s.scores.get("min")),
        "median": num(s.scores.get("50%")), "max": num(s.scores.get("max")),
        "results": s.count, "evaluator errors": s.errors, "evaluator skips": s.skipped,
        "task errors": summary.task_errors_by_link.get(s.link_index, 0),
        "task skips": summary.skipped_tasks_by_link.get(s.link_index, 0),
    })
    return row


def _cell(value: Any, width: int = CELL_CHARS) -> str:
    text = "" if value is None or (isinstance(value, float) and pd.isna(value)) else str(value)
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= width else text[: width - 1] + "…"


def markdown_table(rows: list[dict[str, Any]]) -> list[str]:
    """``rows`` (dicts with the same keys) as the lines of a markdown table."""
    if not rows:
        return ["(no evaluations)"]
    head = list(rows[0])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(_cell(r[k]) for k in head) + " |" for r in rows]


#: The record columns the report reads: the summary's, and the failures'.
REPORT_COLUMNS = (*SUMMARY_COLUMNS, "error_type", "error_message", "explanation")


def _failure_lines(df: pd.DataFrame) -> list[str]:
    errors = df[df["status"] == STATUS_ERROR].head(FAILURES_SHOWN)
    failed = df[(df["status"] != STATUS_ERROR) & (df["pass"] == False)].head(FAILURES_SHOWN)  # noqa: E712
    lines = []
    if len(errors):
        rows = [{"sid": r.sid, "link": r.link_index,
                 "step": r.evaluator_name if r.error_stage == "evaluator" else r.task_name,
                 "error": r.error_type, "message": r.error_message} for r in errors.itertuples()]
        lines += ["", "## First errors", "", *markdown_table(rows)]
    if len(failed):
        rows = [{"sid": r.sid, "link": r.link_index, "evaluator": r.evaluator_name,
                 "score": r.score, "explanation": r.explanation} for r in failed.itertuples()]
        lines += ["", "## First failed evaluations", "", *markdown_table(rows)]
    return lines


def report_markdown(title: str, summary: Summary, df: pd.DataFrame, where: str) -> str:
    """The summary as a table, then the first errors and failed evaluations."""
    totals = (f"{summary.samples} rows · task errors {summary.task_errors} · evaluator errors "
              f"{summary.evaluator_errors} · skipped rows {summary.skipped_tasks}")
    return "\n".join([f"# {title}", "", totals, "", *markdown_table(summary_rows(summary)),
                      "", f"Results: `{where}`", *_failure_lines(df)])


def results_link(location: Path | Location) -> tuple[str, str]:
    """The link artifact's target and text for results at ``location`` (a local path or
    object storage). A local path becomes a ``file://`` URL, which only its own machine
    opens: the text names that machine."""
    target = link_target(location)
    if target.startswith("file:"):
        return target, f"{socket.gethostname()}:{location}"
    return target, target


async def create(artifact: Artifact, client: Any) -> Any:
    """Create ``artifact`` (its ``flow_run_id`` set): the recorder process makes them for
    flow runs whose code runs elsewhere, outside any run context of its own, which Prefect
    warns of (its default is the context's run)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return await artifact.acreate(client)


async def publish(series: str, title: str, summary: Summary, df: pd.DataFrame,
                  location: Path | Location, flow_run_id: str, client: Any) -> None:
    """Create the table, markdown and link artifacts of a finished experiment."""
    figures = f"{title}: {summary.headline()}"
    await create(TableArtifact(table=summary_rows(summary), key=artifact_key(series, "summary"),
                               description=figures, flow_run_id=flow_run_id), client)
    await create(MarkdownArtifact(markdown=report_markdown(title, summary, df, str(location)),
                                  key=artifact_key(series, "report"), description=figures,
                                  flow_run_id=flow_run_id), client)
    target, text = results_link(location)
    await create(LinkArtifact(link=target, link_text=text, key=artifact_key(series, "results"),
                              description=f"{title}: Parquet results", flow_run_id=flow_run_id),
                 client)


class ProgressArtifact:
    """The ``<series>-progress`` artifact: rows completed (%), moved as they are told."""

    def __init__(self, series: str, total: int, flow_run_id: str) -> None:
        self.key, self.flow_run_id = artifact_key(series, "progress"), flow_run_id
        self._total = max(total, 1)
        self._id: Any = None
        self._shown = -1.0

    async def show(self, done: int, client: Any) -> None:
        """Show ``done`` rows (made on the first call; unchanged figures are not sent)."""
        percent = round(100.0 * done / self._total, 2)
        if self._id is None:
            made = await create(_Progress(progress=percent, key=self.key, flow_run_id=self.flow_run_id,
                                          description="rows completed (%)"), client)
            self._id, self._shown = made.id, percent
        elif percent != self._shown:
            await aupdate_progress_artifact(self._id, percent, client=client)
            self._shown = percent
