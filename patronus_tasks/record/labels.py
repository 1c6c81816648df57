"""``labels.parquet``: what people said of an experiment's rows (`review`), beside its
results: one row per (sample, evaluator, reviewer), the label (a value of the
evaluator's scale), the reviewer's name, their note and when.

A reviewer who labels a row again replaces their own label; other reviewers' labels of
it are kept apart (their agreement among themselves is a figure of its own). The file
is replaced whole at each write (`Location.write_table`: readers see the old one or the
new one), so a page of answers is kept as soon as it is given.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import ModuleType

import pandas as pd
import pyarrow as pa

from patronus_tasks.exceptions import ConfigError
from patronus_tasks.record.location import Location

fcntl: ModuleType | None
try:
    import fcntl
except ImportError:  # Windows: no lock
    fcntl = None

LABELS_FILE = "labels.parquet"
LABELS_SCHEMA = pa.schema([
    pa.field("sid", pa.string()), pa.field("evaluator", pa.string()),
    pa.field("label", pa.string()), pa.field("reviewer", pa.string()),
    pa.field("note", pa.string()), pa.field("reviewed_at", pa.timestamp("us", tz="UTC")),
])
LABEL_COLUMNS = tuple(LABELS_SCHEMA.names)
_KEY = ["sid", "evaluator", "reviewer"]


@dataclass(frozen=True)
class Label:
    """One person's label of one row for one evaluator."""

    sid: str
    evaluator: str
    label: str
    reviewer: str
    note: str | None = None
    reviewed_at: dt.datetime | None = None  # None: now


def empty_labels() -> pd.DataFrame:
    return LABELS_SCHEMA.empty_table().to_pandas()


def read_labels(experiment_dir: Location) -> pd.DataFrame:
    """The labels given so far (none: an empty frame with the columns)."""
    found = experiment_dir / LABELS_FILE
    if not found.exists():
        return empty_labels()
    try:
        table = found.read_table()
    except (OSError, pa.ArrowInvalid) as exc:
        raise ConfigError(f"{found} cannot be read ({exc}): the labels of {experiment_dir.name} "
                          "are damaged; remove the file to start its review again.") from None
    missing = [c for c in LABEL_COLUMNS if c not in table.column_names]
    if missing:
        raise ConfigError(f"{found} is not a labels file (no column {missing[0]!r}).")
    return table.select(list(LABEL_COLUMNS)).cast(LABELS_SCHEMA).to_pandas()


def _frame(labels: Sequence[Label]) -> pd.DataFrame:
    now = dt.datetime.now(dt.UTC)
    rows = [{"sid": x.sid, "evaluator": x.evaluator, "label": x.label, "reviewer": x.reviewer,
             "note": x.note or None, "reviewed_at": x.reviewed_at or now} for x in labels]
    table = pa.Table.from_pylist(rows, schema=LABELS_SCHEMA)
    return table.to_pandas()


def add_labels(experiment_dir: Location, labels: Sequence[Label]) -> pd.DataFrame:
    """``labels`` kept beside the results (a reviewer's later label of a row replacing
    their earlier one); all the labels now."""
    if not labels:
        return read_labels(experiment_dir)
    with _locked(experiment_dir):
        return _merge(experiment_dir, labels)


@contextlib.contextmanager
def _locked(experiment_dir: Location) -> Iterator[None]:
    """One writer of the labels at a time, on a local folder (a terminal's review beside a
    flow's: each read, added to and replaced the file, and the later one dropped what the
    other added). An object store has no lock: a write there replaces the file whole."""
    if experiment_dir.local is None or fcntl is None:
        yield
        return
    with (experiment_dir.local / f".{LABELS_FILE}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _merge(experiment_dir: Location, labels: Sequence[Label]) -> pd.DataFrame:
    known = read_labels(experiment_dir)
    merged = pd.concat([known, _frame(labels)], ignore_index=True) if len(known) else _frame(labels)
    merged = merged.drop_duplicates(_KEY, keep="last").reset_index(drop=True)
    table = pa.Table.from_pandas(merged, schema=LABELS_SCHEMA, preserve_index=False)
    (experiment_dir / LABELS_FILE).write_table(table)
    return merged
