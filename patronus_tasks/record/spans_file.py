"""``spans.parquet``: every span of an experiment, one row each, beside ``results.parquet``.

Made from the results' ``task_spans``/``evaluation_spans`` columns once the results file
is written, a row group at a time (so whatever carried the records, a journal, a Dask
worker's part, a resumed run, carried the spans too). A task's spans are on each record
of its link (one per evaluator): they are written once. Read back by `Experiment.spans`;
DuckDB reads the file as it is, and beside the results: where a span ran is said as the
results say a record's (``sid``, ``repeat``, ``link_index``), and its times as theirs
(``started_at``, ``ended_at``: seconds since the epoch, UTC, as ``task_started_at``).
Files written before (``sample_id``; ``start``/``end`` as timestamps) are read as these.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from patronus_tasks.record.location import Location
from patronus_tasks.trace.spans import SpanData, load_spans

SPANS_FILE = "spans.parquet"
#: The file's columns: where the span ran (row, repeat, link, step), then the span.
SPAN_SCHEMA = pa.schema([
    ("sid", pa.string()), ("repeat", pa.int32()), ("link_index", pa.int32()),
    ("step", pa.string()), ("step_kind", pa.string()),
    ("span_id", pa.string()), ("parent_id", pa.string()), ("name", pa.string()),
    ("kind", pa.string()), ("started_at", pa.float64()), ("ended_at", pa.float64()),
    ("duration_s", pa.float64()), ("arguments", pa.string()), ("output", pa.string()),
    ("error", pa.string()), ("model", pa.string()), ("input_tokens", pa.int64()),
    ("output_tokens", pa.int64()), ("cost", pa.float64()), ("attributes", pa.string()),
])
#: Columns of files written before, by their names now.
_RENAMED = {"sample_id": "sid", "start": "started_at", "end": "ended_at"}
_WHERE = ["sid", "repeat", "link_index", "task_name", "evaluator_name", "task_spans",
          "evaluation_spans"]


def _row(where: dict[str, Any], step: str | None, step_kind: str, s: SpanData) -> dict[str, Any]:
    return {"sid": where["sid"], "repeat": where["repeat"],
            "link_index": where["link_index"], "step": step, "step_kind": step_kind,
            "span_id": s.span_id, "parent_id": s.parent_id, "name": s.name, "kind": s.kind,
            "started_at": s.start, "ended_at": s.end, "duration_s": s.duration,
            "arguments": s.arguments, "output": s.output, "error": s.error, "model": s.model,
            "input_tokens": s.input_tokens, "output_tokens": s.output_tokens, "cost": s.cost,
            "attributes": json.dumps(s.attributes, default=str) if s.attributes else None}


class _Once:
    """Which runs of a link had their task's spans written. A sid's records are together
    in the file (see `merge.RowOrder`) and in a part: only the current sid's are kept."""

    def __init__(self) -> None:
        self.sid: Any = None
        self.done: set[tuple[Any, Any]] = set()

    def first(self, where: dict[str, Any]) -> bool:
        if where["sid"] != self.sid:
            self.sid, self.done = where["sid"], set()
        key = (where["repeat"], where["link_index"])
        fresh = key not in self.done
        self.done.add(key)
        return fresh


def span_rows(results: pa.Table, once: _Once | None = None) -> Iterator[dict[str, Any]]:
    """The rows of ``spans.parquet`` from the records in ``results``."""
    if "task_spans" not in results.column_names:
        return
    once = once or _Once()
    for where in results.select(_WHERE).to_pylist():
        if where["task_spans"] and once.first(where):
            for s in load_spans(where["task_spans"]) or ():
                yield _row(where, where["task_name"], "task", s)
        for s in load_spans(where["evaluation_spans"]) or ():
            yield _row(where, where["evaluator_name"], "evaluator", s)


def spans_table(results: pa.Table, once: _Once | None = None) -> pa.Table:
    return pa.Table.from_pylist(list(span_rows(results, once)), schema=SPAN_SCHEMA)


def write_spans(out_dir: Location, results: Location) -> Location:
    """Write ``spans.parquet`` (empty when no call opened a span) beside the results file
    ``results``, read a row group at a time."""
    final, once = out_dir / SPANS_FILE, _Once()
    with final.atomic_output() as out, pq.ParquetWriter(out, SPAN_SCHEMA) as writer:
        for group in results.row_groups(_WHERE):
            table = spans_table(group, once)
            if len(table):
                writer.write_table(table)
    return final


def read_spans(spans: Location) -> pa.Table:
    """``spans.parquet`` in this version's columns, whatever version wrote it."""
    table = spans.read_table()
    for old, new in _RENAMED.items():
        if old in table.column_names and new not in table.column_names:
            column = table[old]
            if pa.types.is_timestamp(column.type):  # seconds since the epoch, as the results
                column = pc.divide(pc.cast(pc.cast(column, pa.timestamp("us")), pa.int64()), 1e6)
            table = table.set_column(table.column_names.index(old), new, column)
    return table.select([n for n in SPAN_SCHEMA.names if n in table.column_names]).cast(
        pa.schema([f for f in SPAN_SCHEMA if f.name in table.column_names]))
