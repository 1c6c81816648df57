"""An experiment's series: the runs of one deployment (or flow) and project, night after night.

Their artifacts share keys, so the Prefect UI's history of a key is the series' history;
each run compares itself with the previous run of its series, found as the latest
version of the series' results link (the server is the one registry every worker sees),
and with the series' baseline (`baselines`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from patronus_tasks.prefect.ui import links as _links
from patronus_tasks.prefect.ui.asking import Found, PreviousRun
from patronus_tasks.record.manifest import VerdictNote
from patronus_tasks.report.cells import markdown_table, num, pct
from patronus_tasks.report.markdown import code, link, text
from patronus_tasks.results.compare import Comparison, EvaluatorComparison, compare_experiments
from patronus_tasks.results.experiment import Experiment
from patronus_tasks.results.summary import Summary
from patronus_tasks.results.verdict import ALPHA, Baseline, NotCompared, Rule, said

if TYPE_CHECKING:
    pass

logger = logging.getLogger("patronus_tasks")
ROWS_SHOWN = 20


def experiment_at(results_url: str, this: Experiment) -> Experiment:
    """The experiment whose results file is at ``results_url`` (a link artifact's target),
    opened with this run's storage settings when it is in the same kind of store."""
    return Experiment(this.location.at(results_url).parent)


def compare_with(previous: PreviousRun | None, this: Experiment,
                 what: str = "previous run") -> Comparison | str:
    """This run against the previous one (or the baseline: ``what``), or why there is
    nothing to compare with."""
    if previous is None:
        return "This is the first run of its series: nothing to compare with yet."
    try:
        return compare_experiments(experiment_at(previous.location, this), this)
    except Exception as exc:  # gone or unreadable: say so, the run itself is fine
        logger.warning("could not read the %s's results at %s: %s", what, previous.location, exc)
        return NotCompared(f"the {what}'s results at `{previous.location}` could not be "
                           f"read: {exc}")


def against_baseline(found: Found | None, previous: PreviousRun | None,
                     comparison: Comparison | str, this: Experiment) -> Baseline | None:
    """This run against the series' baseline (``found``): the comparison with the previous
    run when that is the baseline too, and the night its regression began, carried from
    the previous night's verdict while the baseline is the same."""
    if found is None:
        return None
    same = previous is not None and previous.location == found.location
    compared = comparison if same else compare_with(found, this, "baseline")
    name = compared.a if isinstance(compared, Comparison) else found.name or found.location
    return Baseline(name, found.how, compared, _since(previous, this, name), previous=same)


def _since(previous: PreviousRun | None, this: Experiment, baseline: str) -> str | None:
    """The night the previous run's regression against ``baseline`` began, if it had one."""
    if previous is None:
        return None
    try:
        said = experiment_at(previous.location, this).manifest.verdict
    except Exception:  # unreadable: this night is the first one known
        return None
    return said.since if said is not None and said.baseline == baseline else None


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
                        ids: dict[str, str] | None = None, rule: Rule | None = None,
                        baseline: Baseline | None = None, found: Found | None = None) -> str:
    """The comparison: what got worse or better first, then the figures as tables, then the
    rows that got worse, per evaluator (sample ids linking to this run's task runs: ``ids``);
    then the run against the series' baseline (``baseline``, found at ``found``)."""
    rule = rule or Rule()
    lines = [f"# {text(title)} vs the previous run", ""]
    if isinstance(comparison, str):
        lines.append(text(comparison))
    else:
        assert previous is not None
        lines += _compared(comparison, previous, "Previous run", ids or {}, rule)
    return "\n".join(lines + _baseline_lines(baseline, found, ids or {}, rule))


def _baseline_lines(baseline: Baseline | None, found: Found | None, ids: dict[str, str],
                    rule: Rule) -> list[str]:
    """``## Against the baseline``: which run it is and how, since when this run is worse
    than it, and (when it is not the previous run) the comparison with it."""
    if baseline is None or found is None:
        return []
    how = {"accepted": "accepted", "pinned": "pinned in code (baseline=)"}.get(
        baseline.how, "the series' first run: none accepted yet")
    lines = ["", "## Against the baseline", "",
             f"Baseline: **{text(baseline.name)}** ({how}; `patronus-tasks accept RUN` makes "
             "another the baseline)."]
    worse = baseline.worse(rule)
    if worse and isinstance(baseline.comparison, Comparison):
        since = baseline.since or baseline.comparison.b
        lines += ["", f"**Regressed since {text(since)}**: " + text(", ".join(
            e.evaluator for e in worse)) + " worse than the baseline (the verdict stays "
            "Regressed until a run is accepted)."]
    if baseline.previous:
        return [*lines, "", "It is the previous run too: the comparison above."]
    if isinstance(baseline.comparison, str):
        return [*lines, "", text(baseline.comparison)]
    return [*lines, "", *_compared(baseline.comparison, found, "Baseline", ids, rule)]


def _compared(comparison: Comparison, previous: PreviousRun, what: str, ids: dict[str, str],
              rule: Rule) -> list[str]:
    run = (f" ([its flow run]({_links.flow_run(previous.flow_run_id)}))"
           if previous.flow_run_id else "")
    paired = {"repeat": "sample id and repeat", "mean": "sample id (each row's mean over its "
              "repeats)"}.get(comparison.pairing, "sample id")
    lines = [*_verdict_lines(comparison, rule), "",
             f"{what}: **{text(comparison.a)}**{run}, results {code(previous.location)}. Rows paired "
             f"by {paired}; only in the {what.lower()}: {comparison.only_in_a}, only in this one: "
             f"{comparison.only_in_b}.", ""]
    many = len({e.link_index for e in comparison.evaluators}) > 1
    verdicts = [e for e in comparison.evaluators if e.verdict_rows]
    scores = [e for e in comparison.evaluators if e.mean_diff is not None and not e.verdict_rows]
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
                      + ", ".join(_sid(s, e, ids) for s in e.regressed[:ROWS_SHOWN]) + more]
    return lines


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


def headline(comparison: Comparison | str, rule: Rule | None = None,
             baseline: Baseline | None = None) -> str:
    """The comparison in one line, for the artifact's description (its history)."""
    rule = rule or Rule()
    worse = baseline.worse(rule) if baseline is not None else []
    kept = (f"; regressed since {baseline.since or baseline.comparison.b} against baseline "
            f"{baseline.name}: {', '.join(e.evaluator for e in worse)}"
            if worse and baseline is not None and isinstance(baseline.comparison, Comparison) else "")
    if isinstance(comparison, NotCompared):
        return "not compared: the previous run's results could not be read" + kept
    if isinstance(comparison, str):
        return "no previous run to compare with" + kept
    parts = [said(e, rule) for e in comparison.evaluators]
    parts += [f"{name} not compared: no verdict this run" for name in comparison.unjudged_b]
    return "vs previous: " + ("; ".join(parts) or "no paired evaluations") + kept


def history_row(this: Experiment, summary: Summary, note: VerdictNote | None = None) -> dict[str, Any]:
    """This run as one row of its series' history: when, what, each evaluator's figure
    (``worse`` beside it when it got worse, against the previous run or the baseline:
    `VerdictNote.worse`), the verdict, the errors; cost and metrics last (the first to go
    when the table is too wide: `artifacts.publish_history`)."""
    row: dict[str, Any] = {"started": this.manifest.started_at[:16].replace("T", " "),
                           "experiment": this.name}
    worse = set(note.worse) if note is not None else set()
    for s in summary.evaluators:
        name = f"{s.evaluator} [link {s.link_index}]" if summary.links > 1 else s.evaluator
        figure = (f"{s.pass_rate:.1%}" if s.pass_rate is not None
                  else f"mean {s.scores['mean']:.3g}" if "mean" in s.scores else "")
        row[name] = figure + (" worse" if figure and s.evaluator in worse else "")
    errors = [f"{summary.task_errors} task" * bool(summary.task_errors),
              f"{summary.evaluator_errors} evaluator" * bool(summary.evaluator_errors)]
    row.update({"verdict": note.name if note is not None else "",
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
    as the ``-vs-previous`` markdown), and against the baseline."""

    comparison: Comparison | str
    headline: str
    markdown: str
    baseline: Baseline | None = None


def in_series(title: str, previous: PreviousRun | None, this: Experiment, summary: Summary,
              ids: Callable[[list[str]], dict[str, str]], rule: Rule | None = None,
              found: Found | None = None) -> InSeries:
    """``this`` run against ``previous`` and the series' baseline (``found``; ``rule``:
    what is worse); ``ids`` gives the task-run ids of calls by name (the markdown links
    the rows that got worse to them)."""
    rule = rule or Rule()
    comparison = compare_with(previous, this)
    baseline = against_baseline(found, previous, comparison, this)
    compared = baseline.comparison if baseline is not None and not baseline.previous else None
    shown = regressed_task_runs(comparison) + (regressed_task_runs(compared) if compared else [])
    markdown = comparison_markdown(title, comparison, previous, ids(shown), rule, baseline, found)
    return InSeries(comparison, headline(comparison, rule, baseline), markdown, baseline)
