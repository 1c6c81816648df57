"""Prefect UI artifacts of an experiment: summary table, report, link to results, progress.

Keys derive from project and experiment name only, so scheduled runs of the same
experiment build one artifact history in the Prefect UI.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
from prefect.artifacts import (
    acreate_link_artifact,
    acreate_markdown_artifact,
    acreate_progress_artifact,
    acreate_table_artifact,
    aupdate_progress_artifact,
)
from prefect.client.orchestration import get_client

from patronus_tasks.record.location import Location, link_target
from patronus_tasks.record.records import STATUS_ERROR
from patronus_tasks.results.summary import SUMMARY_COLUMNS, Summary

FAILURES_SHOWN = 10


def artifact_key(project: str, experiment: str, kind: str) -> str:
    """``<project>-<experiment>-<kind>`` in the lowercase-and-dashes form Prefect requires."""
    slug = re.sub(r"[^a-z0-9]+", "-", f"{project}-{experiment}".lower()).strip("-")
    return f"{slug[:80].strip('-') or 'experiment'}-{kind}"


def summary_rows(summary: Summary) -> list[dict[str, Any]]:
    """One table row per (link, evaluator)."""
    rows = []
    for s in summary.evaluators:
        rows.append({
            "link": s.link_index, "evaluator": s.evaluator, "count": s.count,
            "pass_rate": None if s.pass_rate is None else round(s.pass_rate, 4),
            "mean": _round(s.scores.get("mean")), "min": _round(s.scores.get("min")),
            "median": _round(s.scores.get("50%")), "max": _round(s.scores.get("max")),
            "errors": s.errors, "skipped": s.skipped,
        })
    return rows


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _cell(value: Any, width: int = 200) -> str:
    text = "" if value is None or (isinstance(value, float) and pd.isna(value)) else str(value)
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= width else text[: width - 1] + "…"


#: The record columns the report reads: the summary's, and the failures'.
REPORT_COLUMNS = (*SUMMARY_COLUMNS, "error_type", "error_message", "explanation")


def _failure_lines(df: pd.DataFrame) -> list[str]:
    errors = df[df["status"] == STATUS_ERROR].head(FAILURES_SHOWN)
    failed = df[(df["status"] != STATUS_ERROR) & (df["pass"] == False)].head(FAILURES_SHOWN)  # noqa: E712
    lines = []
    if len(errors):
        lines += ["", "## First errors", "", "| sid | link | step | error | message |",
                  "|---|---|---|---|---|"]
        for r in errors.itertuples():
            step = r.evaluator_name if r.error_stage == "evaluator" else r.task_name
            lines.append(f"| {_cell(r.sid)} | {r.link_index} | {_cell(step)} | "
                         f"{_cell(r.error_type)} | {_cell(r.error_message)} |")
    if len(failed):
        lines += ["", "## First failed evaluations", "", "| sid | link | evaluator | score | explanation |",
                  "|---|---|---|---|---|"]
        for r in failed.itertuples():
            lines.append(f"| {_cell(r.sid)} | {r.link_index} | {_cell(r.evaluator_name)} | "
                         f"{_cell(r.score)} | {_cell(r.explanation)} |")
    return lines


def report_markdown(title: str, summary: Summary, df: pd.DataFrame) -> str:
    """The summary as text, then the first errors and failed evaluations."""
    return "\n".join([f"# {title}", "", "```", summary.format(), "```", *_failure_lines(df)])


async def publish(project: str, experiment: str, summary: Summary, df: pd.DataFrame,
                  results_path: Path | Location) -> None:
    """Create the table, markdown and link artifacts of a finished experiment."""
    title = f"Experiment {project}/{experiment}"
    await acreate_table_artifact(summary_rows(summary), key=artifact_key(project, experiment, "summary"),
                                 description=f"{title}: per-evaluator summary")
    await acreate_markdown_artifact(report_markdown(title, summary, df),
                                    key=artifact_key(project, experiment, "report"),
                                    description=f"{title}: summary and first failures")
    await acreate_link_artifact(link_target(results_path), link_text=str(results_path),
                                key=artifact_key(project, experiment, "results"),
                                description=f"{title}: Parquet results")


class ProgressArtifact:
    """A progress artifact moved every ``interval`` seconds while rows complete."""

    def __init__(self, project: str, experiment: str, done: Callable[[], int], total: int,
                 interval: float = 1.0) -> None:
        self.key = artifact_key(project, experiment, "progress")
        self._done, self._total, self._interval = done, max(total, 1), interval
        self._task: asyncio.Task[None] | None = None
        self._id: Any = None
        self._client: Any = None
        self._posted = 0.0

    def _percent(self) -> float:
        return round(100.0 * self._done() / self._total, 2)

    async def _post(self) -> None:
        now = self._percent()
        if now != self._posted:
            await aupdate_progress_artifact(self._id, now, client=self._client)
            self._posted = now

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            await self._post()

    async def __aenter__(self) -> ProgressArtifact:
        self._id = await acreate_progress_artifact(0.0, key=self.key,
                                                   description="rows completed (%)")
        self._client = get_client()
        await self._client.__aenter__()
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._id is not None:
            await self._post()  # the final figure, whatever the last tick showed
        await self._client.__aexit__(None, None, None)
