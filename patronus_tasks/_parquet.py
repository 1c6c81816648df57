"""Streaming results to Parquet: part files while running, one file when finished.

While an experiment runs, records are buffered and written in batches as numbered
part files, each complete and readable on its own (written to a temporary name, then
renamed), so a crash loses at most the rows still in the buffer. `finalize` streams
the parts into ``results.parquet`` (again via a temporary name) and removes them.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ._exceptions import ConfigError
from ._records import FIXED_SCHEMA, dataset_column_name

RESULTS_FILE = "results.parquet"
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

    def __init__(self, out_dir: Path, df: pd.DataFrame, *, batch_rows: int = 2000,
                 flush_seconds: float = 2.0) -> None:
        extra, self._text_columns = dataset_schema(df)
        self.schema = pa.unify_schemas([FIXED_SCHEMA, extra])
        self.out_dir = out_dir
        self.parts = out_dir / PARTS_DIR
        self.batch_rows, self.flush_seconds = batch_rows, flush_seconds
        self._buffer: list[dict[str, Any]] = []
        self._last_flush = time.monotonic()
        self._part_count = 0
        self.records_written = 0
        _make_writable(self.parts)

    def add(self, records: list[dict[str, Any]]) -> None:
        """Buffer one row's records; write a part when the batch is full or old."""
        self._buffer.extend(records)
        due = time.monotonic() - self._last_flush >= self.flush_seconds
        if len(self._buffer) >= self.batch_rows or due:
            self.flush()

    def flush(self) -> None:
        """Write the buffered records as one part file."""
        self._last_flush = time.monotonic()
        if not self._buffer:
            return
        for record in self._buffer:
            for column in self._text_columns.intersection(record):
                record[column] = _text(record[column])
        table = pa.Table.from_pylist(self._buffer, schema=self.schema)
        path = self.parts / f"part-{self._part_count:06d}.parquet"
        _write_atomic(table, path)
        self._part_count += 1
        self.records_written += len(self._buffer)
        self._buffer = []

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
        for part in self.parts.glob("part-*.parquet"):
            part.unlink()
        self.parts.rmdir()
        return final


def _write_atomic(table: pa.Table, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def _make_writable(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(
            f"results directory {path} is not writable ({exc.strerror}). "
            "Pass results_dir= (or set PATRONUS_TASKS_RESULTS_DIR) to a writable folder."
        ) from None


def read_results(out_dir: Path) -> pa.Table:
    """The records of an experiment: the final file, or the parts of an unfinished one."""
    final = out_dir / RESULTS_FILE
    if final.exists():
        return pq.read_table(final)
    parts = sorted((out_dir / PARTS_DIR).glob("part-*.parquet"))
    if not parts:
        raise FileNotFoundError(f"no results in {out_dir}")
    return pa.concat_tables(pq.read_table(p) for p in parts)
