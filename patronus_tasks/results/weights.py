"""Weighted scores: each row's evaluators combined by their weights (the Patronus SDK
0.1.x's ``weight=``, which the SDK only stores: here it also scores).

A row's weighted score is ``sum(weight * score) / sum(weight)`` over its weighted
evaluators, where an evaluator's score is its ``score``, else its verdict (1 pass, 0
fail). A row whose weighted evaluator gave neither (an error, a skip, a text only) has
no weighted score: a missing verdict is never counted as a zero or left out of the sum.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

#: The columns of `weighted_scores`.
COLUMNS = ["sid", "repeat", "weighted_score"]


def weighted_scores(df: pd.DataFrame) -> pd.DataFrame:
    """One row per run of a row that has weighted evaluators: its weighted score (NaN
    when one of them gave no score)."""
    if "weight" not in df.columns:
        return pd.DataFrame(columns=COLUMNS)
    weighted = df[df["weight"].notna() & df["evaluator_name"].notna()]
    if weighted.empty:
        return pd.DataFrame(columns=COLUMNS)
    if "repeat" not in weighted.columns:
        weighted = weighted.assign(repeat=0)
    verdict = weighted["pass"].map(lambda p: np.nan if p is None or pd.isna(p) else float(p))
    value = weighted["score"].astype("float64").fillna(verdict)
    frame = weighted.assign(_w=weighted["weight"].astype("float64"), _v=value)
    rows = frame.groupby(["sid", "repeat"], sort=False, dropna=False)
    out = rows.apply(_combine, include_groups=False).rename("weighted_score").reset_index()
    return out[COLUMNS]


def _combine(group: pd.DataFrame) -> float:
    if group["_v"].isna().any() or group["_w"].sum() <= 0:
        return float("nan")
    return float((group["_w"] * group["_v"]).sum() / group["_w"].sum())


def mean_weighted_score(df: pd.DataFrame) -> tuple[float | None, int, int]:
    """The mean weighted score over the runs of rows that have one, how many have one,
    and how many (with weighted evaluators) have none."""
    scores = weighted_scores(df)["weighted_score"].astype("float64")
    scored = scores.dropna()
    return (float(scored.mean()) if len(scored) else None), len(scored), len(scores) - len(scored)
