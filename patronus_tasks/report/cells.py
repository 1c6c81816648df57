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


def markdown_table(rows: list[dict[str, Any]], width: int = CELL_CHARS) -> list[str]:
    """``rows`` (dicts with the same keys) as the lines of a markdown table, each cell cut
    at ``width`` characters."""
    if not rows:
        return ["(no evaluations)"]
    head = list(rows[0])
    lines = ["| " + " | ".join(cell(h) for h in head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(_cell(r[k], width) for k in head) + " |" for r in rows]


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


#: A table artifact's widths in the Prefect UI's v2 (its default) at a 1,500 px window,
#: fitted to two tables measured in Chromium (1,208 and 802 px): ~6.6 px a character, ~37
#: a column's padding; the box that holds the table is 804 px (v1's: 946). Cells do not wrap.
CHAR_PX, COLUMN_PX, TABLE_BOX_PX = 6.6, 37, 804


def table_px(rows: list[dict[str, Any]]) -> int:
    """About how wide ``rows`` are as a table artifact in the UI (`CHAR_PX`)."""
    if not rows:
        return 0
    return round(sum(max(len(str(k)), *(len(_shown(r.get(k))) for r in rows)) * CHAR_PX + COLUMN_PX
                     for k in rows[0]))


def fitted(rows: list[dict[str, Any]], optional: tuple[str, ...]) -> list[dict[str, Any]]:
    """``rows`` less the ``optional`` columns (in that order) while they are wider than the
    UI's table box (`table_px`): a column cut at the box's edge read as a figure missing."""
    for name in optional:
        if table_px(rows) <= TABLE_BOX_PX:
            break
        rows = [{k: v for k, v in r.items() if k != name} for r in rows]
    return rows
