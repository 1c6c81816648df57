"""A sweep's Prefect artifacts: the matrix (a table per evaluator, at most 9 columns) and
the chart of cost against quality. User text (labels, names, outputs) goes through the
package's Markdown cells (`report.cells`), as every artifact's does."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import TYPE_CHECKING

import pandas as pd

from patronus_tasks.report.cells import markdown_table, md_text
from patronus_tasks.sweep.text import by_evaluator, cells, matrix_text

if TYPE_CHECKING:
    from patronus_tasks.sweep.result import Sweep


def _title(sweep: Sweep) -> str:
    return md_text(f"{sweep.project}/{sweep.name}")


def _flow_runs(sweep: Sweep, link: Callable[[str], str] | None) -> list[str]:
    """Each variant's flow run, linked (``link``: id -> path in the UI)."""
    rows = []
    for label, e in sweep.experiments.items():
        run = e.manifest.flow_run_id
        target = f"[flow run]({link(run)})" if run and link is not None else ""
        rows.append({"variant": label, "experiment": f"{e.project}/{e.location.name}",
                     "flow run": target})
    return ["", "## Variants", "", *markdown_table(rows)] if rows else []


def matrix_markdown(sweep: Sweep, matrix: pd.DataFrame,
                    link: Callable[[str], str] | None = None) -> str:
    """The ``-matrix`` artifact: the headline, then a table per evaluator."""
    lines = [f"# {_title(sweep)}: which variant wins", "", md_text(sweep.headline()), ""]
    for name, part in by_evaluator(matrix):
        lines += [f"## {md_text(name)}", "", *markdown_table([cells(r, False)
                                                              for r in part.itertuples()]), ""]
    lines.append(md_text(matrix_text(matrix)[-1]))  # what the p-values are
    failed = [{"variant": label, "why": why} for label, why in sweep.failed.items()]
    if failed:
        lines += ["", "## Failed variants", "", *markdown_table(failed)]
    return "\n".join(lines + _flow_runs(sweep, link))


def pareto_markdown(sweep: Sweep, matrix: pd.DataFrame, png: bytes | None, cost: str) -> str:
    """The ``-pareto`` artifact: the chart and the variants on the front."""
    lines = [f"# {_title(sweep)}: cost against quality", ""]
    if png is not None:
        lines += [f"![cost against quality](data:image/png;base64,{base64.b64encode(png).decode()})",
                  ""]
    front = sweep.pareto(cost=cost) if not matrix.empty else pd.DataFrame()
    rows = [{"variant": r.variant, "quality": f"{r.quality:.1%}" if pd.notna(r.quality) else "",
             cost: "" if pd.isna(getattr(r, cost)) else f"{getattr(r, cost):.4g}"}
            for r in front.itertuples()]
    lines += ["On the Pareto front (no other variant is as good and cheaper):", "",
              *markdown_table(rows)]
    return "\n".join(lines)
