"""Streaming results to Parquet: a journal and part files while running, one file at the end.

Each completed row's records are journalled at once (JSON lines, one write per row, the
Arrow schema on the first line; see `_Journal` for object storage), so a crash or
SIGKILL loses no completed row: a line cut short by a crash is skipped when read. When a
batch is full it is written as a numbered Parquet part (written whole, see
`Location.atomic_output`) and its journal removed; a journal whose part exists is
ignored, so nothing is read twice. `finalize` merges the parts into ``results.parquet``
(again written whole), in the dataset's order of rows, not the order they finished in
(`RowOrder`), a window at a time (`merge`), and removes them. Each column has one type
whatever the data (the dataset's: `columns`). Where the files live, a local folder or
an object-store prefix, is the `Location`'s.
"""

from __future__ import annotations

import base64
import itertools
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from patronus_tasks.define.names import safe_name
from patronus_tasks.exceptions import ConfigError
from patronus_tasks.record.columns import dataset_schema
from patronus_tasks.record.location import Location
from patronus_tasks.record.merge import RowOrder, merged
from patronus_tasks.record.records import COLUMNS, FIXED_SCHEMA, Record
from patronus_tasks.record.spans_file import write_spans

if TYPE_CHECKING:
    from patronus_tasks.record.manifest import Manifest
    from patronus_tasks.record.recorder import RunFacts

logger = logging.getLogger("patronus_tasks")
RESULTS_FILE = "results.parquet"
PREVIOUS_FILE = "previous.parquet"  # what a resumed run started from (see record/resume.py)
MANIFEST_FILE = "manifest.json"
PARTS_DIR = "parts"
METADATA_KEY = b"patronus_tasks"


def experiment_dir(results_dir: Path | Location, project: str, experiment: str,
                   naming: Callable[[str], str] = safe_name) -> Location:
    """``results_dir/<project>/<experiment>``, refusing any path that escapes it; the
    folders named by ``naming`` (`names.cleaned`: as before names were made unique)."""
    results = Location.of(results_dir)
    if results.local is None:  # folder names have no separators and no leading dots
        return results / naming(project) / naming(experiment)
    root = results.local.resolve()
    path = (root / naming(project) / naming(experiment)).resolve()
    if root not in path.parents:
        raise ConfigError(f"experiment path {path} is outside the results directory {root}")
    return Location(path)


def _text(value: Any) -> Any:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def _whole(value: Any) -> Any:
    """A whole number pandas gave as a float (a column of ints with a gap), as the int."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


class ParquetSink:
    """The `Recorder` of the results: buffers records and writes them as Parquet part
    files (each row journalled first), then, at ``finish``, one final file in ``order``."""

    name = "results"

    def __init__(self, out_dir: Path | Location, df: pd.DataFrame | None = None, *,
                 columns: tuple[pa.Schema, frozenset[str]] | None = None, prefix: str = "",
                 batch_rows: int = 2000, flush_seconds: float = 2.0,
                 order: RowOrder | None = None) -> None:
        """Write under ``out_dir/parts``; the dataset's columns come from ``df`` or ``columns``
        (`dataset_schema` of it). Writers in other processes use their own ``prefix``."""
        self.order = order
        assert df is not None or columns is not None
        extra, self._text_columns = columns if columns is not None else dataset_schema(df)
        self._int_columns = frozenset(f.name for f in extra if pa.types.is_integer(f.type))
        self.schema = pa.unify_schemas([FIXED_SCHEMA, extra])
        self.out_dir = Location.of(out_dir)
        self.parts = self.out_dir / PARTS_DIR
        self.batch_rows, self.flush_seconds = batch_rows, flush_seconds
        self._buffer: list[dict[str, Any]] = []
        self._last_flush = time.monotonic()
        self._stem = f"part-{prefix}-" if prefix else "part-"
        make_writable(self.parts)
        _adopt_journals(self.parts, self._stem)
        numbers = [p.name[len(self._stem):-len(".parquet")]
                   for p in self.parts.glob(f"{self._stem}*.parquet")]
        self._part_count = max([int(n) for n in numbers if n.isdigit()], default=-1) + 1
        self._journal: _Journal | None = None
        self.records_written = 0

    def _part_name(self) -> str:
        return f"{self._stem}{self._part_count:06d}"

    async def start(self, run: RunFacts) -> None:
        return None

    async def finish(self, manifest: Manifest) -> None:
        """The results file, the manifest in its metadata; the parts gone."""
        self.finalize(manifest.to_json(), self.order)

    def cancel(self) -> None:
        """Interrupted: every row given so far is kept, as a part."""
        self.flush()

    def add(self, records: list[Record]) -> None:
        """Journal one row's records at once; write a part when the batch is full or old."""
        rows = [record.to_row() for record in records]  # the file's boundary: dicts from here
        for row in rows:
            for column in self._text_columns.intersection(row):
                row[column] = _text(row[column])
            for column in self._int_columns.intersection(row):
                row[column] = _whole(row[column])
        if self._journal is None:
            self._journal = _Journal(self.parts / f"{self._part_name()}.journal",
                                     _schema_line(self.schema))
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
        part = self.parts / f"{self._part_name()}.parquet"
        part.write_table(pa.Table.from_pylist(self._buffer, schema=self.schema))
        if self._journal is not None:
            self._journal.remove()
            self._journal = None
        self._part_count += 1
        self.records_written += len(self._buffer)
        self._buffer = []

    def finalize(self, metadata: Mapping[str, Any], order: RowOrder | None = None) -> Location:
        """Write the remaining records, merge the parts into one file (in ``order``: the
        dataset's, not the order rows finished in; a window at a time), remove the parts."""
        self.flush()
        schema = self.schema.with_metadata({METADATA_KEY: json.dumps(metadata, default=str)})
        parts = sorted(self.parts.glob("part-*.parquet"), key=lambda p: p.name)
        final = self.out_dir / RESULTS_FILE
        # A column's dictionary stops at 128 KB (1 MB by default): windows of 65,536
        # records kept unique values (sids, times) in dictionaries, 43 MB for a million
        # records against 33 MB in one row group; 35 MB so.
        with final.atomic_output() as out, pq.ParquetWriter(
                out, schema, dictionary_pagesize_limit=128 << 10) as writer:
            for window in merged(parts, lambda p: p.read_table(schema=self.schema), order):
                writer.write_table(window, row_group_size=len(window))
        try:
            write_spans(self.out_dir, final)
        except Exception as exc:  # the results are written: spans.parquet is read from them
            logger.warning("spans.parquet not written (%s: %s); Experiment.spans() reads the "
                           "spans from the results", type(exc).__name__, exc)
        remove_parts(self.out_dir)
        pa.default_memory_pool().release_unused()  # the merge's buffers: see `read_frame`
        return final


class _Journal:
    """One part's journal: a row's line is stored by the time `write` returns.

    Locally, one file appended with one unbuffered write per row: the line is in the OS
    when `write` returns, so a killed process loses none. Object stores have no append,
    and rewriting the journal whole for each row would cost O(rows²) bytes: there the
    journal is a folder of objects, one per row (the schema line goes with the first),
    each written whole in one request that returns once the store holds it, so a killed
    process loses no row either. The price is a request per row, small beside the model
    calls a row makes. Readers join a part's objects in order (`_journal_bytes`).
    """

    def __init__(self, location: Location, header: bytes) -> None:
        self.location, self._header, self._count = location, header, 0
        self._file: BinaryIO | None = None
        if location.local is not None:
            self._file = open(location.local, "wb", buffering=0)  # noqa: SIM115 (kept open)
            self._file.write(header)

    def write(self, line: bytes) -> None:
        if self._file is not None:
            self._file.write(line)
        else:
            data = line if self._count else self._header + line
            (self.location / f"{self._count:08d}").write_bytes(data)
        self._count += 1

    def remove(self) -> None:
        if self._file is not None:
            self._file.close()
        self.location.remove()


def _journal_bytes(journal: Location) -> bytes:
    """A journal's lines: the file's, or its objects' in order (see `_Journal`)."""
    if journal.can_append:
        return journal.read_bytes()
    return b"".join(chunk.read_bytes() for chunk in sorted(journal.iterdir(), key=lambda c: c.name))


def _part_of(journal: Location) -> Location:
    return journal.with_name(journal.name.removesuffix(".journal") + ".parquet")


def make_writable(path: Path | Location) -> None:
    Location.of(path).check_writable()


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


def _read_journal(journal: Location) -> pa.Table | None:
    """A journal's complete lines as a table; a line cut short by a crash is skipped."""
    schema, records = None, []
    for line in _journal_bytes(journal).splitlines():
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


def _sorted(locations: list[Location]) -> list[Location]:
    return sorted(locations, key=lambda loc: loc.name)


def _adopt_journals(parts_dir: Location, stem: str) -> None:
    """Turn the journals a crashed writer of this ``stem`` left into parts, so a new
    writer can go on (other stems belong to writers that may still be running)."""
    for journal in _sorted(parts_dir.glob(f"{stem}*.journal")):
        part = _part_of(journal)
        table = None if part.exists() else _read_journal(journal)
        if table is not None:
            part.write_table(table)
        journal.remove()


def unfinished_tables(out_dir: Path | Location) -> list[pa.Table]:
    parts_dir = Location.of(out_dir) / PARTS_DIR
    names = parts_dir.iterdir()  # one listing (a request on object storage) for both kinds
    parts = {p.name for p in names if p.name.startswith("part-") and p.name.endswith(".parquet")}
    tables = [p.read_table() for p in _sorted(names) if p.name in parts]
    for journal in _sorted([j for j in names if j.name.startswith("part-")
                            and j.name.endswith(".journal")]):
        if _part_of(journal).name in parts:
            continue  # written as a part already; the journal was about to go
        table = _read_journal(journal)
        if table is not None:
            tables.append(table)
    return tables


def written_by(out_dir: Path | Location, prefix: str) -> Iterator[list[Record]]:
    """The records one writer (``prefix``: a batch's, on its worker) wrote as parts, a
    run of a row at a time (a row's records are written together)."""
    parts = _sorted((Location.of(out_dir) / PARTS_DIR).glob(f"part-{prefix}-*.parquet"))
    records = [Record.from_row(row) for part in parts for row in part.read_table().to_pylist()]
    for _, run in itertools.groupby(records, key=lambda r: (r.sid, r.repeat)):
        yield list(run)


def remove_parts(out_dir: Path | Location) -> None:
    """Delete the parts and journals of ``out_dir`` (their records are kept elsewhere)."""
    (Location.of(out_dir) / PARTS_DIR).remove()


def read_results(out_dir: Path | Location, columns: list[str] | None = None) -> pa.Table:
    """The records of an experiment: the final file, or what an unfinished one left.

    ``columns``: only these (every record has the fixed ones, see `records`).
    """
    final = Location.of(out_dir) / RESULTS_FILE
    if final.exists():
        try:
            if columns is None:
                return final.read_table()
            present = set(final.read_schema().names)
            return _with_columns(final.read_table(columns=[c for c in columns if c in present]),
                                 columns)
        except pa.ArrowInvalid as exc:  # cut short, overwritten: said as the file's, not Arrow's
            raise ConfigError(f"{final} is damaged and cannot be read ({exc}): restore it "
                              "from a copy, or run the experiment again.") from exc
    table = _read_unfinished(Location.of(out_dir))
    return _with_columns(table, columns) if columns else table


def read_frame(out_dir: Path | Location, columns: list[str] | None = None) -> pd.DataFrame:
    """`read_results` as a DataFrame. Arrow's columns are let go as they are converted, and
    what Arrow's allocator kept of the read goes back: at a million records it held
    ~150 MB beside the DataFrame, which pandas' own copies then came on top of."""
    frame = read_results(out_dir, columns).to_pandas(self_destruct=True, split_blocks=True)
    pa.default_memory_pool().release_unused()
    return frame


def _with_columns(table: pa.Table, columns: list[str]) -> pa.Table:
    """``table``'s ``columns`` in that order; a fixed one an older file lacks, as nulls."""
    types = {name: typ for name, typ, _ in COLUMNS}
    for name in columns:
        if name not in table.column_names:
            table = table.append_column(pa.field(name, types.get(name, pa.null())),
                                        pa.nulls(len(table), types.get(name, pa.null())))
    return table.select(columns)


def _read_unfinished(out_dir: Location) -> pa.Table:
    tables = unfinished_tables(out_dir)
    previous = out_dir / PREVIOUS_FILE
    if previous.exists():  # an interrupted resume: newer records win per run of a row
        older = previous.read_table()
        newer = pa.array([k for t in tables for k in unit_keys(t).to_pylist()], pa.string())
        tables.insert(0, older.filter(pc.invert(pc.is_in(unit_keys(older), value_set=newer))))
    if not tables:
        raise FileNotFoundError(f"no results in {out_dir}")
    return pa.concat_tables(tables, promote_options="permissive")


def unit_keys(table: pa.Table) -> pa.Array:
    """Each record's run of a row (sample id and repeat) as one string, for set look-ups."""
    repeat = (table["repeat"] if "repeat" in table.column_names
              else pa.nulls(len(table), pa.int32()))
    text = pc.fill_null(pc.cast(repeat, pa.string()), "")
    return pc.binary_join_element_wise(pc.cast(table["sid"], pa.string()), text, "\x00")
