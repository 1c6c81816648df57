"""Prefect UI artifacts of an experiment: summary table, report, link to results, progress.

Keys derive from the experiment's series (`series`), so the runs of one nightly
deployment build one artifact history in the Prefect UI; each version's description
carries its headline figures, so the history reads as the nightly figures.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from patronus_tasks.prefect.events import namespace_of, task_run_id
from patronus_tasks.prefect.ui import links as _links
from patronus_tasks.prefect.ui import made
from patronus_tasks.prefect.ui.display import NOT_PASSED_TAG
from patronus_tasks.prefect.ui.keys import artifact_key
from patronus_tasks.prefect.ui.writes import Write
from patronus_tasks.record.location import Location, link_target
from patronus_tasks.record.records import STATUS_ERROR
from patronus_tasks.report.cells import fitted, markdown_table, num, pct
from patronus_tasks.report.markdown import Markdown, code, inert, label, link, text
from patronus_tasks.results import agreement as _agreement
from patronus_tasks.results.experiment import Experiment
from patronus_tasks.results.summary import SUMMARY_COLUMNS, EvaluatorStats, Summary, metric_text
from patronus_tasks.results.usage import shown_usage, usage_rows

if TYPE_CHECKING:
    pass

FAILURES_SHOWN = 10


def summary_rows(summary: Summary) -> list[dict[str, Any]]:
    """One table row per (link, evaluator), as a person reads it: percentages, counts of
    what went wrong (the row's task errors are the link's: those rows never reached the
    evaluator), the link only when there is more than one; with repeats, pass@k, pass^k
    and the rows that flip; with model calls, each step's calls, tokens and cost (a task's
    on a row of its own)."""
    many = summary.links > 1
    rows = [_summary_row(s, summary, many) for s in summary.evaluators]
    if any(s.repeats for s in summary.evaluators):
        rows = [{**r, **_repeat_cells(s)} for r, s in zip(rows, summary.evaluators, strict=True)]
    if shown_usage(summary.usage):
        rows = _with_usage(rows, summary)
    return rows


def _repeat_cells(s: EvaluatorStats) -> dict[str, Any]:
    r = s.repeats
    if r is None:
        return {"repeats": ""}
    return {"repeats": f"pass@{r.k} {pct(r.pass_at_k)} · pass^{r.k} {pct(r.pass_hat_k)} · "
                       f"{len(r.flipping)}/{r.rows} flip"}


def _usage_cells(summary: Summary, step: str, kind: str) -> dict[str, Any]:
    lines = [u for u in summary.usage if u.step == step and u.kind == kind]
    known = [u.cost_usd for u in lines if u.cost_usd is not None]
    cached = sum(u.cached for u in lines)
    return {"calls": f"{sum(u.calls for u in lines)}" + (f" (+{cached} cached)" if cached else ""),
            "tokens in / out": f"{sum(u.input_tokens for u in lines):,} / "
                               f"{sum(u.output_tokens for u in lines):,}",
            "cost USD": f"{sum(known):.4g}" if known else ""}


def _with_usage(rows: list[dict[str, Any]], summary: Summary) -> list[dict[str, Any]]:
    """Each evaluator's own calls, then a row per task: its calls (the model under test)."""
    rows = [{**r, **_usage_cells(summary, str(r["evaluator"]), "evaluator")} for r in rows]
    tasks = dict.fromkeys(u.step for u in summary.usage if u.kind == "task")
    blank = dict.fromkeys(rows[0] if rows else [], "")
    return rows + [{**blank, "evaluator": f"(task) {t}", **_usage_cells(summary, t, "task")}
                   for t in tasks]


def _score_cell(s: EvaluatorStats) -> str:
    """The mean score, and the range when the scores differ: ``0.5 (0 to 1)``."""
    if "mean" not in s.scores:
        return ""
    low, high = s.scores["min"], s.scores["max"]
    return num(s.scores["mean"]) + ("" if low == high else f" ({num(low)} to {num(high)})")


def _skips(evaluator: int, task: int) -> str:
    said = [f"{evaluator} evaluator" * bool(evaluator), f"{task} task" * bool(task)]
    return ", ".join(x for x in said if x) or "0"


def _summary_row(s: EvaluatorStats, summary: Summary, with_link: bool) -> dict[str, Any]:
    # Few, short columns: the table must fit the Prefect UI at a 1,500 px window (the
    # quartiles are in the -report and the HTML report).
    row: dict[str, Any] = {"link": s.link_index} if with_link else {}
    row.update({
        "evaluator": s.evaluator, "pass rate": pct(s.pass_rate),
        "passed": f"{s.passed}/{s.judged}" if s.pass_rate is not None else "",
        "mean score": _score_cell(s), "results": s.count,
        "errors": f"{s.errors}" + (f" ({s.unscored} unscored)" if s.unscored else ""),
        "task errors": summary.task_errors_by_link.get(s.link_index, 0),
        "skips": _skips(s.skipped, summary.skipped_tasks_by_link.get(s.link_index, 0)),
    })
    return row


#: The record columns the report reads: the summary's, and the failures'.
REPORT_COLUMNS = (*SUMMARY_COLUMNS, "explanation")


def _errors(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"] == STATUS_ERROR].head(FAILURES_SHOWN)


def _failed(df: pd.DataFrame) -> pd.DataFrame:
    return df[(df["status"] != STATUS_ERROR) & (df["pass"] == False)].head(FAILURES_SHOWN)  # noqa: E712


def _step(r: Any) -> str:
    return str(r.evaluator_name if r.error_stage == "evaluator" else r.task_name)


def _repeat(r: Any) -> int | None:
    value = getattr(r, "repeat", None)
    return None if value is None or pd.isna(value) else int(value)


def shown_task_runs(df: pd.DataFrame) -> list[str]:
    """The task-run names of the calls the report lists (its sample ids link to them)."""
    return ([_links.run_name(_step(r), r.sid, r.link_index, _repeat(r))
             for r in _errors(df).itertuples()]
            + [_links.run_name(r.evaluator_name, r.sid, r.link_index, _repeat(r))
               for r in _failed(df).itertuples()])


def sid_cell(sid: str, step: str, link_index: int, ids: dict[str, str],
             repeat: int | None = None) -> Markdown:
    """A sample id (and its repeat), a link to its call's task run when the server holds it."""
    found = ids.get(_links.run_name(step, sid, link_index, repeat))
    shown = str(sid) + ("" if repeat is None else f" (run {repeat})")
    return link(shown, _links.task_run(found)) if found else Markdown(text(shown))


#: Characters of an error message or explanation in the -report's tables: v1 of the UI
#: does not wrap a Markdown table's cells, and 120 made the table 1,232 px wide in its
#: 946 px box (Chromium, 1,500 px window); each task run's page has it whole.
FAILURE_CHARS = 60


def _failure_lines(df: pd.DataFrame, ids: dict[str, str]) -> list[str]:
    errors, failed, lines = _errors(df), _failed(df), []
    chain = df["link_index"].nunique() > 1 if len(df) else False
    if len(errors):
        rows = [{"sid": sid_cell(r.sid, _step(r), r.link_index, ids, _repeat(r)),
                 **({"link": r.link_index} if chain else {}),
                 "step": _step(r), "error": r.error_type, "message": r.error_message}
                for r in errors.itertuples()]
        lines += ["", "## First errors", "", *markdown_table(rows, FAILURE_CHARS)]
    if len(failed):
        rows = [{"sid": sid_cell(r.sid, r.evaluator_name, r.link_index, ids, _repeat(r)),
                 **({"link": r.link_index} if chain else {}), "evaluator": r.evaluator_name,
                 "score": r.score, "explanation": r.explanation} for r in failed.itertuples()]
        lines += ["", "## First failed evaluations", "", *markdown_table(rows, FAILURE_CHARS)]
    return lines


def _lists(experiment: Experiment | None) -> list[str]:
    if experiment is None:
        return []
    return ["", f"In the UI: [the verdicts that did not pass]({_links.findings(experiment)}) · "
                f"[the errors]({_links.errors(experiment)}) (tag `{NOT_PASSED_TAG}`, "
                "states Failed and TimedOut; the runs page lists them)."]


def report_markdown(title: str, summary: Summary, df: pd.DataFrame, where: str,
                    experiment: Experiment | None = None,
                    ids: dict[str, str] | None = None) -> str:
    """The summary as a table, links to the lists of findings and errors, then the first
    errors and failed evaluations (sample ids linking to their task runs: ``ids``)."""
    totals = (f"{summary.samples} rows · task errors {summary.task_errors} · evaluator errors "
              f"{summary.evaluator_errors} · skipped rows {summary.skipped_tasks}")
    return "\n".join([f"# {text(title)}", "", totals, "", *markdown_table(summary_rows(summary)),
                      *figures_markdown(summary), *calibration_markdown(experiment), "",
                      f"Results: {code(where)}", *_lists(experiment),
                      *_failure_lines(df, ids or {})])


def calibration_markdown(experiment: Experiment | None) -> list[str]:
    """A calibration run's confusion matrix and disagreeing rows (nothing for others)."""
    found = _agreement.of_experiment(experiment) if experiment is not None else None
    if found is None:
        return []
    lines = ["", "## Judge calibration", "", text(found.headline()), "",
             *markdown_table(found.confusion_rows())]
    if len(found.disagreements):
        lines += ["", "Rows where judge and human disagree:", "",
                  *markdown_table(found.disagreement_rows(FAILURES_SHOWN))]
    return lines


def figures_markdown(summary: Summary) -> list[str]:
    """The dataset-level metrics, the calls, tokens and cost per step and model, and the
    rows whose verdict flips between repeats, as markdown (nothing when there are none)."""
    lines: list[str] = []
    if summary.metrics:
        rows = [{"metric": m.name, "value": metric_text(m), "from": m.metric} for m in summary.metrics]
        lines += ["", "## Metrics (dataset-level)", "", *markdown_table(rows)]
    usage = usage_rows(summary.usage)
    if usage:
        lines += ["", "## Tokens and cost", "", *markdown_table(usage), "",
                  "Calls made; the cache's answers are counted apart and cost nothing. "
                  "A model with no known price adds its tokens, not a cost."]
    flips = [(s, s.repeats.flipping) for s in summary.evaluators if s.repeats and s.repeats.flipping]
    for s, sids in flips:
        shown = ", ".join(code(x) for x in sids[:FAILURES_SHOWN])
        more = f" (+{len(sids) - FAILURES_SHOWN} more)" if len(sids) > FAILURES_SHOWN else ""
        lines += ["", f"**{text(s.evaluator)}** flips between repeats on: {shown}{more}"]
    return lines


def results_link(location: Path | Location) -> tuple[str, str]:
    """The link artifact's target and text for results at ``location`` (a local path or
    object storage). A local path becomes a ``file://`` URL, which only its own machine
    opens: the text names that machine."""
    target = link_target(location)
    if target.startswith("file:"):
        return target, f"{socket.gethostname()}:{location}"
    return target, target


def description(title: str, said: str) -> str:
    """An artifact's description: its run and what it says (both UIs render it as
    Markdown; the history of a key lists them)."""
    return text(f"{title}: {said}")


def results_description(title: str, series: str) -> str:
    """The results link's description: it names the whole series, which a shortened key
    may not tell apart from another (`series.previous_run` checks it)."""
    return f"{text(title)}: Parquet results (series {text(series)})"


def table_artifact(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` as a table artifact's cells (`markdown.inert`; `read_table` reads them
    back)."""
    return [{k: inert(v) for k, v in r.items()} for r in rows]


@dataclass(frozen=True)
class Target:
    """Where an experiment's artifacts go: its flow run; ``run_key`` gives its calls'
    task-run ids (`events.task_run_id`). What is published is handed to ``emit`` as a
    `writes.Write`, in order: applied on the server where the client is (`writes.apply`)."""

    flow_run_id: str
    run_key: str
    emit: Callable[[Write], None]

    def ids(self, names: Iterable[str]) -> dict[str, str]:
        """The task-run ids of the calls named ``names`` (links to them)."""
        namespace = namespace_of(self.run_key)
        return {name: task_run_id(namespace, name) for name in names}

    def create(self, kind: str, data: Any, key: str | None, description: str,
               flow_run_id: str | None = None) -> None:
        """An artifact of this flow run (or of ``flow_run_id``)."""
        self.emit(Write("artifact", flow_run_id or self.flow_run_id, data, kind, key, description))

    def tag(self, flow_run_id: str, tags: list[str]) -> None:
        """``tags`` first among the flow run's (`flowruns.add_tags`)."""
        self.emit(Write("tags", flow_run_id, list(tags)))

    def log(self, logs: list[dict[str, Any]]) -> None:
        """Log lines (Prefect's log dicts, each naming its flow run)."""
        self.emit(Write("logs", None, logs))


def publish(series: str, title: str, summary: Summary, df: pd.DataFrame,
            location: Path | Location, target: Target,
                  experiment: Experiment | None = None) -> None:
    """Create the table, markdown and link artifacts of a finished experiment."""
    figures = description(title, summary.headline())
    # The table as wide as the UI's box: what it cannot hold is in the -report (the count
    # of results, each step's calls, tokens and cost).
    table = fitted(summary_rows(summary), ("results", "tokens in / out", "calls", "cost USD"))
    target.create("table", made.table_data(table_artifact(table)),
                  artifact_key(series, "summary"), figures)
    markdown = report_markdown(title, summary, df, str(location), experiment,
                               target.ids(shown_task_runs(df)))
    target.create("markdown", markdown, artifact_key(series, "report"), figures)
    url, shown = results_link(location)
    target.create("markdown", made.link_data(url, label(shown)),
                  artifact_key(series, "results"), results_description(title, series))


def publish_comparison(series: str, title: str, markdown: str, headline: str,
                       target: Target) -> None:
    """``<series>-vs-previous``: the run against its series' previous one (``markdown``;
    ``headline`` in its description, the history of the key)."""
    target.create("markdown", markdown, artifact_key(series, "vs-previous"),
                  description(title, headline))


#: Runs the ``<series>-history`` table keeps, newest first.
HISTORY_ROWS = 60


def history_table(row: dict[str, Any], earlier: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history with this run's ``row`` first (at most `HISTORY_ROWS`, newest first), as
    wide as the UI's box."""
    rows = [row, *earlier][:HISTORY_ROWS]
    columns = list(dict.fromkeys(c for r in rows for c in r))
    return fitted([{c: r.get(c, "") for c in columns} for r in rows], ("metrics", "cost USD"))


def publish_history(series: str, table: list[dict[str, Any]], target: Target) -> None:
    """``<series>-history`` (`history_table`): the last runs of the series, one row each,
    newest first.

    The UI lists an artifact key's versions by id only: this one table is where a
    series' figures read night after night (the previous version's rows, plus this run).
    """
    target.create("table", made.table_data(table_artifact(table)),
                  artifact_key(series, "history"),
                  description(series, f"the last {len(table)} runs, newest first"))
