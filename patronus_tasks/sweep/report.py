"""A sweep as one self-contained HTML page: the matrix and the chart of cost against
quality, then the rows by variants side by side (each cell a variant's output and
verdicts; a filter for the rows where the variants disagree; a cell opens its spans).

Every text from a run (labels, names, outputs, explanations, spans) is escaped: in the
HTML by `html.escape`, in the page's data as JSON that the script only ever puts in
``textContent``.
"""

from __future__ import annotations

import json
import math
import re
from importlib import resources
from typing import TYPE_CHECKING, Any

import pandas as pd

from patronus_tasks.record.location import Location
from patronus_tasks.report.page import esc, image
from patronus_tasks.report.rows import verdicts
from patronus_tasks.sweep.charts import cost_axis, pareto_chart
from patronus_tasks.sweep.text import by_evaluator, cells, matrix_text
from patronus_tasks.trace.spans import load_spans

if TYPE_CHECKING:
    from patronus_tasks.sweep.result import Sweep

#: Characters of an output or explanation kept per cell, and of a span's output.
TEXT_CHARS = 2000
SPAN_CHARS = 300
_COLUMNS = ["sid", "repeat", "link_index", "task_output", "evaluator_name", "pass", "score",
            "status", "explanation", "error_type", "error_message", "task_spans",
            "evaluation_spans", "evaluated_model_input"]


def _cut(value: Any, most: int = TEXT_CHARS) -> str | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    text = str(value)
    return text if len(text) <= most else text[: most - 1] + "…"


def _spans(text: Any) -> list[dict[str, Any]]:
    """A call's spans, what the panel shows of each."""
    found = load_spans(text) if isinstance(text, str | bytes) else None
    return [{"name": s.name, "kind": s.kind, "ms": None if s.duration is None else round(s.duration * 1000),
             "model": s.model, "tokens": [s.input_tokens, s.output_tokens], "cost": s.cost,
             "error": s.error, "output": _cut(s.output, SPAN_CHARS)} for s in found or ()]


def _records(sweep: Sweep, label: str) -> pd.DataFrame:
    df = sweep.experiments[label].to_dataframe()
    df = df.reindex(columns=[*_COLUMNS, *(c for c in df.columns if c not in _COLUMNS)])
    first = pd.to_numeric(df["repeat"], errors="coerce").fillna(1) == 1  # with repeats: run 1
    df = df[first].copy()
    df["verdict"] = verdicts(df)
    return df


def _cell(g: pd.DataFrame) -> dict[str, Any]:
    """One variant on one row: its output, each evaluator's verdict, the spans."""
    head = g.iloc[0]
    evals = {}
    for r in g[g["evaluator_name"].notna()].itertuples():
        name = str(r.evaluator_name) + (f" [link {r.link_index}]" if r.link_index else "")
        evals[name] = {"v": r.verdict, "score": None if pd.isna(r.score) else float(r.score),
                       "why": _cut(r.explanation) or _cut(r.error_message)}
    error = g[g["status"] == "error"]
    return {"out": _cut(head["task_output"]), "evals": evals,
            "error": None if error.empty else _cut(f"{error.iloc[0]['error_type']}: "
                                                   f"{error.iloc[0]['error_message']}"),
            "spans": {"task": _spans(head["task_spans"]),
                      **{str(r.evaluator_name): _spans(r.evaluation_spans)
                         for r in g[g["evaluator_name"].notna()].itertuples()}}}


def side_by_side(sweep: Sweep) -> dict[str, Any]:
    """The rows by variants, as the page's data."""
    labels = list(sweep.experiments)
    rows: dict[str, dict[str, Any]] = {}
    for i, label in enumerate(labels):
        for sid, g in _records(sweep, label).groupby("sid", sort=False):
            row = rows.setdefault(str(sid), {"sid": str(sid), "input": _cut(
                g.iloc[0]["evaluated_model_input"]), "cells": [None] * len(labels)})
            row["cells"][i] = _cell(g)
    return {"variants": labels, "baseline": sweep.baseline, "rows": list(rows.values())}


def _matrix_section(sweep: Sweep, matrix: pd.DataFrame) -> str:
    parts = [f"<p class=headline>{esc(sweep.headline())}</p>"]
    for name, part in by_evaluator(matrix):
        rows = [cells(r, False) for r in part.itertuples()]
        head = "".join(f"<th>{esc(k)}</th>" for k in rows[0])
        body = "".join(f"<tr class='{esc(r['verdict'])}'>"
                       + "".join(f"<td>{esc(v)}</td>" for v in r.values()) + "</tr>" for r in rows)
        parts.append(f"<h3>{esc(name)}</h3><table class=figures><thead><tr>{head}</tr></thead>"
                     f"<tbody>{body}</tbody></table>")
    parts.append(f"<p class=note>{esc(matrix_text(matrix)[-1])}</p>")
    failed = "".join(f"<li><b>{esc(k)}</b>: {esc(v)}</li>" for k, v in sweep.failed.items())
    return "".join(parts) + (f"<h3>Failed variants</h3><ul>{failed}</ul>" if failed else "")


def _pareto_section(sweep: Sweep, matrix: pd.DataFrame) -> str:
    axis = cost_axis(matrix)
    if axis is None:
        return "<p class=note>No cost, tokens nor latency recorded: no chart of cost.</p>"
    chart = image(pareto_chart(matrix, sweep.baseline), "cost against quality")
    front = sweep.pareto(cost=axis[0])
    names = ", ".join(f"<b>{esc(v)}</b>" for v in front["variant"])
    return f"{chart}<p>On the Pareto front ({esc(axis[1])}): {names}</p>"


def _json(data: Any) -> str:
    """Data for a ``<script type=application/json>``: every ``<`` as ``\\u003c`` (JSON has
    it only inside strings), so no ``</script>`` ends the element and no ``<!--`` turns the
    parser's escaping on."""
    return json.dumps(data, ensure_ascii=False, default=str).replace("<", "\\u003c")


def build_sweep_report(sweep: Sweep) -> str:
    template = resources.files("patronus_tasks.sweep").joinpath("assets/sweep.html").read_text()
    matrix = sweep.matrix()
    facts = (f"{len(sweep.variants)} variants · baseline <b>{esc(sweep.baseline)}</b> · "
             f"started {esc(sweep.file.started_at[:19])} · {esc(sweep.location)}")
    parts = {"__TITLE__": esc(f"{sweep.project}/{sweep.name}"), "__FACTS__": facts,
             "__MATRIX__": _matrix_section(sweep, matrix),
             "__PARETO__": _pareto_section(sweep, matrix), "/*DATA*/": _json(side_by_side(sweep))}
    # One pass: a placeholder's text inside a run's own text (a label) is never filled.
    return re.sub("|".join(map(re.escape, parts)), lambda m: parts[m.group()], template)


def write_sweep_report(sweep: Sweep, path: Location | None = None) -> Location:
    target = path or sweep.report_path
    target.write_bytes(build_sweep_report(sweep).encode("utf-8"))
    return target
