"""One experiment as one self-contained HTML page: facts, figures, charts, the comparison
with another run, and every record in a table one can sort, filter and open.

No network and no server: the charts are PNG data URLs, the records JSON inside the page,
the script and styles inline (``assets/report.html``).
"""

from __future__ import annotations

import base64
import html
import json
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

import pandas as pd

from patronus_tasks.record.manifest import VerdictNote
from patronus_tasks.record.records import FIXED_NAMES
from patronus_tasks.report import charts
from patronus_tasks.report.rows import counted_columns, packed, table_data
from patronus_tasks.results.agreement import agreement, by_verdict, calibrated, scale_in
from patronus_tasks.results.compare import Comparison, EvaluatorComparison
from patronus_tasks.results.experiment import Experiment
from patronus_tasks.results.repeats import RepeatStats
from patronus_tasks.results.reviewed import review_rows, reviewed, reviewed_evaluators
from patronus_tasks.results.summary import EvaluatorStats, Summary, judged_said, metric_text
from patronus_tasks.results.usage import usage_rows
from patronus_tasks.results.verdict import Rule, said

#: Sample ids listed per evaluator as regressed or improved (each a filter of the table).
SIDS_SHOWN = 50
#: Rows that flip between repeats, listed in the summary table's cell (each a filter).
FLIPS_SHOWN = 6


@dataclass
class ReportInput:
    """What a report shows: the experiment, its records and summary, and optionally a
    comparison with another run (``against``: that run's name)."""

    experiment: Experiment
    df: pd.DataFrame
    summary: Summary
    comparison: Comparison | None = None
    #: Charts drawn already (`charts.drawn`), so a run draws each once.
    drawn: dict[str, bytes | None] | None = None
    #: The run's verdict against its previous run and baseline, which the header states.
    verdict: VerdictNote | None = None

    def chart(self, name: str) -> bytes | None:
        drawn = self.drawn if self.drawn is not None else {}
        if name not in drawn:
            drawn[name] = charts.draw(name, self.summary, self.df, self.comparison)
        self.drawn = drawn
        return drawn[name]


def esc(value: object) -> str:
    return html.escape("" if value is None else str(value))


def image(png: bytes | None, alt: str) -> str:
    """A chart as an ``<img>`` with a PNG data URL (nothing to fetch)."""
    if png is None:
        return ""
    return f'<img alt="{esc(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return '<p class="note">(none)</p>'
    head = "".join(f"<th>{esc(k)}</th>" for k in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{v}</td>" for v in r.values()) + "</tr>" for r in rows)
    return f'<table class="figures"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def header(r: ReportInput) -> str:
    """The title and the facts of the run (when, data, code, where)."""
    m = r.experiment.manifest
    facts = [("project", r.experiment.project), ("started", m.started_at[:19]),
             ("status", m.status), ("rows", m.rows), ("dataset", m.dataset.source),
             ("sha256", (m.dataset.sha256 or "")[:12]), ("git", (m.git_commit or "")[:10]),
             ("flow run", m.flow_run_id), ("results", r.experiment.results_path)]
    shown = "".join(f"<span>{esc(k)}: <b>{esc(v)}</b></span>" for k, v in facts if v)
    return (f"<h1>{esc(r.experiment.project)}/{esc(r.experiment.name)}</h1>{verdict_banner(r.verdict)}"
            f"<div class=facts>{shown}</div>")


def verdict_banner(note: VerdictNote | None) -> str:
    """The verdict first, where the page opens: ``Regressed since exp-2, against baseline
    exp-1: result_matches_gold, same_query`` (the figures are in the sections below)."""
    if note is None:
        return ""
    kind = {"Regressed": "worse", "Gate failed": "worse", "Improved": "better"}.get(note.name, "same")
    said = note.name + (f" since {note.since}" if note.since else "")
    said += f", against baseline {note.baseline}" if note.baseline else ""
    worse = f": {', '.join(note.worse)} worse" if note.worse else ""
    return f"<p class='verdict moved {kind}' id=verdict>{esc(said + worse)}</p>"


def _rate_cell(s: EvaluatorStats) -> str:
    if s.pass_rate is None:
        return ""
    lo, hi = charts.wilson(s.passed, s.judged)
    return f"<b>{s.pass_rate:.1%}</b> <span class=note>[{lo:.0%}, {hi:.0%}]</span>"


def summary_section(r: ReportInput) -> str:
    """Per evaluator: pass rate with its interval, counts, scores; then tokens and cost."""
    s, many = r.summary, r.summary.links > 1
    rows = [{**({"link": e.link_index} if many else {}), "evaluator": esc(e.evaluator),
             "pass rate [95%]": _rate_cell(e),
             # over what, and why, as every view says it (the rate is the column before)
             "passed": esc(judged_said(e, s.not_judged(e))) if e.pass_rate is not None else "",
             "not passed": e.verdicts - e.passed if e.pass_rate is not None else "",
             "errors": e.errors, **({"unscored": e.unscored} if any(
                 x.unscored for x in s.evaluators) else {}), "skipped": e.skipped,
             "mean score": f"{e.scores['mean']:.3g}" if "mean" in e.scores else "",
             "results": e.count} for e in s.evaluators]
    if any(e.repeats for e in s.evaluators):
        rows = [{**row, **_repeat_cells(e.repeats)} for row, e in zip(rows, s.evaluators, strict=True)]
    totals = (f"{s.samples} rows · task errors {s.task_errors} · evaluator errors "
              f"{s.evaluator_errors} · skipped rows {s.skipped_tasks}")
    return (f'<h2>Summary</h2><section class="card"><p>{esc(totals)}</p>{_table(rows)}'
            f"{metrics_section(s)}{usage_section(s)}{counted_section(r.df)}{_filters_hint()}"
            "</section>")


def _repeat_cells(r: RepeatStats | None) -> dict[str, Any]:
    if r is None:
        return {"pass@k": "", "pass^k": "", "flipping rows": ""}
    lo, hi = r.interval or (r.mean_pass_rate, r.mean_pass_rate)
    flips = "".join(chip(sid, {"column": "sid", "value": "=" + sid}) for sid in r.flipping[:FLIPS_SHOWN])
    if len(r.flipping) > FLIPS_SHOWN:
        flips += f" <span class=note>(+{len(r.flipping) - FLIPS_SHOWN} more)</span>"
    return {"pass@k": f"<b>{r.pass_at_k:.1%}</b> <span class=note>k={r.k}; mean {r.mean_pass_rate:.1%} "
                      f"[{lo:.0%}, {hi:.0%}]</span>",
            "pass^k": f"{r.pass_hat_k:.1%}", "flipping rows": f"{len(r.flipping)}/{r.rows} {flips}"}


def metrics_section(s: Summary) -> str:
    """The dataset-level metrics: each value, or the error its metric gave."""
    if not s.metrics:
        return ""
    rows = [{"metric": esc(m.name), "value": esc(metric_text(m)), "from": esc(m.metric)}
            for m in s.metrics]
    return f"<h3>Metrics (dataset-level)</h3>{_table(rows)}"


def calibration_section(r: ReportInput) -> str:
    """A calibration run's agreement with the human labels: the figures, the confusion
    matrix, the rows where judge and human disagree (nothing for other runs); then what
    people said of the rows in a review (`review_section`)."""
    return _calibration(r) + review_section(r)


def review_section(r: ReportInput) -> str:
    """Each reviewed evaluator: the judge against its reviewers (and theirs among
    themselves), and the reviewed rows, each reviewer's label beside the judge's answer."""
    labels = r.experiment.labels()
    parts = []
    for name in reviewed_evaluators(labels):
        scale = scale_in(r.experiment.manifest, name)
        found = reviewed(r.df, labels, name, scale)
        rows = [{k: esc(v) for k, v in row.items()} for row in review_rows(r.df, labels, name, scale)]
        parts.append(f"<h3>Human review: {esc(name)}</h3><p>{esc(found.headline())}</p>{_table(rows)}")
    return "".join(parts)


def _calibration(r: ReportInput) -> str:
    found = calibrated(r.experiment.manifest.tags)
    if found is None:
        return ""
    a = agreement(r.df, *found, verdicts=by_verdict(scale_in(r.experiment.manifest, found[0])))
    rows = [{k: esc(v) for k, v in row.items()} for row in a.confusion_rows()]
    wrong = [{k: esc(v) for k, v in row.items()} for row in a.disagreement_rows(50)]
    return (f"<h3>Judge calibration</h3><p>{esc(a.headline())}</p>{_table(rows)}"
            + (f"<h4>Rows where they disagree</h4>{_table(wrong)}" if wrong else ""))


def usage_section(s: Summary) -> str:
    """Calls, tokens and cost per step and model (calls made; cached ones apart)."""
    rows = usage_rows(s.usage)
    if not rows:
        return ""
    cost = s.cost_usd
    total = "" if cost is None else f"<p>Cost of the calls made: <b>${cost:,.4g}</b></p>"
    return (f"<h3>Tokens and cost</h3>{total}{_table([{k: esc(v) for k, v in r.items()} for r in rows])}"
            "<p class=note>The cache's answers cost nothing; a model with no known price adds "
            "its tokens, not a cost.</p>")


def _filters_hint() -> str:
    chips = chip("not passed", {"verdict": "not passed"}) + chip("errors", {"verdict": "error"})
    return f"<p>Show the rows: {chips}</p>"


def counted_section(df: pd.DataFrame) -> str:
    """Tokens and cost totals, where recorded: a row's task-level figure repeats in each
    of its evaluators' records, so such a column is summed once per (row, link)."""
    parts = []
    for name in (c for c in counted_columns(df) if c not in FIXED_NAMES):  # ours: `usage_section`
        per_row = df.groupby(["sid", "link_index"])[name].nunique(dropna=True).max() <= 1
        values = df.drop_duplicates(["sid", "link_index"])[name] if per_row else df[name]
        total = float(values.sum(skipna=True))
        parts.append(f"<span>{esc(name)}: <b>{total:,.4g}</b></span>")
    return f'<p class="facts">Recorded: {" ".join(parts)}</p>' if parts else ""


def charts_section(r: ReportInput) -> str:
    pictures = [image(r.chart("rates"), "pass rate per evaluator"),
                image(r.chart("scores"), "score distribution per evaluator")]
    shown = "".join(p for p in pictures if p)
    return f'<h2>Charts</h2><section class="card charts">{shown}</section>' if shown else ""


def chip(text: str, filters: dict[str, str]) -> str:
    """A button that sets the table's filters to ``filters``."""
    return f"<button class=chip data-filter='{esc(json.dumps(filters))}'>{esc(text)}</button>"


def _sid_chips(e: EvaluatorComparison, sids: list[str]) -> str:
    more = f" <span class=note>(+{len(sids) - SIDS_SHOWN} more)</span>" if len(sids) > SIDS_SHOWN else ""
    return "".join(chip(s, {"column": "sid", "value": "=" + s, "evaluator": e.evaluator})
                   for s in sids[:SIDS_SHOWN]) + more


def _comparison_row(e: EvaluatorComparison, rule: Rule) -> dict[str, Any]:
    if e.pass_diff is not None and e.pass_diff_ci is not None:
        lo, hi = e.pass_diff_ci
        change = f"{e.pass_rate_a:.1%} → {e.pass_rate_b:.1%}"
        diff = f"{e.pass_diff:+.1%} [{lo:+.1%}, {hi:+.1%}]"
        p = (f"McNemar {e.mcnemar_p:.3g}" if e.mcnemar_p is not None
             else f"bootstrap {e.pass_p:.3g}" if e.pass_p is not None else "")
    elif e.mean_diff is not None:
        lo, hi = e.mean_diff_ci or (0.0, 0.0)
        change = f"mean {e.mean_a or 0:.3g} → {e.mean_b or 0:.3g}"
        diff = f"{e.mean_diff:+.3g} [{lo:+.3g}, {hi:+.3g}]"
        p = f"bootstrap {e.score_p:.3g}" if e.score_p is not None else ""
    else:  # texts only: no figure to invent ("mean 0 → 0" it said)
        change, diff, p = f"text changed on {len(e.changed)} rows", "", ""
    word = rule.movement(e)
    return {"evaluator": esc(e.evaluator), "verdict": f"<b class='moved {word}'>{word}</b>",
            "worse / better rows": f"{len(e.regressed)} / {len(e.improved)}",
            "before → after": change, "difference [95%]": diff, "p": p, "paired": e.paired}


def comparison_section(r: ReportInput) -> str:
    """The run against the other: what got worse or better (counts first, p after), the
    chart, and the rows that moved (each one a filter of the table below)."""
    c, rule = r.comparison, Rule()
    if c is None:
        return ""
    moved = "".join(
        f"<p><b>{esc(e.evaluator)}</b> got worse on {len(e.regressed)}: {_sid_chips(e, e.regressed)}</p>"
        * bool(e.regressed)
        + f"<p><b>{esc(e.evaluator)}</b> got better on {len(e.improved)}: {_sid_chips(e, e.improved)}</p>"
        * bool(e.improved) for e in c.evaluators)
    said_ = "".join(f"<li class='moved {rule.movement(e)}'>{esc(said(e, rule))}</li>" for e in c.evaluators)
    note = (f"<ul class=verdicts>{said_}</ul><p class=note>Against <b>{esc(c.a)}</b>: rows paired by "
            f"sample id; only there: {c.only_in_a}, only here: {c.only_in_b}. Worse: the pass rate "
            f"(or mean score) fell by {rule.drop:.0%} or more, or more rows got worse than "
            "better.</p>")
    given = (r.drawn or {}).get("comparison")  # a run's: "against the previous run"
    chart = image(given or charts.comparison_chart(c, rule, f"Against {c.a}"), "against the other run")
    table = _table([_comparison_row(e, rule) for e in c.evaluators])
    return (f'<h2>Against {esc(c.a)}</h2><section class="card charts">{note}{chart}{table}'
            f"{moved}</section>")


#: The template's slots, filled in one pass: what fills one is never searched for another
#: (a name holding ``/*DATA*/`` put the records in the title, and a report of 0.45 MB
#: grew to 20.7 MB).
SLOTS = re.compile(r"__TITLE__|__HEADER__|__SECTIONS__|/\*DATA\*/")


def render(r: ReportInput) -> str:
    """The page."""
    template = resources.files("patronus_tasks.report").joinpath("assets/report.html").read_text()
    dataset = [c for c in r.df.columns if c not in FIXED_NAMES]
    sections = summary_section(r) + calibration_section(r) + charts_section(r) + comparison_section(r)
    title = f"{r.experiment.project}/{r.experiment.name}"
    filled = {"__TITLE__": esc(title), "__HEADER__": header(r), "__SECTIONS__": sections,
              "/*DATA*/": packed(table_data(r.df, dataset))}
    return SLOTS.sub(lambda slot: filled[slot.group(0)], template)
