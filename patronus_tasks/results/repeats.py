"""Statistics of an evaluator over repeated runs of each row (``repeats=N``).

LLM output varies run to run; with each row run k times an evaluator's verdicts say how
much of a pass rate is luck. Per row, the share of its k runs that passed; over rows:
their mean (the pass rate, its 95% interval clustered by row: the normal interval of
the mean of the rows' shares), pass@k (rows where at least one run passed: "can it"),
pass^k (rows where every run passed: "does it, every time") and the rows whose verdict
flips between runs. An errored evaluation counts as not passed, as in the pass rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from patronus_tasks.record.records import STATUS_ERROR, STATUS_OK


@dataclass(frozen=True)
class RepeatStats:
    """One evaluator over the repeats of its rows."""

    k: int  # runs per row (the most any row has)
    rows: int  # rows with a verdict in at least one run
    mean_pass_rate: float
    interval: tuple[float, float] | None  # 95%, clustered by row; None with one row
    pass_at_k: float  # share of rows where at least one run passed
    pass_hat_k: float  # share of rows where every run passed
    flipping: list[str] = field(default_factory=list)  # rows whose verdict differs between runs

    def headline(self) -> str:
        return (f"pass@{self.k} {self.pass_at_k:.1%}, pass^{self.k} {self.pass_hat_k:.1%}, "
                f"{len(self.flipping)} of {self.rows} rows flip")


def row_pass_shares(group: pd.DataFrame) -> pd.DataFrame:
    """Per row (sample id): runs judged (verdicts and errors), runs passed."""
    judged = group[((group["status"] == STATUS_OK) & group["pass"].notna())
                   | (group["status"] == STATUS_ERROR)]
    passed = judged["pass"].astype("boolean").fillna(False).astype(bool) & (
        judged["status"] == STATUS_OK)
    return pd.DataFrame({"sid": judged["sid"].astype(str), "passed": passed}).groupby(
        "sid", sort=True)["passed"].agg(runs="size", passed="sum")


def repeat_stats(group: pd.DataFrame) -> RepeatStats | None:
    """The evaluator's records ``group`` over repeats; None without repeats or verdicts."""
    if "repeat" not in group.columns or not group["repeat"].notna().any():
        return None
    per_row = row_pass_shares(group)
    if per_row.empty:
        return None
    share = per_row["passed"] / per_row["runs"]
    n, mean = len(share), float(share.mean())
    interval = None
    if n > 1:
        half = 1.96 * float(share.std(ddof=1)) / math.sqrt(n)
        interval = (max(0.0, mean - half), min(1.0, mean + half))
    flips = per_row[(per_row["passed"] > 0) & (per_row["passed"] < per_row["runs"])]
    return RepeatStats(k=int(per_row["runs"].max()), rows=n, mean_pass_rate=mean,
                       interval=interval, pass_at_k=float((per_row["passed"] > 0).mean()),
                       pass_hat_k=float((per_row["passed"] == per_row["runs"]).mean()),
                       flipping=[str(s) for s in flips.index])
