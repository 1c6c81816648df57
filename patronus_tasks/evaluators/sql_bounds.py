"""The bounds of a query in the SQL sandbox (`sql_sandbox`): its time, kept by one
watchdog thread that interrupts the connection from outside, and its result, read row by
row (SQLite) or in small batches and stopped past ``max_rows`` rows or ``max_bytes`` bytes
(Python's size of the rows), never materialised first."""

from __future__ import annotations

import contextlib
import decimal
import heapq
import itertools
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

MAX_ROWS = 100_000
MAX_BYTES = 32 << 20  # Python's size of the rows (a 3-column row of short values: ~200 B)
_BATCH = 256  # rows per fetch where a driver reads in batches (DuckDB: its vectors are 2048)

class QueryRefused(Exception):
    """The sandbox does not run this: more than one statement, or an action it denies."""


class ResultTooLarge(Exception):
    """The result went past ``max_rows`` or ``max_bytes`` (or the engine's memory)."""


@dataclass(frozen=True)
class Limits:
    timeout: float = 10.0
    max_rows: int = MAX_ROWS
    max_bytes: int = MAX_BYTES


class _Watch:
    __slots__ = ("fired", "interrupt")

    def __init__(self, interrupt: Callable[[], Any]) -> None:
        self.interrupt: Callable[[], Any] | None = interrupt
        self.fired = False


class _Watchdog:
    """Every query's deadline, kept by one thread that interrupts the connection from
    outside: SQLite's progress handler (the landed way) is never called while one
    function builds one huge value, and a timer thread per query costs ~60 µs."""

    def __init__(self) -> None:
        self._pid = -1

    def _start(self) -> None:  # again in a forked child: the parent's thread is not there
        self._pid, self._cond = os.getpid(), threading.Condition()
        self._heap: list[tuple[float, int, _Watch]] = []
        self._seq = itertools.count()
        threading.Thread(target=self._run, name="patronus-sql-watchdog", daemon=True).start()

    def watch(self, timeout: float, interrupt: Callable[[], Any] | None) -> _Watch | None:
        if interrupt is None:
            return None
        if self._pid != os.getpid():
            self._start()
        watch = _Watch(interrupt)
        with self._cond:
            heapq.heappush(self._heap, (time.monotonic() + timeout, next(self._seq), watch))
            if self._heap[0][2] is watch:  # the thread sleeps until a later deadline
                self._cond.notify()
        return watch

    def release(self, watch: _Watch | None) -> bool:
        """Whether it fired; once this returns, the connection is never interrupted."""
        if watch is None:
            return False
        with self._cond:
            watch.interrupt = None
        return watch.fired

    def _run(self) -> None:
        with self._cond:
            while True:
                wait = self._heap[0][0] - time.monotonic() if self._heap else None
                if wait is not None and wait <= 0:
                    self._fire(heapq.heappop(self._heap)[2])
                else:  # released watches are dropped when their deadline comes: no wake per query
                    self._cond.wait(wait)

    @staticmethod
    def _fire(watch: _Watch) -> None:
        if watch.interrupt is not None:
            watch.fired = True
            with contextlib.suppress(Exception):  # a driver's cancel failing: the query runs on
                watch.interrupt()


WATCHDOG = _Watchdog()


def collect(cursor: Any, limits: Limits) -> tuple[list[tuple[Any, ...]], int]:
    if cursor.description is None:  # no result set (a comment alone)
        return [], 0
    rows: list[tuple[Any, ...]] = []
    size = 0
    sized = _flat_bytes if isinstance(cursor, sqlite3.Cursor) else _row_bytes
    for row in _rows_of(cursor):
        if len(rows) == limits.max_rows:
            raise ResultTooLarge(f"more than max_rows={limits.max_rows:,} rows")
        size += sized(row)
        if size > limits.max_bytes:
            raise ResultTooLarge(f"more than max_bytes={limits.max_bytes:,} bytes in its first "
                                 f"{len(rows) + 1:,} rows")
        rows.append(row)
    return rows, size


def _rows_of(cursor: Any) -> Iterator[tuple[Any, ...]]:
    if isinstance(cursor, sqlite3.Cursor):
        yield from cursor  # one row at a time: its size is checked before the next is read
        return
    while batch := cursor.fetchmany(_BATCH):
        for row in batch:
            yield tuple(map(_value, row))


def _value(v: Any) -> Any:
    return float(v) if isinstance(v, decimal.Decimal) else v


def _flat_bytes(row: tuple[Any, ...]) -> int:
    return sys.getsizeof(row) + sum(map(sys.getsizeof, row))


def _row_bytes(row: tuple[Any, ...]) -> int:
    return sys.getsizeof(row) + sum(map(_bytes, row))


def _bytes(value: Any) -> int:
    """Python's size of a value, DuckDB's lists and structs with what they hold."""
    size = sys.getsizeof(value)
    if isinstance(value, dict):
        return size + sum(_bytes(k) + _bytes(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return size + sum(map(_bytes, value))
    return size
