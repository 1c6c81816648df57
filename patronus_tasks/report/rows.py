"""An experiment's records as the HTML report's table: columnar JSON, each string once.

A record per (sample, link, evaluator) repeats its row's input, output and gold answer in
every evaluator's record: stored once in a shared string table and referred to by index,
the data of 20,000 records stays a few megabytes, and the page reads it with one
``JSON.parse``.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pandas as pd

from patronus_tasks.record.records import STATUS_ERROR, STATUS_SKIPPED

#: The record's columns, in the order the table shows them (dataset columns follow).
LEADING = ("sid", "link_index", "repeat", "task_name", "evaluator_name", "verdict", "score",
           "explanation", "task_output", "error_type", "error_message")
#: Columns the table shows at first (the others are one click away, and in the row's view).
SHOWN = ("sid", "link_index", "repeat", "evaluator_name", "verdict", "score", "explanation",
         "task_output", "error_type")
#: Shown at first when any record says yes.
SHOWN_WHEN_TRUE = ("task_cached", "evaluation_cached")
#: Tokens and cost, where a run recorded them (columns named so).
COUNTED = re.compile(r"(^|_)(tokens?|cost)(_|$)|_usd$")


def verdicts(df: pd.DataFrame) -> pd.Series:
    """Each record's outcome in words: passed, not passed, scored, error, skipped, done."""
    out = pd.Series("done", index=df.index, dtype=object)
    out[df["score"].notna()] = "scored"
    out[df["pass"] == True] = "passed"  # noqa: E712
    out[df["pass"] == False] = "not passed"  # noqa: E712
    out[df["status"] == STATUS_SKIPPED] = "skipped"
    out[df["status"] == STATUS_ERROR] = "error"
    return out


def counted_columns(df: pd.DataFrame) -> list[str]:
    """Numeric columns of tokens or cost (``input_tokens``, ``cost_usd``...), if any."""
    return [c for c in df.columns if COUNTED.search(str(c)) and pd.api.types.is_numeric_dtype(df[c])]


@dataclass
class _Strings:
    """The shared string table: each distinct string once."""

    index: dict[str, int]

    def codes(self, column: pd.Series) -> list[int]:
        codes, uniques = pd.factorize(column, use_na_sentinel=True)
        mapped = np.array([self.index.setdefault(str(u), len(self.index)) for u in uniques]
                          + [-1], dtype=np.int64)
        return list(mapped[codes].tolist())  # the sentinel -1 picks the trailing -1: null


def _kind(column: pd.Series) -> str:
    inferred = pd.api.types.infer_dtype(column, skipna=True)  # a bool column with nulls is object
    if inferred == "boolean":
        return "bool"
    return "num" if inferred in ("integer", "floating", "mixed-integer-float", "decimal") else "str"


def _text(value: Any) -> Any:
    """A list or dict cell (a dataset's list of passages, read back as an array) as JSON."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, list | dict | tuple):
        return json.dumps(value, ensure_ascii=False, default=str)
    return value


def _values(column: pd.Series, kind: str, strings: _Strings) -> list[Any]:
    if kind == "str":
        return strings.codes(column.astype(object).where(column.notna(), None).map(_text))
    numbers = pd.to_numeric(column.astype(object).where(column.notna(), None),
                            errors="coerce").astype(float).round(6)
    return [None if np.isnan(v) else (int(v) if v.is_integer() else v)
            for v in numbers.to_numpy(dtype=float).tolist()]


def ordered_columns(df: pd.DataFrame) -> list[str]:
    """The leading record columns, the dataset's, tokens and cost, then the rest; columns
    with no value at all left out."""
    present = [c for c in df.columns if df[c].notna().any()]
    lead = [c for c in LEADING if c in present]
    rest = [c for c in present if c not in lead]
    return lead + rest


def table_data(df: pd.DataFrame, dataset_columns: list[str]) -> dict[str, Any]:
    """The records as the page's data: columns (name, kind, whether shown at first, whether
    a dataset column) and their values; strings as indices into ``strings``."""
    df = df.assign(verdict=verdicts(df))
    strings = _Strings({})
    counted = set(counted_columns(df))
    columns = []
    for name in ordered_columns(df):
        kind = "num" if name in counted else _kind(df[name])
        columns.append({"name": name, "kind": kind, "values": _values(df[name], kind, strings),
                        "shown": name in SHOWN or name in counted
                        or name in dataset_columns[:3]
                        or (name in SHOWN_WHEN_TRUE and bool(df[name].fillna(False).any())),
                        "dataset": name in dataset_columns})
    return {"rows": len(df), "strings": list(strings.index), "columns": columns}


def packed(data: dict[str, Any]) -> str:
    """``data`` as gzipped JSON in base64, for the page to unpack (``DecompressionStream``):
    a run's texts shrink ~5x, and base64 holds nothing that could end the ``<script>``."""
    return base64.b64encode(gzip.compress(orjson.dumps(data), compresslevel=6, mtime=0)).decode()


def unpacked(text: str) -> dict[str, Any]:
    """`packed` undone (what the page reads)."""
    return dict(orjson.loads(gzip.decompress(base64.b64decode(text))))
