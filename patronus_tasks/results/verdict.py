"""A run's verdict against the previous run of its series and against its baseline, said
plainly.

Significance alone hides a nightly's news: nine rows whose pass rate halves have
McNemar p = 0.25, "not significant". So a drop is called **worse** when the pass rate (or,
with no verdicts, the mean score) fell by at least `Rule.drop` (5 points by default,
settable per evaluator) or when more rows got worse than better; **better** the other way
round. Every view says the counts first ("3 worse / 0 better") and the p-value after.

A night compared with the previous night alone forgets a regression nobody looked at:
the next night, as broken, reads "Unchanged". So each series has a **baseline** (its
first run until a run is accepted, or one pinned in code: `Baseline`): a run worse than
it stays ``Regressed``, saying since which night, until a run is accepted.

The verdict's name (``Regressed``, ``Gate failed``, ``Errors``, ``Improved``,
``Unchanged``, ``First run``, ``Not compared``: the previous run could not be read), tags
(``regressed``, ``regressed:<evaluator>``, ``gate-failed``, ``errors``, ``not-compared``;
the verdict's own first: Prefect's lists show the first that fit), message and log lines
are what the Prefect UI shows of a run: on the experiment's flow run and on the flow run
that called it (the verdict's tags only: `calling_tags`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from patronus_tasks.exceptions import ConfigError
from patronus_tasks.record.manifest import VerdictNote
from patronus_tasks.results.compare import Comparison, EvaluatorComparison
from patronus_tasks.results.reviewed import AgreementChange
from patronus_tasks.results.summary import Summary

#: How far a pass rate (or mean score) may fall before a run is called worse: 5 points.
DROP = 0.05
#: Significance level of a regression (McNemar's exact test; the bootstrap for scores).
ALPHA = 0.05
Movement = Literal["worse", "better", "same", "changed"]
FailOn = Literal["significant", "worse"]
_EPS = 1e-12  # a change of exactly the threshold counts, whatever the float rounding


class NotCompared(str):
    """Why a run was not compared with the previous one of its series, which there was
    (its results gone or unreadable): not a first run, and no regression gate passed."""


@dataclass(frozen=True)
class Rule:
    """When a run is worse than the previous one, and which regressions fail it.

    ``drop``: the fall in pass rate (or mean score) that makes an evaluator worse, with
    ``per_evaluator`` overrides; ``fail_on``: ``"significant"`` (p < `ALPHA`), ``"worse"``
    (this rule), or None (a regression fails nothing).
    """

    drop: float = DROP
    per_evaluator: Mapping[str, float] = field(default_factory=dict)
    fail_on: FailOn | None = None

    def drop_for(self, evaluator: str) -> float:
        return self.per_evaluator.get(evaluator, self.drop)

    def movement(self, e: EvaluatorComparison) -> Movement:
        """``worse``, ``better`` or ``same`` (see the module)."""
        change = e.pass_diff if e.pass_diff is not None else e.mean_diff
        drop = self.drop_for(e.evaluator)
        worse, better = len(e.regressed), len(e.improved)
        if (change is not None and change <= -drop + _EPS) or worse > better:
            return "worse"
        if (change is not None and change >= drop - _EPS) or better > worse:
            return "better"
        return "changed" if e.changed else "same"  # texts only: neither worse nor better

    def fails(self, e: EvaluatorComparison) -> bool:
        if self.fail_on == "significant":
            return e.regressed_significantly(ALPHA)
        return self.fail_on == "worse" and self.movement(e) == "worse"


def rule_of(threshold: float | Mapping[str, float] | None, fail_on_regression: Any) -> Rule:
    """The `Rule` of an experiment's ``regression_threshold`` (a number, or ``{evaluator:
    number}`` with ``"*"`` for the rest) and ``fail_on_regression`` (True or
    ``"significant"``, ``"worse"``, False); a wrong value is a `ConfigError`."""
    fail_on: FailOn | None
    if fail_on_regression in (False, None):
        fail_on = None
    elif fail_on_regression is True or fail_on_regression == "significant":
        fail_on = "significant"
    elif fail_on_regression == "worse":
        fail_on = "worse"
    else:
        raise ConfigError(f"fail_on_regression must be True (or 'significant': p < {ALPHA}), "
                          f"'worse' (the drop rule) or False, not {fail_on_regression!r}.")
    if threshold is None:
        return Rule(fail_on=fail_on)
    given = dict(threshold) if isinstance(threshold, Mapping) else {"*": threshold}
    for name, value in given.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            raise ConfigError(f"regression_threshold[{name!r}] must be a fall in pass rate (or "
                              f"mean score) from 0 to 1, e.g. 0.05 for 5 points, not {value!r}.")
    default = float(given.pop("*", DROP))
    return Rule(default, {k: float(v) for k, v in given.items()}, fail_on)


def _figure(a: float | None, b: float | None, rate: bool) -> str:
    if rate and (a is None) != (b is None):  # every row's task failed in one run
        return f"{'-' if a is None else f'{a:.1%}'} → {'-' if b is None else f'{b:.1%}'} (no row judged)"
    if a is None or b is None:
        return ""
    if rate:
        return f"{a:.1%} → {b:.1%} ({(b - a) * 100:+.1f} points)"
    return f"mean {a:.3g} → {b:.3g} ({b - a:+.3g})"


def said(e: EvaluatorComparison, rule: Rule, many_links: bool = False) -> str:
    """One evaluator against another run, counts first, p after: ``result_matches_gold
    worse: 3 worse / 0 better rows; 66.7% → 33.3% (-33.3 points); p=0.25`` (the pass
    rates of judged rows, as each run's summary says them; rows whose task failed said)."""
    rate = bool(e.verdict_rows) or e.pass_diff is not None
    name = f"{e.evaluator} [link {e.link_index}]" if many_links else e.evaluator
    if not rate and e.mean_diff is None:  # texts only: how many changed
        return f"{name} {rule.movement(e)}: text changed on {len(e.changed)} of {e.text_rows} rows"
    p = (e.mcnemar_p if e.mcnemar_p is not None else e.pass_p) if rate else e.score_p
    parts = [f"{len(e.regressed)} worse / {len(e.improved)} better rows",
             _figure(e.pass_rate_a, e.pass_rate_b, True) if rate else _figure(e.mean_a, e.mean_b, False)]
    if rate and e.not_judged_a != e.not_judged_b:  # else the summary's figures say it
        parts.append(f"rows whose task failed (not judged): {e.not_judged_a} → {e.not_judged_b}")
    if p is not None:
        parts.append(f"p={p:.2g}")
    return f"{name} {rule.movement(e)}: " + "; ".join(x for x in parts if x)


def comparison_lines(comparison: Comparison | str | None, rule: Rule,
                     against: str = "previous run", how: str = "") -> list[str]:
    """The comparison as log lines: one per evaluator (or why there is none);
    ``against``: which run it is (``how``: said after its name)."""
    if comparison is None:
        return []
    if isinstance(comparison, str):
        return [comparison if against == "previous run" else f"vs {against}: {comparison}"]
    many = len({e.link_index for e in comparison.evaluators}) > 1
    return [f"vs {against} {comparison.a}{how}: {said(e, rule, many)}" for e in comparison.evaluators]


@dataclass(frozen=True)
class Baseline:
    """The run a night is judged against besides the previous one: its series' accepted
    baseline (``how``: ``accepted``), its first run (``first run``) until one is, or one
    given in code (``pinned``). ``comparison``: this run against it, or why there is
    none; ``since``: the first night of a regression against it that is still on (the
    previous night's, carried; None: this night, if it is worse); ``previous``: whether
    it is the previous run too (then said once)."""

    name: str
    how: str
    comparison: Comparison | str
    since: str | None = None
    previous: bool = False

    def worse(self, rule: Rule) -> list[EvaluatorComparison]:
        """The evaluators worse than the baseline."""
        if not isinstance(self.comparison, Comparison):
            return []
        return [e for e in self.comparison.evaluators if rule.movement(e) == "worse"]

    def lines(self, rule: Rule) -> list[str]:
        return comparison_lines(self.comparison, rule, "baseline", f" ({self.how})")

    def failures(self, rule: Rule) -> list[str]:
        return regression_failures(self.comparison, rule, "baseline")


def judge(summary: Summary, comparison: Comparison | str | None, rule: Rule,
          gate_failures: Sequence[str] = (), baseline: Baseline | None = None) -> VerdictNote:
    """The run's verdict: its name, tags, message and log lines (see the module);
    ``comparison``: against the previous run, why there is none (a first run), or None
    (not known here: a run not kept on Prefect); ``baseline``: against the series'
    baseline (a run worse than it is ``Regressed``, whatever the previous run did)."""
    evaluators = comparison.evaluators if isinstance(comparison, Comparison) else []
    apart = baseline if baseline is not None and not baseline.previous else None
    base_worse = baseline.worse(rule) if baseline is not None else []
    worse = [e for e in evaluators if rule.movement(e) == "worse"]
    better = [e for e in evaluators if rule.movement(e) == "better"]
    # A judge's kappa with people (its reviewed rows) moves the verdict as an evaluator does.
    judges = comparison.agreements if isinstance(comparison, Comparison) else []
    trusted_less = [c for c in judges if agreement_moved(c, rule) == "worse"]
    trusted_more = [c for c in judges if agreement_moved(c, rule) == "better"]
    failures = [*gate_failures, *regression_failures(comparison, rule),
                *(apart.failures(rule) if apart else [])]
    regressed = list(dict.fromkeys([*(e.evaluator for e in (*base_worse, *worse)),
                                    *(c.evaluator for c in trusted_less)]))
    improved = [*(e.evaluator for e in better), *(c.evaluator for c in trusted_more)]
    name = _name(summary, comparison, bool(failures), bool(regressed), bool(improved),
                 baseline is not None and isinstance(baseline.comparison, Comparison))
    since = _since(baseline, base_worse)
    lines = [*summary.headlines(), *comparison_lines(comparison, rule),
             *(apart.lines(rule) if apart else []),
             *(f"vs previous run {comparison.a}: {c.said()}" for c in judges
               if isinstance(comparison, Comparison))]
    moved = [*_moved(base_worse if apart else [], [*worse, *better], rule),
             *(c.said() for c in (*trusted_less, *trusted_more))]
    return VerdictNote(name=name, message=_head(name, baseline, since, failures) + (
                           "; ".join(moved) + ". " if moved else "") + summary.headline(),
                       tags=_tags(summary, comparison, apart, regressed, failures), lines=lines,
                       worse=regressed, better=improved, failures=failures,
                       baseline=baseline.name if baseline is not None else None, since=since)


def agreement_moved(change: AgreementChange, rule: Rule) -> Movement:
    """A judge's kappa with people against the previous run's: ``worse`` when it fell by
    the rule's drop for that judge (5 points by default), ``better`` when it rose as much."""
    diff, drop = change.diff, rule.drop_for(change.evaluator)
    if diff is not None and diff <= -drop + _EPS:
        return "worse"
    if diff is not None and diff >= drop - _EPS:
        return "better"
    return "same"


def _name(summary: Summary, comparison: Comparison | str | None, failed: bool,
          regressed: bool, better: bool, to_baseline: bool = False) -> str:
    errors = summary.task_errors + summary.evaluator_errors
    unknown = ("Not compared" if not_compared(comparison) else "First run"
               if isinstance(comparison, str) else "Completed")
    compared = (isinstance(comparison, Comparison) and bool(comparison.evaluators)) or (
        comparison is None and to_baseline)  # a run off Prefect: its baseline alone
    return ("Gate failed" if failed else "Regressed" if regressed
            else "Errors" if errors and _more_errors(comparison)
            else "Improved" if better else "Unchanged" if compared else unknown)


def _tags(summary: Summary, comparison: Comparison | str | None, apart: Baseline | None,
          regressed: list[str], failures: list[str]) -> list[str]:
    """The verdict's tags, its own first (`calling_tags`)."""
    tags = ["regressed", *(f"regressed:{e}" for e in regressed)] if regressed else []
    tags += ["gate-failed"] if failures else []
    tags += ["errors"] if summary.task_errors + summary.evaluator_errors else []
    unread = not_compared(comparison) or (apart is not None and not_compared(apart.comparison))
    return list(dict.fromkeys(tags + (["not-compared"] if unread else [])))


def _moved(base_worse: list[EvaluatorComparison], moved: list[EvaluatorComparison],
           rule: Rule) -> list[str]:
    """What the message says moved: against the baseline (when it is not the previous
    run), then against the previous run what that does not say already."""
    said_base = [said(e, rule) for e in base_worse]
    names = {e.evaluator for e in base_worse}
    rest = [said(e, rule) for e in moved if e.evaluator not in names]
    if said_base and rest:
        rest = ["against the previous run: " + "; ".join(rest)]
    return said_base + rest


def calling_tags(note: VerdictNote) -> list[str]:
    """The verdict's tags for the flow run that called the experiment (a deployment's):
    the verdict's own, not each evaluator's. Prefect's v1 UI sorts a run's tags and keeps
    the last that fit: ``regressed:<evaluator>`` sorts after ``regressed`` and pushed it
    out (the experiment's own flow run keeps them all)."""
    return [t for t in note.tags if not t.startswith("regressed:")]


def _since(baseline: Baseline | None, worse: list[EvaluatorComparison]) -> str | None:
    """The first night of a regression against the baseline still on: the previous
    night's, else this one (the comparison's B)."""
    if baseline is None or not worse or not isinstance(baseline.comparison, Comparison):
        return None
    return baseline.since or baseline.comparison.b


def _head(name: str, baseline: Baseline | None, since: str | None, failures: list[str]) -> str:
    """``Regressed since exp-2, against baseline exp-1: `` (the verdict, then what it is)."""
    head = name
    if since is not None and baseline is not None:
        head += f" since {since}, against baseline {baseline.name}"
    head += ": "
    if failures:
        head += "quality gate failed: " + "; ".join(failures) + ". "
    return head


def _more_errors(comparison: Comparison | str | None) -> bool:
    """Whether this run errored more than the previous one (none, or not known: taken as
    more). A dataset's known bad row named every night "Errors", hiding "Unchanged" or
    "Improved"; the ``errors`` tag still says there were some."""
    if not isinstance(comparison, Comparison) or None in (comparison.errors_a, comparison.errors_b):
        return True
    return (comparison.errors_b or 0) > (comparison.errors_a or 0)


def not_compared(comparison: Comparison | str | None) -> str | None:
    """Why a previous run was there and nothing could be compared with it, if so: its
    results unreadable, an evaluator with no verdict this run (its judge down), or no
    evaluator in both runs (renamed, replaced)."""
    if isinstance(comparison, NotCompared):
        return str(comparison)
    if isinstance(comparison, Comparison) and comparison.unjudged_b:
        return (f"no verdict this run from {', '.join(comparison.unjudged_b)} (every "
                "evaluation unscored: a judge that did not answer)")
    if isinstance(comparison, Comparison) and not comparison.evaluators:
        return (f"no evaluator is in both runs (the previous: "
                f"{', '.join(comparison.only_evaluators_a) or 'none'}; this one: "
                f"{', '.join(comparison.only_evaluators_b) or 'none'})")
    return None


def regression_failures(comparison: Comparison | str | None, rule: Rule,
                        against: str = "previous run") -> list[str]:
    """One message per evaluator whose regression fails the run (`Rule.fail_on`); with a
    run that could not be read, one saying the gate could not be checked (a baseline
    gone is no pass: every row may have regressed). ``against``: which run it is."""
    why_not = not_compared(comparison)
    where = "" if against == "previous run" else f" against the {against}"
    unchecked = [f"fail_on_regression could not be checked{where}: {why_not}"] if why_not else []
    if not isinstance(comparison, Comparison) or rule.fail_on is None:
        return unchecked if rule.fail_on is not None else []
    why = "significantly" if rule.fail_on == "significant" else "worse"
    run = "the previous run" if against == "previous run" else f"the {against} {comparison.a}"
    return unchecked + [f"{e.evaluator} [link {e.link_index}] regressed ({why}) against {run}: "
                        + said(e, rule) for e in comparison.evaluators if rule.fails(e)]
