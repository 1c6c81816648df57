"""An experiment's series: the runs of one deployment (or flow) and project, night after night.

Their artifacts share keys, so the Prefect UI's history of a key is the series' history;
each run compares itself with the previous run of its series, found as the latest
version of the series' results link (the server is the one registry every worker sees).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from patronus_tasks.prefect import internal
from patronus_tasks.prefect.ui import links as _links
from patronus_tasks.prefect.ui.keys import artifact_key
from patronus_tasks.report.cells import markdown_table, num, pct
from patronus_tasks.report.markdown import code, link, text
from patronus_tasks.results.compare import Comparison, EvaluatorComparison, compare_experiments
from patronus_tasks.results.experiment import Experiment
from patronus_tasks.results.summary import Summary
from patronus_tasks.results.verdict import ALPHA, NotCompared, Rule, said

if TYPE_CHECKING:
    from patronus_tasks.prefect.internal import ApiClient

logger = logging.getLogger("patronus_tasks")
ROWS_SHOWN = 20


@dataclass(frozen=True)
class PreviousRun:
    """Where the series' previous run keeps its results, and its flow run."""

    location: str
    flow_run_id: str | None


#: Latest results links of a key read to find the series' own (keys are short: two
#: series may share one).
LINKS_READ = 20


def _of_series(artifact: dict[str, Any], series: str) -> bool:
    said = re.search(r"\(series (.*)\)$", artifact.get("description") or "")
    # A link from before says no series, or says it unescaped.
    return said is None or said.group(1) in (text(series), series)


async def previous_run(series: str, client: ApiClient) -> PreviousRun | None:
    """The latest results link of ``series`` (ask before publishing this run's)."""
    found = await internal.latest_artifacts(client, artifact_key(series, "results"), LINKS_READ)
    mine = [a for a in found if _of_series(a, series)]
    if not mine:
        return None
    # The target after the last "](": the link's text may hold one.
    data, flow_run_id = mine[0].get("data"), mine[0].get("flow_run_id")
    written = re.search(r".*\]\((.*)\)$", str(data or ""))
    target = written.group(1) if written else str(data)
    return PreviousRun(target, str(flow_run_id) if flow_run_id else None)


def experiment_at(results_url: str, this: Experiment) -> Experiment:
    """The experiment whose results file is at ``results_url`` (a link artifact's target),
    opened with this run's storage settings when it is in the same kind of store."""
    return Experiment(this.location.at(results_url).parent)


def compare_with(previous: PreviousRun | None, this: Experiment) -> Comparison | str:
    """This run against the previous one, or why there is nothing to compare with."""
    if previous is None:
        return "This is the first run of its series: nothing to compare with yet."
    try:
        return compare_experiments(experiment_at(previous.location, this), this)
    except Exception as exc:  # gone or unreadable: say so, the run itself is fine
        logger.warning("could not read the previous run's results at %s: %s",
                       previous.location, exc)
        return NotCompared(f"the previous run's results at `{previous.location}` could not be "
                           f"read: {exc}")


def _pass_row(e: EvaluatorComparison, with_link: bool, rule: Rule) -> dict[str, Any]:
    lo, hi = e.pass_diff_ci or (None, None)
    interval = f" [{pct(lo, True)}, {pct(hi, True)}]" if lo is not None else ""
    return {**_name(e, with_link), "verdict": rule.movement(e),
            "worse / better rows": f"{len(e.regressed)} / {len(e.improved)}",
            "before → now": f"{pct(e.pass_rate_a)} → {pct(e.pass_rate_b)}",
            "change [95%]": pct(e.pass_diff, signed=True) + interval,
            "p": num(e.mcnemar_p if e.mcnemar_p is not None else e.pass_p), "rows": e.paired}


def _score_row(e: EvaluatorComparison, with_link: bool, rule: Rule) -> dict[str, Any]:
    lo, hi = e.mean_diff_ci or (None, None)
    interval = f" [{lo:+.3g}, {hi:+.3g}]" if lo is not None else ""
    return {**_name(e, with_link), "verdict": rule.movement(e),
            "worse / better rows": f"{len(e.regressed)} / {len(e.improved)}",
            "mean before → now": f"{num(e.mean_a)} → {num(e.mean_b)}",
            "change [95%]": (f"{e.mean_diff:+.3g}" if e.mean_diff is not None else "") + interval,
            "p": num(e.score_p), "rows": e.paired}


def _name(e: EvaluatorComparison, with_link: bool) -> dict[str, Any]:
    return {"evaluator": e.evaluator, **({"link": e.link_index} if with_link else {})}


def regressed_task_runs(comparison: Comparison | str) -> list[str]:
    """The task-run names of the calls that regressed (their sample ids link to them; with
    repeats a row has a run per repeat: no one of them is linked)."""
    if isinstance(comparison, str) or comparison.pairing != "sid":
        return []
    return [_links.run_name(e.evaluator, sid, e.link_index)
            for e in comparison.evaluators for sid in e.regressed[:ROWS_SHOWN]]


def comparison_markdown(title: str, comparison: Comparison | str, previous: PreviousRun | None,
                        ids: dict[str, str] | None = None, rule: Rule | None = None) -> str:
    """The comparison: what got worse or better first, then the figures as tables, then the
    rows that got worse, per evaluator (sample ids linking to this run's task runs: ``ids``)."""
    rule = rule or Rule()
    lines = [f"# {text(title)} vs the previous run", ""]
    if isinstance(comparison, str):
        return "\n".join([*lines, text(comparison)])
    assert previous is not None
    run = (f" ([its flow run]({_links.flow_run(previous.flow_run_id)}))"
           if previous.flow_run_id else "")
    paired = {"repeat": "sample id and repeat", "mean": "sample id (each row's mean over its "
              "repeats)"}.get(comparison.pairing, "sample id")
    lines += [*_verdict_lines(comparison, rule), "",
              f"Previous run: **{text(comparison.a)}**{run}, results {code(previous.location)}. Rows paired "
              f"by {paired}; only in the previous run: {comparison.only_in_a}, only in this one: "
              f"{comparison.only_in_b}.", ""]
    many = len({e.link_index for e in comparison.evaluators}) > 1
    verdicts = [e for e in comparison.evaluators if e.pass_diff is not None]
    scores = [e for e in comparison.evaluators if e.mean_diff is not None and e.pass_diff is None]
    if verdicts:
        lines += ["## Pass rates", "", *markdown_table([_pass_row(e, many, rule) for e in verdicts]), ""]
    if scores:
        lines += ["## Mean scores", "", *markdown_table([_score_row(e, many, rule) for e in scores]), ""]
    lines += [f"worse: the pass rate (or mean score) fell by {rule.drop:.0%} or more, or more rows "
              "got worse (pass to fail) than better; p: McNemar's exact test on the rows that "
              f"changed (pass rates), a paired bootstrap (means); significant below {ALPHA}."]
    for e in comparison.evaluators:
        if e.regressed:
            more = f" (+{len(e.regressed) - ROWS_SHOWN} more)" if len(e.regressed) > ROWS_SHOWN else ""
            lines += ["", f"**{text(e.evaluator)}** got worse on: "
                      + ", ".join(_sid(s, e, ids or {}) for s in e.regressed[:ROWS_SHOWN]) + more]
    return "\n".join(lines)


def _verdict_lines(comparison: Comparison, rule: Rule) -> list[str]:
    """**Worse** and **better** first, counts before p-values."""
    out = []
    for word in ("worse", "better"):
        moved = [e for e in comparison.evaluators if rule.movement(e) == word]
        if moved:
            out.append(f"**{word.capitalize()}**: " + text("; ".join(
                said(e, rule).split(": ", 1)[1].join([f"{e.evaluator} (", ")"]) for e in moved)))
    if comparison.unjudged_b:  # said first: a judge down all night is no "Unchanged"
        out.insert(0, "**Not compared**: no verdict this run from "
                   + text(", ".join(comparison.unjudged_b))
                   + " (every evaluation unscored: a judge that did not answer).")
    if comparison.unjudged_a:  # back after a night with no verdict: no "Unchanged" either
        out.append("**Not compared**: no verdict last run from "
                   + text(", ".join(comparison.unjudged_a)) + " (back this run).")
    if comparison.only_evaluators_a or comparison.only_evaluators_b:
        out.append("**Not compared** (in one run only): previous "
                   + text(", ".join(comparison.only_evaluators_a) or "none") + "; this run "
                   + text(", ".join(comparison.only_evaluators_b) or "none") + ".")
    return out or ["**Unchanged**: no evaluator got worse or better."]


def _sid(sid: str, e: EvaluatorComparison, ids: dict[str, str]) -> str:
    # Plain text: the UI's markdown shows backticks inside a link as they are.
    found = ids.get(_links.run_name(e.evaluator, sid, e.link_index))
    return link(sid, _links.task_run(found)) if found else text(sid)


def headline(comparison: Comparison | str, rule: Rule | None = None) -> str:
    """The comparison in one line, for the artifact's description (its history)."""
    if isinstance(comparison, NotCompared):
        return "not compared: the previous run's results could not be read"
    if isinstance(comparison, str):
        return "no previous run to compare with"
    rule = rule or Rule()
    parts = [said(e, rule) for e in comparison.evaluators]
    parts += [f"{name} not compared: no verdict this run" for name in comparison.unjudged_b]
    return "vs previous: " + ("; ".join(parts) or "no paired evaluations")


def history_row(this: Experiment, summary: Summary, comparison: Comparison | str,
                rule: Rule | None = None) -> dict[str, Any]:
    """This run as one row of its series' history: when, what, each evaluator's figure."""
    row: dict[str, Any] = {"started": this.manifest.started_at[:19].replace("T", " "),
                           "experiment": this.name}
    for s in summary.evaluators:
        name = f"{s.evaluator} [link {s.link_index}]" if summary.links > 1 else s.evaluator
        row[name] = (f"{s.pass_rate:.1%}" if s.pass_rate is not None
                     else f"mean {s.scores['mean']:.3g}" if "mean" in s.scores else "")
    rule = rule or Rule()
    regressed = [] if isinstance(comparison, str) else [
        e for e in comparison.evaluators if rule.movement(e) == "worse"]
    # What got worse and the errors next to the figures, the metrics in one cell last and
    # cut: the table must fit the UI at a 1,500 px window (its cells do not wrap).
    errors = [f"{summary.task_errors} task" * bool(summary.task_errors),
              f"{summary.evaluator_errors} evaluator" * bool(summary.evaluator_errors)]
    row.update({"regressed": _cut(", ".join(e.evaluator for e in regressed)),
                "errors": ", ".join(x for x in errors if x) or "0"})
    if summary.cost_usd is not None:
        row["cost USD"] = f"{summary.cost_usd:.4g}"
    metrics = ", ".join(f"{m.name} {'error' if m.error is not None else num(m.value)}"
                        for m in summary.metrics)
    if metrics:
        row["metrics"] = _cut(metrics)
    return row


def _cut(text: str, most: int = 40) -> str:
    return text if len(text) <= most else text[: most - 1] + "…"


@dataclass(frozen=True)
class InSeries:
    """This run in its series: against the previous run (the comparison, in one line,
    as the ``-vs-previous`` markdown) and as a row of the series' history."""

    comparison: Comparison | str
    headline: str
    markdown: str
    history_row: dict[str, Any]


def in_series(title: str, previous: PreviousRun | None, this: Experiment, summary: Summary,
              ids: Callable[[list[str]], dict[str, str]], rule: Rule | None = None) -> InSeries:
    """``this`` run against ``previous`` (``rule``: what is worse); ``ids`` gives the
    task-run ids of calls by name (the markdown links the rows that got worse to them)."""
    rule = rule or Rule()
    comparison = compare_with(previous, this)
    markdown = comparison_markdown(title, comparison, previous,
                                   ids(regressed_task_runs(comparison)), rule)
    return InSeries(comparison, headline(comparison, rule), markdown,
                    history_row(this, summary, comparison, rule))
