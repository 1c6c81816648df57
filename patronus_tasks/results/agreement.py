"""How far a judge agrees with human labels: accuracy, Cohen's kappa (quadratically
weighted on an ordinal scale), Krippendorff's alpha across the judges of a panel, the
confusion matrix and the rows where judge and human disagree.

A judge's category on a row is what it answered (``raw`` in its metadata: the 1-N value
or the choice), else its pass/fail verdict. A label is compared as the same kind of
thing: ``pass``/``fail``, ``true``/``false``, ``yes``/``no``, 1/0 for a pass/fail judge;
the number or the choice's name otherwise. Unscored rows (no verdict) and rows without
a label are left out and counted.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from patronus_tasks.define.row import clean
from patronus_tasks.record.records import STATUS_OK
from patronus_tasks.results.summary import unscored_mask

#: The experiment tag saying which evaluator is calibrated against which label column.
CALIBRATION_TAG = "calibration"
_TRUE = {"pass", "passed", "true", "yes", "y", "1", "1.0"}
_FALSE = {"fail", "failed", "false", "no", "n", "0", "0.0"}


@dataclass(frozen=True)
class Agreement:
    """A judge against human labels (see the module)."""

    evaluator: str
    label: str
    n: int
    accuracy: float | None
    kappa: float | None
    weighted: bool  # kappa with quadratic weights (an ordinal scale)
    alpha: float | None  # Krippendorff's alpha across a panel's judges
    categories: list[str]
    confusion: pd.DataFrame  # rows: human label, columns: judge
    disagreements: pd.DataFrame  # sid, repeat, human, judge, explanation
    unscored: int = 0
    unlabelled: int = 0
    judges: list[str] = field(default_factory=list)

    def metrics(self, prefix: str = "judge") -> dict[str, float | None]:
        found = {f"{prefix}_n": float(self.n), f"{prefix}_accuracy": self.accuracy,
                 f"{prefix}_kappa": self.kappa}
        if self.judges:
            found[f"{prefix}_alpha"] = self.alpha
        return found

    def headline(self) -> str:
        kappa = "-" if self.kappa is None else f"{self.kappa:.3f}"
        acc = "-" if self.accuracy is None else f"{self.accuracy:.1%}"
        more = f", Krippendorff's alpha {self.alpha:.3f} across {len(self.judges)} judges" \
            if self.alpha is not None else ""
        return (f"{self.evaluator} vs human `{self.label}` on {self.n} rows: accuracy {acc}, "
                f"{'weighted ' if self.weighted else ''}Cohen's kappa {kappa}{more}; "
                f"{len(self.disagreements)} disagree"
                + (f"; {self.unscored} unscored" if self.unscored else "")
                + (f"; {self.unlabelled} without a label" if self.unlabelled else ""))


    def confusion_rows(self) -> list[dict[str, Any]]:
        """The confusion matrix as table rows: the human label, then a count per judge answer."""
        return [{"human \\ judge": h, **{str(j): int(self.confusion.loc[h, j]) for j in self.categories}}
                for h in self.categories]

    def disagreement_rows(self, limit: int = 10) -> list[dict[str, Any]]:
        return [{"sid": str(r.sid), "human": r.human, "judge": r.judge,
                 "explanation": _short(r.explanation)} for r in self.disagreements.head(limit).itertuples()]


def _short(text: Any, limit: int = 160) -> str:
    text = "" if text is None or (isinstance(text, float) and math.isnan(text)) else str(text)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def of_experiment(experiment: Any) -> Agreement | None:
    """The agreement a calibration run measured (None for other experiments)."""
    found = calibrated(experiment.manifest.tags)
    if found is None:
        return None
    verdicts = by_verdict(scale_in(experiment.manifest, found[0]))
    return agreement(experiment.to_dataframe(), *found, verdicts=verdicts)


def scale_in(manifest: Any, evaluator: str) -> list[str] | None:
    """The scale a run's manifest gives ``evaluator`` (None: not said)."""
    for link in manifest.links:
        for e in link.evaluators:
            if e.name == evaluator and e.scale:
                return list(e.scale)
    return None


def by_verdict(scale: list[str] | None) -> bool:
    """Whether a judge on ``scale`` is compared by its pass/fail verdict (a judge of
    claims answers ``3/4``, and is labelled pass or fail)."""
    return scale is not None and set(scale) == {"pass", "fail"}



def category(value: Any) -> str | None:
    """A label or a judge's answer as a category (None: missing)."""
    value = clean(value)
    if value is None:
        return None
    if isinstance(value, bool):
        return "pass" if value else "fail"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = str(value).strip()
    return text or None


def as_verdict(value: str | None) -> str | None:
    """A category read as pass/fail where it is one of the pass/fail spellings."""
    if not isinstance(value, str):  # None, or pandas' NaN for it
        return None
    low = value.lower()
    return "pass" if low in _TRUE else "fail" if low in _FALSE else value


def judged(records: pd.DataFrame, verdicts: bool = False) -> pd.Series:
    """Each record's judge answer as a category (see the module); ``verdicts``: its
    pass/fail verdict whatever it answered (a judge of claims answers ``3/4``)."""
    if verdicts:
        return records["pass"].map(category).map(as_verdict) if len(records) else pd.Series(dtype=object)
    return _judged(records)


def _judged(records: pd.DataFrame) -> pd.Series:
    def one(row: pd.Series) -> str | None:
        meta = _meta(row.get("evaluation_metadata"))
        raw = meta.get("raw") if not isinstance(meta.get("raw"), list) else None
        return category(raw if raw is not None else row.get("pass"))
    return records.apply(one, axis=1) if len(records) else pd.Series(dtype=object)


def _meta(text: Any) -> dict[str, Any]:
    if not isinstance(text, str):
        return {}
    try:
        found = json.loads(text)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def agreement(df: pd.DataFrame, evaluator: str, label: str, verdicts: bool = False) -> Agreement:
    """The agreement of ``evaluator``'s verdicts with the ``label`` column in records ``df``
    (``verdicts``: its pass/fail verdicts, whatever else it answered)."""
    mine = df[df["evaluator_name"] == evaluator]
    unscored = int(unscored_mask(mine).sum())
    scored = mine[mine["status"] == STATUS_OK]
    human = scored[label].map(category) if label in scored.columns else pd.Series(None, index=scored.index)
    judge = judged(scored, verdicts)
    verdicts = set(judge.dropna()) <= {"pass", "fail"}
    if verdicts:
        human = human.map(as_verdict)
    keep = human.notna() & judge.notna()
    pairs = list(zip(human[keep], judge[keep], strict=True))
    cats = _categories([c for p in pairs for c in p])
    ordinal = len(cats) > 2 and all(_number(c) is not None for c in cats)
    kappa = cohen_kappa(pairs, cats, weighted=ordinal) if pairs else None
    alpha, judges = _panel_alpha(scored[keep], ordinal)
    differs = [h != j for h, j in pairs]
    wrong = scored[keep][differs]
    return Agreement(
        evaluator=evaluator, label=label, n=len(pairs),
        accuracy=sum(h == j for h, j in pairs) / len(pairs) if pairs else None,
        kappa=kappa, weighted=ordinal, alpha=alpha, categories=cats,
        confusion=confusion(pairs, cats),
        disagreements=pd.DataFrame({
            "sid": wrong["sid"].astype(str), "repeat": wrong.get("repeat"),
            "human": human[keep][differs], "judge": judge[keep][differs],
            "explanation": wrong.get("explanation")}).reset_index(drop=True),
        unscored=unscored, unlabelled=int((~human.notna()).sum()), judges=judges)


def _number(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None


def _categories(values: Sequence[str]) -> list[str]:
    found = sorted(set(values), key=lambda c: (_number(c) is None, _number(c) or 0.0, c))
    return found


def confusion(pairs: Sequence[tuple[str, str]], cats: list[str]) -> pd.DataFrame:
    """Counts of (human, judge) pairs: a row per human label, a column per judge answer."""
    counts = Counter(pairs)
    return pd.DataFrame([[counts.get((h, j), 0) for j in cats] for h in cats],
                        index=pd.Index(cats, name="human"), columns=pd.Index(cats, name="judge"))


def cohen_kappa(pairs: Sequence[tuple[str, str]], cats: list[str], *, weighted: bool = False) -> float | None:
    """Cohen's kappa of two raters over ``cats``: unweighted, or with quadratic weights
    (the categories being ordered as ``cats``). None when chance agreement is total."""
    k, n = len(cats), len(pairs)
    index = {c: i for i, c in enumerate(cats)}
    observed = [[0.0] * k for _ in range(k)]
    for a, b in pairs:
        observed[index[a]][index[b]] += 1 / n
    rows = [sum(r) for r in observed]
    cols = [sum(observed[i][j] for i in range(k)) for j in range(k)]
    weight: Callable[[int, int], float] = (
        (lambda i, j: (i - j) ** 2 / (k - 1) ** 2) if weighted and k > 1 else (lambda i, j: float(i != j)))
    disagree_obs = sum(weight(i, j) * observed[i][j] for i in range(k) for j in range(k))
    disagree_exp = sum(weight(i, j) * rows[i] * cols[j] for i in range(k) for j in range(k))
    if disagree_exp == 0:
        return None
    return 1 - disagree_obs / disagree_exp


def krippendorff_alpha(units: Sequence[Sequence[str | None]], *, interval: bool = False) -> float | None:
    """Krippendorff's alpha of raters' values per unit (None: a rater gave none), nominal or
    interval. Units with fewer than two values are left out. None when there is no
    expected disagreement (every value the same)."""
    def delta(a: str, b: str) -> float:
        return (float(a) - float(b)) ** 2 if interval else float(a != b)

    pairable = [[v for v in u if v is not None] for u in units]
    pairable = [u for u in pairable if len(u) >= 2]
    n = sum(len(u) for u in pairable)
    if n < 2:
        return None
    def spread(counts: Counter[str]) -> float:
        return sum(ca * cb * delta(a, b) for a, ca in counts.items() for b, cb in counts.items())

    observed = sum(spread(Counter(u)) / (len(u) - 1) for u in pairable)
    expected = spread(Counter(v for u in pairable for v in u)) / (n - 1)
    if expected == 0:
        return None
    return 1 - observed / expected


def _panel_alpha(records: pd.DataFrame, ordinal: bool) -> tuple[float | None, list[str]]:
    """Krippendorff's alpha across a panel's judges (their answers in the metadata)."""
    units, models = [], []
    for text in records.get("evaluation_metadata", pd.Series(dtype=object)):
        judges = _meta(text).get("judges")
        if isinstance(judges, list) and len(judges) >= 2:
            units.append([category(j.get("raw")) for j in judges])
            models = [str(j.get("model")) for j in judges]
    if not units:
        return None, []
    interval = ordinal and all(v is None or _number(v) is not None for u in units for v in u)
    return krippendorff_alpha(units, interval=interval), models


def calibrated(tags: dict[str, str] | None) -> tuple[str, str] | None:
    """(evaluator, label column) when an experiment is a calibration (its tag says so)."""
    value = (tags or {}).get(CALIBRATION_TAG)
    if not value or "|" not in value:
        return None
    evaluator, _, label = value.rpartition("|")
    return evaluator, label
