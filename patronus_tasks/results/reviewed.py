"""A judge held to what people said of its rows (``labels.parquet``, `review`).

Each reviewed row's human label is its reviewers' most common one (a row they split
evenly on is left out, and counted); the judge's answer on it is compared with that
(`agreement.agreement`: accuracy, Cohen's kappa, weighted on a 1-N scale). Where two or
more people labelled the same rows, their own agreement is Krippendorff's alpha (interval
on a 1-N scale, else nominal), and a judge is never held to more than that: a
``min_kappa`` above the reviewers' alpha is lowered to it, and said.

Between two runs (`changes`), a judge's kappa is compared on the rows labelled in both
with the same label: a judge whose kappa fell is worse, like any evaluator.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from patronus_tasks.define.row import clean
from patronus_tasks.record.labels import empty_labels, read_labels
from patronus_tasks.record.records import STATUS_OK
from patronus_tasks.results.agreement import (
    Agreement,
    agreement,
    as_verdict,
    by_verdict,
    calibrated,
    category,
    cohen_kappa,
    judged,
    krippendorff_alpha,
    scale_in,
)

#: Fewer reviewed rows than this give no agreement figure: kappa on four rows is noise.
MIN_ROWS = 5
_HUMAN = "__human_label__"


def judge_rows(records: pd.DataFrame, evaluator: str) -> pd.DataFrame:
    """``evaluator``'s records, one per sample: its first link, its first repeat (the one
    a person reviews), in the file's order."""
    mine = records[records["evaluator_name"] == evaluator]
    order = [c for c in ("link_index", "repeat") if c in mine.columns]
    if order:
        mine = mine.sort_values(order, kind="stable", na_position="first")
    return mine.drop_duplicates("sid").sort_index()


def consensus(labels: pd.DataFrame, evaluator: str) -> tuple[pd.Series, int]:
    """Each labelled row's label (its reviewers' most common; a tie left out), by sid,
    and how many rows were tied."""
    mine = labels[labels["evaluator"] == evaluator]
    found, split = {}, 0
    for sid, group in mine.groupby("sid", sort=False):
        counts = group["label"].value_counts()
        if len(counts) > 1 and counts.iloc[0] == counts.iloc[1]:
            split += 1
            continue
        found[str(sid)] = str(counts.index[0])
    return pd.Series(found, dtype=object), split


def _interval(values: list[str]) -> bool:
    """Values of a 1-N scale (numbers, not a 0/1 verdict): compared by their distance."""
    return all(_is_number(v) for v in values) and not set(values) <= {"0", "1"}


def reviewers_alpha(labels: pd.DataFrame, evaluator: str) -> tuple[float | None, int]:
    """Krippendorff's alpha among the reviewers, over the rows two or more labelled (and
    how many rows that is)."""
    mine = labels[labels["evaluator"] == evaluator]
    units = [list(g["label"]) for _, g in mine.groupby("sid", sort=False) if len(g) >= 2]
    if not units:
        return None, 0
    values = [v for u in units for v in u]
    return krippendorff_alpha(units, interval=_interval(values)), len(units)


@dataclass(frozen=True)
class Reviewed:
    """A judge against its reviewers: the agreement (None: fewer than `MIN_ROWS` rows),
    who reviewed, how many rows, and the reviewers' own agreement."""

    evaluator: str
    agreement: Agreement | None
    reviewers: list[str]
    rows: int  # rows with a label (ties included)
    split: int = 0  # rows the reviewers split evenly on (no label to compare)
    reviewers_alpha: float | None = None
    shared: int = 0  # rows labelled by two or more reviewers

    def bar(self, min_kappa: float) -> tuple[float, str | None]:
        """The kappa the judge is held to: ``min_kappa``, or the reviewers' own alpha
        when that is lower (and why)."""
        alpha = self.reviewers_alpha
        if alpha is None or alpha >= min_kappa:
            return min_kappa, None
        return alpha, (f"min_kappa {min_kappa:g} is above the reviewers' own agreement "
                       f"(Krippendorff's alpha {alpha:.3f} on {self.shared} rows {len(self.reviewers)} "
                       f"people labelled): {self.evaluator} is held to {alpha:.3f}")

    def headline(self) -> str:
        who = f"{self.rows} rows labelled by {len(self.reviewers)} reviewer" + (
            "s" if len(self.reviewers) != 1 else "")
        judge = (self.agreement.headline() if self.agreement is not None
                 else f"{self.evaluator}: too few labelled rows to measure agreement "
                      f"(fewer than {MIN_ROWS})")
        among = (f"; the reviewers among themselves: Krippendorff's alpha "
                 f"{self.reviewers_alpha:.3f} on {self.shared} rows" if self.reviewers_alpha is not None
                 else "")
        split = f"; {self.split} rows the reviewers split on, left out" if self.split else ""
        return f"{who}. {judge}{among}{split}"


def reviewed(records: pd.DataFrame, labels: pd.DataFrame, evaluator: str,
             scale: list[str] | None = None) -> Reviewed:
    """``evaluator``'s answers in ``records`` against the ``labels`` people gave."""
    mine = labels[labels["evaluator"] == evaluator]
    human, split = consensus(labels, evaluator)
    rows = judge_rows(records, evaluator)
    rows = rows[rows["sid"].astype(str).isin(human.index)]
    rows = rows.assign(**{_HUMAN: rows["sid"].astype(str).map(human)})
    found = agreement(rows, evaluator, _HUMAN, by_verdict(scale)) if len(rows) else None
    alpha, shared = reviewers_alpha(labels, evaluator)
    if found is not None:
        found = replace(found, label="reviewers")
    return Reviewed(evaluator, found if found is not None and found.n >= MIN_ROWS else None,
                    sorted(set(mine["reviewer"])), int(mine["sid"].nunique()), split, alpha, shared)


def of_experiment(experiment: Any, evaluator: str) -> Reviewed:
    """`reviewed` of an `Experiment`: its records and its ``labels.parquet``."""
    return reviewed(experiment.to_dataframe(), experiment.labels(), evaluator,
                    scale_in(experiment.manifest, evaluator))


def reviewed_evaluators(labels: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(str(e) for e in labels["evaluator"]))


# Between two runs ---------------------------------------------------------------


@dataclass(frozen=True)
class AgreementChange:
    """A judge's kappa with people in runs A and B, on the rows labelled alike in both."""

    evaluator: str
    rows: int
    kappa_a: float | None
    kappa_b: float | None

    @property
    def diff(self) -> float | None:
        if self.kappa_a is None or self.kappa_b is None:
            return None
        return self.kappa_b - self.kappa_a

    def said(self) -> str:
        def shown(k: float | None) -> str:
            return "-" if k is None else f"{k:.3f}"
        diff = self.diff
        moved = "" if diff is None else f" ({diff:+.3f})"
        return (f"{self.evaluator} agreement with people: Cohen's kappa {shown(self.kappa_a)} → "
                f"{shown(self.kappa_b)}{moved} on {self.rows} rows labelled in both")


def human_labels(experiment: Any, records: pd.DataFrame) -> dict[str, pd.Series]:
    """Each judge's human labels in a run, by sid: its calibration's label column (a
    `calibrate` run), and what its reviewers said (``labels.parquet``, which wins)."""
    found: dict[str, pd.Series] = {}
    tagged = calibrated(experiment.manifest.tags)
    if tagged is not None and tagged[1] in records.columns:
        name, column = tagged
        rows = judge_rows(records, name)
        values = rows[column].map(category)
        found[name] = pd.Series(list(values), index=rows["sid"].astype(str)).dropna()
    try:
        labels = read_labels(experiment.location)
    except Exception:  # a damaged labels file is said where it is read; no figure here
        labels = empty_labels()
    for name in reviewed_evaluators(labels):
        human, _ = consensus(labels, name)
        found[name] = pd.concat([found.get(name, pd.Series(dtype=object)), human])
        found[name] = found[name][~found[name].index.duplicated(keep="last")]
    return found


def _kappa(pairs: list[tuple[str, str]]) -> float | None:
    cats = sorted({c for p in pairs for c in p})
    ordinal = len(cats) > 2 and all(_is_number(c) for c in cats)
    if ordinal:
        cats = sorted(cats, key=float)
    return cohen_kappa(pairs, cats, weighted=ordinal) if pairs else None


def _is_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def _answers(records: pd.DataFrame, evaluator: str, verdicts: bool) -> dict[str, str]:
    rows = judge_rows(records, evaluator)
    rows = rows[rows["status"] == STATUS_OK]
    return {str(s): a for s, a in zip(rows["sid"], judged(rows, verdicts), strict=True)
            if clean(a) is not None}


def _pairs(human: pd.Series, answers: dict[str, str], sids: list[str]) -> list[tuple[str, str]]:
    verdicts = set(answers.values()) <= {"pass", "fail"}
    return [(str(as_verdict(human[s]) if verdicts else human[s]), answers[s]) for s in sids]


def changes(a: Any, dfa: pd.DataFrame, b: Any, dfb: pd.DataFrame) -> list[AgreementChange]:
    """Each judge with human labels in both runs: its kappa in each, on the rows labelled
    alike in both that it answered in both (none when fewer than `MIN_ROWS`)."""
    la, lb = human_labels(a, dfa), human_labels(b, dfb)
    found = []
    for name in [n for n in la if n in lb]:
        ha, hb = la[name], lb[name]
        verdicts = by_verdict(scale_in(b.manifest, name) or scale_in(a.manifest, name))
        answers_a, answers_b = _answers(dfa, name, verdicts), _answers(dfb, name, verdicts)
        sids = [s for s in ha.index if s in hb.index and ha[s] == hb[s]
                and s in answers_a and s in answers_b]
        if len(sids) < MIN_ROWS:
            continue
        found.append(AgreementChange(name, len(sids), _kappa(_pairs(ha, answers_a, sids)),
                                     _kappa(_pairs(hb, answers_b, sids))))
    return found


# As a table ----------------------------------------------------------------------

#: Reviewed rows a table lists (the HTML report's and the review artifact's).
ROWS_SHOWN = 50


def review_rows(records: pd.DataFrame, labels: pd.DataFrame, evaluator: str,
                scale: list[str] | None = None, limit: int = ROWS_SHOWN) -> list[dict[str, Any]]:
    """The reviewed rows of ``evaluator`` beside its answers: a row each (``sid``, the
    judge's answer, each reviewer's label, their notes), disagreements first."""
    mine = labels[labels["evaluator"] == evaluator]
    if not len(mine):
        return []
    rows = judge_rows(records, evaluator)
    answers = dict(zip(rows["sid"].astype(str), judged(rows, by_verdict(scale)), strict=True))
    people = sorted(set(mine["reviewer"]))
    table = []
    for sid, group in mine.groupby("sid", sort=False):
        given = dict(zip(group["reviewer"], group["label"], strict=True))
        notes = "; ".join(f"{w}: {n}" for w, n in zip(group["reviewer"], group["note"], strict=True)
                          if isinstance(n, str) and n)
        judge = answers.get(str(sid))
        table.append({"sid": str(sid), "judge": judge if judge is not None else "(no answer)",
                      **{f"label by {p}": given.get(p, "") for p in people}, "notes": notes,
                      "_differs": any(v != judge for v in given.values())})
    table.sort(key=lambda r: not r["_differs"])
    return [{k: v for k, v in r.items() if k != "_differs"} for r in table[:limit]]
