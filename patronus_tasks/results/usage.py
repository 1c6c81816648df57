"""Calls, tokens and cost of an experiment, per step and model, from its records.

A task's columns repeat in each of its evaluators' records: its call is counted once per
run of a row and link. Tokens and cost count the calls made ("cost counts what was
paid"); the cache's answers are counted apart (``cached``). A call whose model has no
known price adds its tokens and leaves the cost open (``unpriced_calls``), never a guess.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from patronus_tasks.define.prices import PRICES_AS_OF
from patronus_tasks.record.manifest import UsageTotal

#: The record columns usage is counted from.
USAGE_COLUMNS = tuple(f"{stage}_{what}" for stage in ("task", "evaluation")
                      for what in ("model", "input_tokens", "output_tokens", "cost_usd", "cached"))


def _calls(df: pd.DataFrame, stage: str, step: str, kind: str, keys: list[str]) -> pd.DataFrame:
    cached = f"{stage}_cached"
    if cached not in df.columns:
        return pd.DataFrame()
    # Only the columns read here: the records' other columns, copied along, cost 180 MB
    # more at a million records.
    stage_columns = [f"{stage}_{what}" for what in ("model", "input_tokens", "output_tokens",
                                                    "cost_usd", "cached")]
    wanted = list(dict.fromkeys([*keys, step, *stage_columns]))
    made = df.loc[df[step].notna() & df[cached].notna(), wanted].drop_duplicates(keys)
    return pd.DataFrame({
        "step": made[step].astype(str), "kind": kind,
        "model": made[f"{stage}_model"].astype(object).where(made[f"{stage}_model"].notna(), None),
        "cached": made[cached].astype(bool),
        "input_tokens": pd.to_numeric(made[f"{stage}_input_tokens"], errors="coerce"),
        "output_tokens": pd.to_numeric(made[f"{stage}_output_tokens"], errors="coerce"),
        "cost_usd": pd.to_numeric(made[f"{stage}_cost_usd"], errors="coerce"),
    })


def _cost(paid: pd.DataFrame, priced: pd.Series, model_calls: bool) -> float | None:
    """The known costs' sum; 0 for model calls all answered by the cache; else unknown."""
    if priced.any():
        return float(paid.loc[priced, "cost_usd"].sum())
    return 0.0 if paid.empty and model_calls else None


def _total(step: str, kind: str, model: str | None, g: pd.DataFrame) -> UsageTotal:
    used = g["input_tokens"].notna() | g["output_tokens"].notna() | g["model"].ne("")
    paid = g[~g["cached"]]
    priced = paid["cost_usd"].notna()
    return UsageTotal(
        step=step, kind=kind, model=model, calls=len(paid), cached=int(g["cached"].sum()),
        input_tokens=int(paid["input_tokens"].fillna(0).sum()),
        output_tokens=int(paid["output_tokens"].fillna(0).sum()),
        cost_usd=_cost(paid, priced, bool(used.any())),
        unpriced_calls=int((~priced & used[~g["cached"]]).sum()))


def usage_totals(df: pd.DataFrame) -> list[UsageTotal]:
    """Per step and model (in chain order, then by model): calls made and cached, tokens
    and cost of the calls made."""
    if "repeat" not in df.columns:
        df = df.assign(repeat=None)
    keys = ["sid", "repeat", "link_index"]
    stages = (("task", "task_name", "task", keys),
              ("evaluation", "evaluator_name", "evaluator", [*keys, "evaluator_name"]))
    # A stage at a time: each has a row per call (a million records, two million calls).
    return [total for stage in stages for total in _totals(_calls(df, *stage))]


def _totals(calls: pd.DataFrame) -> list[UsageTotal]:
    if calls.empty:
        return []
    calls["model"] = calls["model"].fillna("")
    return [_total(str(step), str(kind), str(model) or None, g)
            for (kind, step, model), g in calls.groupby(["kind", "step", "model"], sort=False)]


def total_cost(usage: Sequence[UsageTotal]) -> float | None:
    """What the calls made cost in all, where known (None: no price known at all)."""
    known = [u.cost_usd for u in usage if u.cost_usd is not None]
    return float(sum(known)) if known else None


def usage_headline(usage: Sequence[UsageTotal]) -> str | None:
    """``cost $0.0123 (1,234 tokens in, 56 out); 10 calls cached`` (None: nothing to say)."""
    tokens_in, tokens_out = sum(u.input_tokens for u in usage), sum(u.output_tokens for u in usage)
    cached, unpriced = sum(u.cached for u in usage), sum(u.unpriced_calls for u in usage)
    cost = total_cost(usage)
    parts = []
    if tokens_in or tokens_out or cost:
        shown = "unknown" if cost is None else f"${cost:.4g}" + (" + unpriced" if unpriced else "")
        parts.append(f"cost {shown} ({tokens_in:,} tokens in, {tokens_out:,} out)")
    if cached:
        parts.append(f"{cached} of {cached + sum(u.calls for u in usage)} calls cached")
    return "; ".join(parts) or None


def shown_usage(usage: Sequence[UsageTotal]) -> list[UsageTotal]:
    """The lines worth a table: model calls (a model, tokens or a cost), or cached ones."""
    return [u for u in usage if u.model or u.input_tokens or u.output_tokens or u.cached
            or (u.cost_usd or 0) > 0]


def usage_rows(usage: Sequence[UsageTotal]) -> list[dict[str, object]]:
    """`shown_usage` as table rows, as a person reads them."""
    return [{"step": u.step, "kind": u.kind, "model": u.model or "", "calls made": u.calls,
             "cached": u.cached, "input tokens": f"{u.input_tokens:,}",
             "output tokens": f"{u.output_tokens:,}",
             "cost USD": ("" if u.cost_usd is None else f"{u.cost_usd:.4g}")
             + (f" (+{u.unpriced_calls} unpriced)" if u.unpriced_calls and u.cost_usd is not None
                else "")} for u in shown_usage(usage)]


def format_usage(usage: Sequence[UsageTotal]) -> list[str]:
    """The usage as text lines (empty when there is nothing to show)."""
    rows = usage_rows(usage)
    if not rows:
        return []
    head = list(rows[0])
    widths = [max(len(h), *(len(str(r[h])) for r in rows)) for h in head]
    lines = ["", f"Tokens and cost (calls made; the cache's answers cost nothing; prices as of "
                 f"{PRICES_AS_OF} or as given)",
             "  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))]
    lines += ["  ".join(str(r[h]).ljust(w) for h, w in zip(head, widths, strict=True)) for r in rows]
    return lines
