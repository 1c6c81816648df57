"""How figures read in the Prefect UI's tables: rates, scores, markdown tables (their
cells and headers text, `markdown.cell`)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from patronus_tasks.report.markdown import Markdown, cell, cut, fold

#: Characters of one table cell (explanations, error messages) before the ellipsis.
CELL_CHARS = 120


def pct(value: float | None, signed: bool = False) -> str:
    """A rate for a table cell (``+`` on differences); empty when there is none."""
    return "" if value is None else (f"{value:+.1%}" if signed else f"{value:.1%}")


def num(value: float | None) -> str:
    """A score for a table cell; empty when there is none."""
    return "" if value is None else f"{value:.3g}"


def _value(value: Any) -> Any:
    return "" if value is None or (isinstance(value, float) and pd.isna(value)) else value


def _cell(value: Any, width: int = CELL_CHARS) -> str:
    return cell(_value(value), width)


def _shown(value: Any, width: int = CELL_CHARS) -> str:
    """What a cell shows of ``value``."""
    return str(value) if isinstance(value, Markdown) else cut(fold(_value(value)), width)


def markdown_table(rows: list[dict[str, Any]]) -> list[str]:
    """``rows`` (dicts with the same keys) as the lines of a markdown table."""
    if not rows:
        return ["(no evaluations)"]
    head = list(rows[0])
    lines = ["| " + " | ".join(cell(h) for h in head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(_cell(r[k]) for k in head) + " |" for r in rows]


def table_chars(rows: list[dict[str, Any]]) -> int:
    """About how many characters wide ``rows`` are as a table: each column as wide as its
    longest header or cell, and 3 for its padding (the Prefect UI shows ~110 at a 1,500 px
    window beside its side panels)."""
    if not rows:
        return 0
    return sum(max(len(str(k)), *(len(_shown(r.get(k))) for r in rows)) + 3 for k in rows[0])


def md_text(value: Any) -> str:
    """User text (a name, a label) in Markdown outside a table, made safe as a cell is."""
    return _cell(value, width=10_000)
