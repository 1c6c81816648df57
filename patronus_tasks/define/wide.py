"""How wide a dataset may be: at most `MAX_COLUMNS` columns, checked before the slow work
from what each source tells at little cost (a list's keys, a frame's columns, a CSV's
first line, a JSON line's keys, a Parquet file's footer).

Each column costs a run's setup ~1 ms (it is typed on its own for the results' schema:
10,000 columns took 9.5 s before the first row; 100,000 took 92 s and 10^6 minutes, with
no word), and a source read whole first costs more: pandas took 152 s to read the header
alone of a CSV of 10^6 columns, and pyarrow cannot read the footer of a Parquet file of
10^6 (too big for its reader).
"""

from __future__ import annotations

import csv
import itertools
import json
import re
from collections.abc import Mapping, Sequence
from json.decoder import scanstring  # type: ignore[attr-defined]
from pathlib import Path
from typing import Any

from patronus_tasks.exceptions import DatasetError

#: The most columns a dataset may have (the README's "A first experiment" says why).
MAX_COLUMNS = 10_000


def check_width(count: int, where: str, at_least: bool = False) -> None:
    """A `DatasetError` when ``count`` columns (of ``where``; ``at_least``: counted no
    further) are over `MAX_COLUMNS`."""
    if count > MAX_COLUMNS:
        raise DatasetError(
            f"{where} has {'at least ' * at_least}{count:,} columns; a dataset may have at "
            f"most {MAX_COLUMNS:,} (each costs the run's setup ~1 ms). Keep the columns the "
            "experiment reads (df[[...]]), or put the rest in one column (a dict per row, "
            "stored as JSON text).")


def check_records(rows: Sequence[Mapping[str, Any]], where: str) -> None:
    """The columns of a list of rows: its widest row's at once, then all their keys."""
    widths = [len(row) if isinstance(row, Mapping) else 0 for row in rows]
    check_width(max(widths, default=0), where)
    if sum(widths) > MAX_COLUMNS:  # else the keys of all the rows are few enough
        check_width(len(set(itertools.chain.from_iterable(rows))), where)


def check_csv(path: Path, options: Mapping[str, Any]) -> None:
    """The fields of a CSV file's first line (its header), split as pandas splits them;
    nothing said when that cannot be told at little cost (a ``sep`` that is a regular
    expression: the columns read are checked after)."""
    sep = options.get("sep", options.get("delimiter", ","))
    if not isinstance(sep, str) or len(sep) != 1:
        return
    try:
        with path.open(encoding=options.get("encoding") or "utf-8", errors="replace",
                       newline="") as fh:
            first = next(csv.reader(fh, delimiter=sep), [])
    except (OSError, LookupError, csv.Error):
        return
    check_width(len(first), str(path))


def check_jsonl(path: Path) -> None:
    """The keys of a JSON Lines file's first object (the columns read are checked after)."""
    try:
        with path.open(encoding="utf-8", errors="replace") as fh:
            first = next((line for line in fh if line.strip()), "")
    except OSError:  # its reader says so
        return
    check_json_line(first, str(path))


def check_json_line(line: str, where: str) -> None:
    """The keys of a JSON object on one line, before it is parsed whole: a line with
    more ``:`` than the limit is counted key by key, to one past it (a line of 10^6 keys
    takes json.loads 1.2 s)."""
    if line.count(":") > MAX_COLUMNS:
        check_width(_keys(line, MAX_COLUMNS + 1), where, at_least=True)


def _keys(text: str, most: int) -> int:
    """How many keys the JSON object ``text`` has, counted to ``most`` at most: each value
    parsed only to step over it. What is no JSON object counts as far as it is one (its
    reader says what is wrong with it)."""
    start = _at(text, 0)
    if text[start:start + 1] != "{":
        return 0
    keys, pos = 0, start + 1
    try:
        while keys < most and text[_at(text, pos)] == '"':
            _, pos = scanstring(text, _at(text, pos) + 1)
            if text[_at(text, pos)] != ":":
                return keys
            _, pos = _DECODER.raw_decode(text, _at(text, _at(text, pos) + 1))
            keys, pos = keys + 1, _at(text, pos) + 1  # past the "," (or the "}")
    except (ValueError, IndexError):  # json.JSONDecodeError is a ValueError
        pass
    return keys


def _at(text: str, pos: int) -> int:
    """``pos`` past any white space."""
    space = _SPACE.match(text, pos)
    return space.end() if space else pos


_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")


def check_parquet(path: Path) -> None:
    """The top-level columns of a Parquet file, read from the first bytes of its footer."""
    count = parquet_columns(path)
    if count is not None:
        check_width(count, str(path))


def parquet_columns(path: Path) -> int | None:
    """How many top-level columns a Parquet file has: the ``num_children`` of its schema's
    root, the footer's first element (Thrift's compact encoding). pyarrow reads the whole
    footer first (0.9 s for 100,000 columns; 296 MB for 10^6, which it refuses to read).
    None when the file is not one this reads."""
    try:
        with path.open("rb") as fh:
            fh.seek(-8, 2)
            tail = fh.read(8)
            size = int.from_bytes(tail[:4], "little")
            fh.seek(-8 - size, 2)
            head = fh.read(min(size, 1 << 16))
    except OSError:
        return None
    if tail[4:] != b"PAR1":
        return None
    try:
        return _Footer(head).root_children()
    except (IndexError, ValueError):
        return None


class _Footer:
    """The first fields of a Parquet footer (a Thrift ``FileMetaData``, compact encoding)."""

    _LIST, _STRUCT, _BINARY, _DOUBLE, _BYTE = 9, 12, 8, 7, 3
    _VARINTS = (4, 5, 6)  # i16, i32, i64
    _BOOLS = (1, 2)  # the value is the field's type

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def root_children(self) -> int | None:
        """``FileMetaData.schema`` (field 2, a list of ``SchemaElement``), its first
        element's ``num_children`` (field 5)."""
        if self._find(2) != self._LIST:
            return None
        head = self._byte()
        size = self._varint() if head >> 4 == 15 else head >> 4
        if head & 0x0F != self._STRUCT or size == 0:
            return None
        return self._zigzag(self._varint()) if self._find(5) in self._VARINTS else None

    def _find(self, wanted: int) -> int | None:
        """Step over a struct's fields to field ``wanted``; its type (None: not there)."""
        field = 0
        while True:
            head = self._byte()
            kind, delta = head & 0x0F, head >> 4
            if kind == 0:
                return None
            field = field + delta if delta else self._zigzag(self._varint())
            if field == wanted:
                return kind
            if field > wanted or not self._skip(kind):
                return None

    def _skip(self, kind: int) -> bool:
        if kind in self._VARINTS:
            self._varint()
        elif kind == self._BINARY:
            length = self._varint()  # read before pos is: it moves pos on
            self.pos += length
        elif kind in (self._DOUBLE, self._BYTE):
            self.pos += 8 if kind == self._DOUBLE else 1
        return kind in (*self._VARINTS, *self._BOOLS, self._BINARY, self._DOUBLE, self._BYTE)

    def _byte(self) -> int:
        self.pos += 1
        return self.data[self.pos - 1]

    def _varint(self) -> int:
        value, shift = 0, 0
        while True:
            byte = self._byte()
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7

    @staticmethod
    def _zigzag(n: int) -> int:
        return (n >> 1) ^ -(n & 1)
