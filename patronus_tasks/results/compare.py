"""Comparing two experiments row by row: pass rates, scores, significance, regressions.

Rows are paired by sample id within each (chain link, evaluator). An errored evaluation
counts as not passed and has no score. Each run's pass rate is over its judged rows, as
its summary says it (`summary.passed_said`): a row whose task failed is not judged, and
is counted apart (``not_judged_a``, ``not_judged_b``); in the rows that got worse or
better, and in the test, it counts as not passed (a model that crashes is worse, never
left out). Pass/fail uses McNemar's exact test on the discordant pairs; scores use a
paired bootstrap of the mean difference (seeded, so the same inputs always give the same
figures).

With repeats (``repeats=N``), runs pair by sample id and repeat (``pair="repeat"``, when
both experiments ran the same repeats) or each row's mean over its runs is compared
(``pair="mean"``, the default when they differ: a row's pass share and mean score, the
difference by a paired bootstrap). The calls, tokens and cost of both, and their
dataset-level metrics, are set side by side.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from patronus_tasks.exceptions import ConfigError
from patronus_tasks.record.manifest import MetricValue, UsageTotal
from patronus_tasks.record.records import STATUS_ERROR, STATUS_OK
from patronus_tasks.results.experiment import Experiment
from patronus_tasks.results.reviewed import AgreementChange
from patronus_tasks.results.reviewed import changes as agreement_changes
from patronus_tasks.results.stats import bootstrap, mcnemar, paired_pass_ci
from patronus_tasks.results.store import load_pair
from patronus_tasks.results.summary import unscored_mask
from patronus_tasks.results.usage import total_cost, usage_totals


@dataclass(frozen=True)
class EvaluatorComparison:
    """One evaluator of one link in experiments A and B, over the samples both have."""

    link_index: int
    evaluator: str
    paired: int
    pass_rate_a: float | None = None
    pass_rate_b: float | None = None
    pass_diff: float | None = None
    pass_diff_ci: tuple[float, float] | None = None
    mcnemar_b: int = 0  # passed in A, not in B
    mcnemar_c: int = 0  # passed in B, not in A
    mcnemar_statistic: float | None = None
    mcnemar_p: float | None = None
    pass_p: float | None = None  # rows' pass shares (``pair="mean"``): paired bootstrap p
    mean_a: float | None = None
    mean_b: float | None = None
    mean_diff: float | None = None
    mean_diff_ci: tuple[float, float] | None = None
    score_p: float | None = None
    regressed: list[str] = field(default_factory=list)
    improved: list[str] = field(default_factory=list)
    #: An evaluator of texts only (no pass, no score): the rows whose text differs.
    changed: list[str] = field(default_factory=list)
    text_rows: int = 0  # the rows (sample ids) whose texts were compared
    #: Paired rows with a verdict in both runs (a failed task counts: not passed), and
    #: each run's rows whose task failed (not in its pass rate).
    verdict_rows: int = 0
    not_judged_a: int = 0
    not_judged_b: int = 0

    def regressed_significantly(self, alpha: float = 0.05) -> bool:
        """The pass rate fell with McNemar p < ``alpha`` (with no verdicts: the mean score
        fell with the bootstrap's p < ``alpha``)."""
        p = self.mcnemar_p if self.mcnemar_p is not None else self.pass_p
        if self.verdict_rows and p is not None:  # the test's rows: a failed task not passed
            fell = (self.mcnemar_b > self.mcnemar_c if self.mcnemar_p is not None
                    else len(self.regressed) > len(self.improved))
            return fell and p < alpha
        if self.mean_diff is not None and self.score_p is not None:
            return self.mean_diff < 0 and self.score_p < alpha
        return False


@dataclass(frozen=True)
class Comparison:
    """Experiment B against baseline A."""

    a: str
    b: str
    evaluators: list[EvaluatorComparison]
    only_in_a: int
    only_in_b: int
    pairing: str = "sid"  # "sid", "repeat" (sample id and repeat) or "mean" (rows' means)
    usage_a: list[UsageTotal] = field(default_factory=list)
    usage_b: list[UsageTotal] = field(default_factory=list)
    metrics_a: list[MetricValue] = field(default_factory=list)
    metrics_b: list[MetricValue] = field(default_factory=list)
    #: Evaluators one run has and the other not (renamed, added, dropped): not compared.
    only_evaluators_a: list[str] = field(default_factory=list)
    only_evaluators_b: list[str] = field(default_factory=list)
    #: The two runs' datasets differ (their content hashes): rows pair by sample id all
    #: the same, and a row of one id may hold other data.
    datasets_differ: bool = False
    #: Evaluators of both runs with a verdict in one and none in the other (every one of
    #: its evaluations unscored: a judge that did not answer all night).
    unjudged_a: list[str] = field(default_factory=list)
    unjudged_b: list[str] = field(default_factory=list)
    #: Records that errored in each run (a task's, an evaluator's): the verdict is named
    #: "Errors" only when there are more than before (a known bad row is no news nightly).
    errors_a: int | None = None
    errors_b: int | None = None
    #: Judges with human labels in both runs: their kappa with people in each (`reviewed`).
    agreements: list[AgreementChange] = field(default_factory=list)

    @property
    def cost_a(self) -> float | None:
        return total_cost(self.usage_a)

    @property
    def cost_b(self) -> float | None:
        return total_cost(self.usage_b)

    @property
    def has_regressions(self) -> bool:
        return any(e.regressed for e in self.evaluators)

    def significant_regressions(self, alpha: float = 0.05) -> list[EvaluatorComparison]:
        """The evaluators that regressed significantly (`regressed_significantly`)."""
        return [e for e in self.evaluators if e.regressed_significantly(alpha)]

    def format(self, rows_shown: int = 10) -> str:
        """A text report: per evaluator the figures, then regressed and improved samples."""
        lines = [f"Comparing B={self.b} against A={self.a}"
                 + {"repeat": " (runs paired by sample id and repeat)",
                    "mean": " (rows' means over their repeats)"}.get(self.pairing, "")]
        if self.datasets_differ:
            lines.append("The datasets differ (content hash): rows are paired by sample id; a "
                         "row of one id may hold other data in each")
        if self.only_in_a or self.only_in_b:
            lines.append(f"Unpaired samples: {self.only_in_a} only in A, {self.only_in_b} only in B")
        if self.only_evaluators_a or self.only_evaluators_b:
            lines.append("Not compared (in one run only): "
                         f"A {', '.join(self.only_evaluators_a) or 'none'}; "
                         f"B {', '.join(self.only_evaluators_b) or 'none'}")
        for run, names in (("A", self.unjudged_a), ("B", self.unjudged_b)):
            if names:
                lines.append(f"Not compared (no verdict in {run}: every evaluation unscored, "
                             f"a judge that did not answer): {', '.join(names)}")
        for e in self.evaluators:
            lines.extend(_format_one(e, rows_shown))
        lines += ["", *(c.said() for c in self.agreements)] if self.agreements else []
        return "\n".join(lines + self.format_metrics() + self.format_usage())

    def format_metrics(self) -> list[str]:
        """The dataset-level metrics of A and B, by name."""
        a, b = {m.name: m for m in self.metrics_a}, {m.name: m for m in self.metrics_b}
        if not a and not b:
            return []
        lines = ["", "Metrics (dataset-level)"]
        for name in dict.fromkeys([*a, *b]):
            va, vb = _value(a.get(name)), _value(b.get(name))
            diff = f"  diff {vb - va:+.4g}" if va is not None and vb is not None else ""
            lines.append(f"  {name}: A {_shown(a.get(name))}  B {_shown(b.get(name))}{diff}")
        return lines

    def format_usage(self) -> list[str]:
        """Calls, tokens and cost of A and B (calls made; cached apart)."""
        if not self.usage_a and not self.usage_b:
            return []
        def one(usage: list[UsageTotal]) -> str:
            cost = total_cost(usage)
            made = sum(u.calls for u in usage)
            used = any(u.model or u.input_tokens or u.output_tokens for u in usage)
            shown = (f"${cost:.4g}" if cost is not None else "unknown" if used
                     else "none (no model usage recorded)")
            return (f"cost {shown}, "
                    f"{sum(u.input_tokens for u in usage):,} tokens in, "
                    f"{sum(u.output_tokens for u in usage):,} out, "
                    f"{made} calls made, {sum(u.cached for u in usage)} cached")
        lines = ["", "Tokens and cost", f"  A: {one(self.usage_a)}", f"  B: {one(self.usage_b)}"]
        if self.cost_a is not None and self.cost_b is not None:
            lines.append(f"  cost diff {self.cost_b - self.cost_a:+.4g} USD"
                         + (f" ({self.cost_b / self.cost_a - 1:+.1%})" if self.cost_a else ""))
        return lines


def _value(m: MetricValue | None) -> float | None:
    return None if m is None else m.value


def _shown(m: MetricValue | None) -> str:
    if m is None:
        return "-"
    if m.error is not None:
        return "error"
    return "-" if m.value is None else f"{m.value:.4g}"


def _f(value: float | None, pct: bool = False, signed: bool = False) -> str:
    """A figure: a share as a percentage, a difference (``signed``) with its sign."""
    if value is None:
        return "-"
    if pct:
        return f"{value:+.1%}" if signed and value != 0 else f"{value:.1%}"
    return f"{value:.3f}"


def _format_one(e: EvaluatorComparison, shown: int) -> list[str]:
    lines = ["", f"{e.evaluator} [link {e.link_index}]  ({e.paired} paired samples)"]
    if e.verdict_rows and e.pass_diff_ci is not None:
        lo, hi = e.pass_diff_ci
        test = (f"McNemar b={e.mcnemar_b} c={e.mcnemar_c} chi2={_f(e.mcnemar_statistic)} "
                f"p={_f(e.mcnemar_p)}" if e.mcnemar_p is not None
                else f"paired bootstrap of rows' pass shares p={_f(e.pass_p)}")
        lines.append(f"  pass rate  A {_f(e.pass_rate_a, True)}  B {_f(e.pass_rate_b, True)}  "
                     f"diff {_f(e.pass_diff, True, signed=True)} [{lo:+.1%}, {hi:+.1%}]  {test}")
        if e.not_judged_a or e.not_judged_b:
            lines.append(f"  of judged rows: a row whose task failed is not judged (A {e.not_judged_a}, "
                         f"B {e.not_judged_b}); in the rows worse or better and the test it is "
                         "not passed")
    if e.mean_a is not None and e.mean_diff_ci is not None:
        lo, hi = e.mean_diff_ci
        lines.append(f"  mean score A {_f(e.mean_a)}  B {_f(e.mean_b)}  diff {e.mean_diff:+.3f} "
                     f"[{lo:+.3f}, {hi:+.3f}]  paired bootstrap p={_f(e.score_p)}")
    for label, sids in (("regressed", e.regressed), ("improved", e.improved),
                        ("text changed", e.changed)):
        if sids:
            more = f" (+{len(sids) - shown} more)" if len(sids) > shown else ""
            lines.append(f"  {label} ({len(sids)}): {', '.join(sids[:shown])}{more}")
    return lines


_OUTCOME = ["sid", "repeat", "link_index", "evaluator_name", "status", "pass", "score",
            "text_output"]


def _judges(pairs: list[tuple[Experiment, pd.DataFrame]]) -> dict[int, list[str]]:
    """Each link's evaluators, in either experiment: their manifests (a run whose every
    task failed has no evaluator's record), and the records (an older manifest lists no
    links)."""
    found: dict[int, list[str]] = {}
    for e, df in pairs:
        named = [(i, v.name) for i, link in enumerate(e.manifest.links) for v in link.evaluators]
        seen = df[df["evaluator_name"].notna()][["link_index", "evaluator_name"]]
        for index, name in [*named, *seen.drop_duplicates().itertuples(index=False)]:
            names = found.setdefault(int(index), [])
            names += [] if name in names else [str(name)]
    return found


def _task_failures(df: pd.DataFrame, judges: dict[int, list[str]]) -> pd.DataFrame:
    """A row whose task failed, as a failed evaluation by each evaluator of its link and
    of every later link (the chain stopped there): a crashed model is a regression, never
    a row left out of the comparison (it was: a run whose every task failed compared as
    "same"). A task that returned None skipped the row on purpose: not counted."""
    failed = df[df["evaluator_name"].isna() & (df["status"] == STATUS_ERROR)]
    return pd.DataFrame(
        [{"sid": r.sid, "repeat": r.repeat, "link_index": link, "evaluator_name": name,
          "status": STATUS_ERROR, "pass": None, "score": np.nan, "text_output": None,
          "crashed": True}
         for r in failed[["sid", "repeat", "link_index"]].itertuples()
         for link, names in judges.items() if link >= int(r.link_index) for name in names],
        columns=[*_OUTCOME, "crashed"])


def _outcomes(df: pd.DataFrame, judges: dict[int, list[str]]) -> pd.DataFrame:
    if "repeat" not in df.columns:
        df = df.assign(repeat=None)
    # An unscored evaluation (no verdict) is neither a pass nor a fail: not paired.
    evals = df[df["evaluator_name"].notna() & df["status"].isin([STATUS_OK, STATUS_ERROR])
               & ~unscored_mask(df)]
    out = evals.reindex(columns=_OUTCOME).copy()  # text_output: absent from older files
    out["crashed"] = False  # made from a failed task's row (`_task_failures`), not judged
    crashed = _task_failures(df, judges)
    if len(crashed):
        out = pd.concat([out.astype(object), crashed.astype(object)], ignore_index=True)
        out["score"] = pd.to_numeric(out["score"], errors="coerce")
    errored = out["status"] == STATUS_ERROR
    out["passed"] = out["pass"].astype("boolean").fillna(False).where(~errored, False)
    out["has_pass"] = out["pass"].notna() | errored
    # 0: no repeats (null), so that keys compare equal whatever the column's dtype
    out["repeat"] = pd.to_numeric(out["repeat"], errors="coerce").fillna(0).astype(int)
    return out


def _row_means(o: pd.DataFrame) -> pd.DataFrame:
    """Each row's share of passed runs (of those with a verdict) and mean score."""
    judged = o.assign(passed=o["passed"].astype(float).where(o["has_pass"]),
                      text_output=o["text_output"].astype(object).where(o["text_output"].notna(), None))
    means = judged.groupby(["sid", "link_index", "evaluator_name"], sort=False).agg(
        passed=("passed", "mean"), score=("score", "mean"), has_pass=("has_pass", "any"),
        crashed=("crashed", "all"),  # texts: each row's, its runs' in order
        text_output=("text_output", lambda t: " | ".join(map(str, t)) if t.notna().any() else None))
    return means.reset_index()


def _judged_rates(verdicts: pd.DataFrame) -> dict[str, object]:
    """Each run's pass rate over its judged rows (a failed task's row left out, counted
    apart), and their difference: the figures its summary says."""
    out: dict[str, object] = {"verdict_rows": len(verdicts)}
    for run in ("a", "b"):
        crashed = verdicts[f"crashed_{run}"].astype(bool).to_numpy()
        judged = verdicts.loc[~crashed, f"passed_{run}"].astype(float)
        out[f"pass_rate_{run}"] = float(judged.mean()) if len(judged) else None
        out[f"not_judged_{run}"] = int(crashed.sum())
    a, b = out["pass_rate_a"], out["pass_rate_b"]
    out["pass_diff"] = b - a if isinstance(a, float) and isinstance(b, float) else None
    return out


def _mean_verdicts(verdicts: pd.DataFrame, level: float, n_boot: int,
                   seed: int) -> dict[str, object]:
    """Rows' pass shares compared: a paired bootstrap of their mean difference."""
    diffs = (verdicts["passed_b"] - verdicts["passed_a"]).to_numpy(dtype=float)
    ci, p = bootstrap(diffs, level, n_boot, seed)
    return {**_judged_rates(verdicts), "pass_diff_ci": ci, "pass_p": p}


def _compare_group(link: int, name: str, g: pd.DataFrame, level: float, n_boot: int,
                   seed: int, means: bool = False) -> EvaluatorComparison:
    g = g.sort_values("sid", key=_natural)  # s2 before s10, as a person counts
    fields: dict[str, object] = {}
    verdicts = g[g["has_pass_a"] & g["has_pass_b"]]
    if len(verdicts) and means:
        fields.update(_mean_verdicts(verdicts, level, n_boot, seed))
        moved = verdicts["passed_b"] - verdicts["passed_a"]
        regressed = verdicts.loc[(moved < 0).to_numpy(), "sid"].tolist()
        improved = verdicts.loc[(moved > 0).to_numpy(), "sid"].tolist()
    elif len(verdicts):
        pa_, pb_ = verdicts["passed_a"].astype(bool), verdicts["passed_b"].astype(bool)
        b, c = int((pa_ & ~pb_).sum()), int((~pa_ & pb_).sum())
        stat, p = mcnemar(b, c)
        fields.update(_judged_rates(verdicts),
                      pass_diff_ci=paired_pass_ci(b, c, len(verdicts), level),
                      mcnemar_b=b, mcnemar_c=c, mcnemar_statistic=stat, mcnemar_p=p)
        regressed = verdicts.loc[(pa_ & ~pb_).to_numpy(), "sid"].tolist()
        improved = verdicts.loc[(~pa_ & pb_).to_numpy(), "sid"].tolist()
    scores = g.dropna(subset=["score_a", "score_b"])
    if len(scores):
        diffs = (scores["score_b"] - scores["score_a"]).to_numpy(dtype=float)
        ci, p = bootstrap(diffs, level, n_boot, seed)
        fields.update(mean_a=float(scores["score_a"].mean()), mean_b=float(scores["score_b"].mean()),
                      mean_diff=float(diffs.mean()), mean_diff_ci=ci, score_p=p)
        if not len(verdicts):  # no pass/fail: a lower score is the regression
            regressed = scores.loc[diffs < 0, "sid"].tolist()
            improved = scores.loc[diffs > 0, "sid"].tolist()
    if not len(verdicts) and not len(scores):
        regressed, improved = [], []
        texts = g.dropna(subset=["text_output_a", "text_output_b"], how="all")
        fields["changed"] = texts.loc[(texts["text_output_a"].astype(str)
                                       != texts["text_output_b"].astype(str)).to_numpy(),
                                      "sid"].drop_duplicates().tolist()
        fields["text_rows"] = int(texts["sid"].nunique())
    return EvaluatorComparison(link_index=link, evaluator=name, paired=len(g),
                               regressed=list(dict.fromkeys(regressed)),
                               improved=list(dict.fromkeys(improved)), **fields)  # type: ignore[arg-type]


PAIRINGS = ("repeat", "mean")


def _pairing(oa: pd.DataFrame, ob: pd.DataFrame, pair: str | None) -> str:
    """How runs pair: by sample id (no repeats), by sample id and repeat, or rows' means."""
    ra, rb = {int(r) for r in oa["repeat"]} - {0}, {int(r) for r in ob["repeat"]} - {0}
    if pair is not None and pair not in PAIRINGS:
        raise ConfigError(f"pair must be 'repeat' or 'mean', not {pair!r}.")
    if pair == "repeat" and (not ra or ra != rb):
        raise ConfigError("pair='repeat' needs both experiments run with the same repeats "
                          f"(A: {sorted(ra) or 'none'}, B: {sorted(rb) or 'none'}); use pair='mean'.")
    if pair is not None:
        return pair
    return "sid" if not ra and not rb else ("repeat" if ra == rb else "mean")


def compare_experiments(a: Experiment | str | Path, b: Experiment | str | Path, *,
                        level: float = 0.95, n_boot: int = 2000, seed: int = 0,
                        pair: str | None = None) -> Comparison:
    """Compare experiment ``b`` with baseline ``a``, pairing rows by sample id (with
    repeats: ``pair="repeat"`` by sample id and repeat, ``pair="mean"`` rows' means).

    Each an `Experiment`, or what `load_experiment` takes (a folder, ``project/name``, a
    name: its latest run), as on the command line."""
    a, b = load_pair(a, b)
    dfa, dfb = a.to_dataframe(), b.to_dataframe()
    judges = _judges([(a, dfa), (b, dfb)])
    oa, ob = _outcomes(dfa, judges), _outcomes(dfb, judges)
    pairing = _pairing(oa, ob, pair)
    keys = ["sid", "link_index", "evaluator_name"]
    if pairing == "mean":
        oa, ob = _row_means(oa), _row_means(ob)
    else:
        keys.append("repeat")
    merged = oa.merge(ob, on=keys, suffixes=("_a", "_b"))
    groups = [
        _compare_group(int(link), str(name), g, level, n_boot, seed, pairing == "mean")
        for (link, name), g in merged.groupby(["link_index", "evaluator_name"], sort=True)
    ]
    sids_a, sids_b = set(oa["sid"]), set(ob["sid"])
    names_a, names_b = _configured(a, oa), _configured(b, ob)
    judged_a, judged_b = _judged(oa), _judged(ob)
    both = names_a & names_b
    hashes = {a.manifest.dataset.sha256, b.manifest.dataset.sha256}
    return Comparison(a=run_label(a), b=run_label(b), evaluators=groups,
                      only_evaluators_a=sorted(names_a - names_b),
                      only_evaluators_b=sorted(names_b - names_a),
                      unjudged_a=sorted(both & judged_b - judged_a),
                      unjudged_b=sorted(both & judged_a - judged_b),
                      errors_a=int((dfa["status"] == STATUS_ERROR).sum()),
                      errors_b=int((dfb["status"] == STATUS_ERROR).sum()),
                      datasets_differ=None not in hashes and len(hashes) > 1,
                      only_in_a=len(sids_a - sids_b), only_in_b=len(sids_b - sids_a),
                      pairing=pairing, usage_a=usage_totals(dfa), usage_b=usage_totals(dfb),
                      metrics_a=a.metrics, metrics_b=b.metrics,
                      agreements=agreement_changes(a, dfa, b, dfb))


def _natural(sids: pd.Series) -> pd.Series:
    return sids.astype(str).map(lambda sid: re.sub(r"\d+", lambda m: m.group().zfill(12), sid))


def _configured(e: Experiment, outcomes: pd.DataFrame) -> set[str]:
    """The evaluators a run had (its manifest; an older one's: those with records)."""
    named = {v.name for link in e.manifest.links for v in link.evaluators}
    return named or set(outcomes["evaluator_name"])


def _judged(outcomes: pd.DataFrame) -> set[str]:
    """The evaluators that gave a verdict or a score (an error counts: not passed)."""
    judged = (outcomes["has_pass"].astype(bool) | outcomes["score"].notna()) \
        & ~outcomes["crashed"].astype(bool)  # a task's failure is no judge's answer
    return set(outcomes.loc[judged, "evaluator_name"])


def run_label(e: Experiment) -> str:
    """A run's name, with its folder when that differs: two runs of one experiment name
    (``cached``, ``cached-2``) were both called ``cached``. Verdicts name runs so."""
    folder = e.location.name
    return e.name if folder == e.name else f"{e.name} ({folder})"
