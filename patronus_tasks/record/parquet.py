"""Streaming results to Parquet: a journal and part files while running, one file at the end.

Each completed row's records are appended at once to a journal (JSON lines, one write
per row, the Arrow schema on its first line), so a crash or SIGKILL loses no completed
row: a line cut short by a crash is skipped when read. When a batch is full it is
written as a numbered Parquet part (temporary name, then renamed) and its journal
removed; a journal whose part exists is ignored, so nothing is read twice. `finalize` streams the parts into
``results.parquet`` (again via a temporary name) and removes them.
"""

from __future__ import annotations

import base64
import json
import os
import re
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from patronus_tasks.exceptions import ConfigError
from patronus_tasks.record.records import FIXED_SCHEMA, Record, dataset_column_name

RESULTS_FILE = "results.parquet"
PREVIOUS_FILE = "previous.parquet"  # what a resumed run started from (see _resume.py)
MANIFEST_FILE = "manifest.json"
PARTS_DIR = "parts"
METADATA_KEY = b"patronus_tasks"


def safe_name(name: str) -> str:
    """A file-system-safe version of ``name``: no separators, no leading dots."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._")
    return cleaned[:120] or "unnamed"


def experiment_dir(results_dir: Path, project: str, experiment: str) -> Path:
    """``results_dir/<project>/<experiment>``, refusing any path that escapes it."""
    root = results_dir.resolve()
    path = (root / safe_name(project) / safe_name(experiment)).resolve()
    if root not in path.parents:
        raise ConfigError(f"experiment path {path} is outside the results directory {root}")
    return path


def _text(value: Any) -> Any:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def dataset_schema(df: pd.DataFrame) -> tuple[pa.Schema, frozenset[str]]:
    """The Arrow fields of the dataset's columns, and which of them are stored as text.

    A column Arrow cannot type (mixed types, say) is stored as JSON text instead.
    """
    fields, text = [], set()
    for column in df.columns:
        if column == "sid":
            continue
        name = dataset_column_name(str(column))
        try:
            typ = pa.Schema.from_pandas(df[[column]], preserve_index=False).field(0).type
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            typ = pa.string()
            text.add(name)
        fields.append(pa.field(name, typ))
    return pa.schema(fields), frozenset(text)


class ParquetSink:
    """Buffers records and writes them as Parquet part files, then one final file."""

    def __init__(self, out_dir: Path, df: pd.DataFrame | None = None, *,
                 columns: tuple[pa.Schema, frozenset[str]] | None = None, prefix: str = "",
                 batch_rows: int = 2000, flush_seconds: float = 2.0) -> None:
        """Write under ``out_dir/parts``; the dataset's columns come from ``df`` or ``columns``
        (`dataset_schema` of it). Writers in other processes use their own ``prefix``."""
        assert df is not None or columns is not None
        extra, self._text_columns = columns if columns is not None else dataset_schema(df)
        self.schema = pa.unify_schemas([FIXED_SCHEMA, extra])
        self.out_dir = out_dir
        self.parts = out_dir / PARTS_DIR
        self.batch_rows, self.flush_seconds = batch_rows, flush_seconds
        self._buffer: list[dict[str, Any]] = []
        self._last_flush = time.monotonic()
        self._stem = f"part-{prefix}-" if prefix else "part-"
        make_writable(self.parts)
        _adopt_journals(self.parts, self._stem)
        taken = [int(p.stem.rsplit("-", 1)[1]) for p in self.parts.glob(f"{self._stem}*.parquet")
                 if p.stem.rsplit("-", 1)[1].isdigit() and p.stem.startswith(self._stem)]
        self._part_count = max(taken, default=-1) + 1
        self._journal: Any = None
        self.records_written = 0

    def _journal_path(self) -> Path:
        return self.parts / f"{self._stem}{self._part_count:06d}.journal"

    def add(self, records: list[Record]) -> None:
        """Journal one row's records at once; write a part when the batch is full or old."""
        rows = [record.to_row() for record in records]  # the file's boundary: dicts from here
        for row in rows:
            for column in self._text_columns.intersection(row):
                row[column] = _text(row[column])
        if self._journal is None:
            self._journal = self._journal_path().open("wb", buffering=0)
            self._journal.write(_schema_line(self.schema))
        self._journal.write(orjson.dumps(rows, default=_json_default,
                                         option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
        self._buffer.extend(rows)
        due = time.monotonic() - self._last_flush >= self.flush_seconds
        if len(self._buffer) >= self.batch_rows or due:
            self.flush()

    def flush(self) -> None:
        """Write the journalled records as one part file and drop the journal."""
        self._last_flush = time.monotonic()
        if not self._buffer:
            return
        path = self._journal_path().with_suffix(".parquet")
        _write_atomic(pa.Table.from_pylist(self._buffer, schema=self.schema), path)
        self._close_journal()
        self._journal_path().unlink(missing_ok=True)
        self._part_count += 1
        self.records_written += len(self._buffer)
        self._buffer = []

    def _close_journal(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None

    def finalize(self, metadata: Mapping[str, Any]) -> Path:
        """Write the remaining records, merge the parts into one file, remove the parts."""
        self.flush()
        schema = self.schema.with_metadata({METADATA_KEY: json.dumps(metadata, default=str)})
        final = self.out_dir / RESULTS_FILE
        tmp = final.with_suffix(".parquet.tmp")
        with pq.ParquetWriter(tmp, schema) as writer:
            for part in sorted(self.parts.glob("part-*.parquet")):
                writer.write_table(pq.read_table(part, schema=self.schema).replace_schema_metadata(
                    schema.metadata))
        os.replace(tmp, final)
        remove_parts(self.out_dir)
        return final


def _write_atomic(table: pa.Table, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def make_writable(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        # A probe of its own: Dask workers check one folder at once, and a shared name
        # let one delete the other's probe before it did.
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise ConfigError(
            f"results directory {path} is not writable ({exc.strerror}). "
            "Pass results_dir= (or set PATRONUS_TASKS_RESULTS_DIR) to a writable folder."
        ) from None


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


def _schema_line(schema: pa.Schema) -> bytes:
    encoded = base64.b64encode(schema.serialize().to_pybytes()).decode()
    return orjson.dumps({"arrow_schema": encoded}) + b"\n"


def _to_table(records: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """Records read back from JSON as a table of ``schema``; values JSON could not keep
    exactly (timestamps, bytes) are cast back from their text form."""
    try:
        return pa.Table.from_pylist(records, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.Table.from_arrays([_column(records, f) for f in schema], schema=schema)


def _column(records: list[dict[str, Any]], f: pa.Field) -> pa.Array:
    values = [r.get(f.name) for r in records]
    if pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type):
        values = [base64.b64decode(v) if isinstance(v, str) else v for v in values]
        return pa.array(values, f.type)
    if f.type == pa.null():
        return pa.nulls(len(values))
    return pa.array(values).cast(f.type, safe=False)


def _read_journal(path: Path) -> pa.Table | None:
    """A journal's complete lines as a table; a line cut short by a crash is skipped."""
    schema, records = None, []
    with path.open("rb") as fh:
        for line in fh:
            try:
                item = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(item, dict) and "arrow_schema" in item:
                schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(item["arrow_schema"])))
            elif isinstance(item, list):
                records.extend(item)
    if schema is None or not records:
        return None
    return _to_table(records, schema)


def _adopt_journals(parts_dir: Path, stem: str) -> None:
    """Turn the journals a crashed writer of this ``stem`` left into parts, so a new
    writer can go on (other stems belong to writers that may still be running)."""
    for journal in sorted(parts_dir.glob(f"{stem}*.journal")):
        part = journal.with_suffix(".parquet")
        table = None if part.exists() else _read_journal(journal)
        if table is not None:
            _write_atomic(table, part)
        journal.unlink()


def unfinished_tables(out_dir: Path) -> list[pa.Table]:
    parts_dir = out_dir / PARTS_DIR
    tables = [pq.read_table(p) for p in sorted(parts_dir.glob("part-*.parquet"))]
    for journal in sorted(parts_dir.glob("part-*.journal")):
        if journal.with_suffix(".parquet").exists():
            continue  # written as a part already; the journal was about to go
        table = _read_journal(journal)
        if table is not None:
            tables.append(table)
    return tables


def remove_parts(out_dir: Path) -> None:
    """Delete the parts and journals of ``out_dir`` (their records are kept elsewhere)."""
    parts = out_dir / PARTS_DIR
    if parts.is_dir():
        for leftover in parts.iterdir():
            leftover.unlink()
        parts.rmdir()


def read_results(out_dir: Path, columns: list[str] | None = None) -> pa.Table:
    """The records of an experiment: the final file, or what an unfinished one left.

    ``columns``: only these (every record has the fixed ones, see `records`).
    """
    final = out_dir / RESULTS_FILE
    if final.exists():
        return pq.read_table(final, columns=columns)
    table = _read_unfinished(out_dir)
    return table.select(columns) if columns else table


def _read_unfinished(out_dir: Path) -> pa.Table:
    tables = unfinished_tables(out_dir)
    previous = out_dir / PREVIOUS_FILE
    if previous.exists():  # an interrupted resume: newer records win per sample
        older = pq.read_table(previous)
        newer_sids = {s for t in tables for s in t.column("sid").to_pylist()}
        mask = pa.array([s not in newer_sids for s in older.column("sid").to_pylist()])
        tables.insert(0, older.filter(mask))
    if not tables:
        raise FileNotFoundError(f"no results in {out_dir}")
    return pa.concat_tables(tables, promote_options="permissive")
