"""Waiting for an event, not for time: a condition polled until it holds, or a clear failure."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def until(check: Callable[[], T], what: str, timeout: float = 60) -> T:
    """``check()`` once it is truthy; an AssertionError naming ``what`` past ``timeout``."""
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(0.05)
    return found


def sids_written(out_dir: Path | str, *subfolders: str) -> list[str]:
    """The row ids of the records an experiment in ``out_dir`` (a folder or an object
    storage URL, then ``subfolders``) has written so far, one per record: its journals
    and parts, as a crash would leave them."""
    from patronus_tasks.record.location import Location
    from patronus_tasks.record.parquet import unfinished_tables

    where = Location.of(out_dir)
    for name in subfolders:
        where = where / name
    try:
        tables = unfinished_tables(where)
    except OSError:  # no parts yet, or a journal became a part while listed
        return []
    return [sid for table in tables for sid in table.column("sid").to_pylist()]
