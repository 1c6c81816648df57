"""The bounds of a query in the SQL sandbox (`sql_sandbox`): its time, the query running
on a thread of its own that the caller interrupts from outside, and its result, read row by
row (SQLite) or in small batches and stopped past ``max_rows`` rows or ``max_bytes`` bytes
(Python's size of the rows), never materialised first."""

from __future__ import annotations

import contextlib
import decimal
import os
import queue
import sqlite3
import sys
import threading
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


class SandboxUnavailable(Exception):
    """The sandbox could not run the query at all (no worker free in time, none started,
    the connection factory failed): the evaluator's error, not a finding on the query."""


@dataclass(frozen=True)
class Limits:
    timeout: float = 10.0
    max_rows: int = MAX_ROWS
    max_bytes: int = MAX_BYTES


class Job:
    """One query on a runner thread: what it returned or raised, and its connection's
    interrupt and close, never called at once (an interrupt on a closed connection)."""

    def __init__(self, work: Callable[[Job], Any]) -> None:
        self.work, self.lock = work, threading.Lock()
        self.done = threading.Lock()  # held until the query ends (an Event costs twice as much)
        self.done.acquire()
        self.value: Any = None
        self.error: BaseException | None = None
        self._interrupt: Callable[[], Any] | None = None
        self._close: Callable[[bool], Any] | None = None
        self._fired = False

    def attach(self, interrupt: Callable[[], Any] | None, close: Callable[[bool], Any]) -> None:
        """``close(again)``: again is whether its connection may serve another query (not
        once interrupted; a query that failed left it as it was)."""
        with self.lock:
            self._interrupt, self._close = interrupt, close

    def run(self) -> None:
        try:
            self.value = self.work(self)
        except BaseException as exc:  # the caller raises it
            self.error = exc
        finally:
            with self.lock, contextlib.suppress(Exception):  # a close failing: done all the same
                close, self._interrupt, self._close = self._close, None, None
                if close is not None:
                    close(not self._fired)
            self.done.release()

    def interrupt(self) -> None:
        with self.lock, contextlib.suppress(Exception):  # a driver's cancel failing: it runs on
            if self._interrupt is not None:
                self._fired = True
                self._interrupt()


class _Runners:
    """The threads queries run on. The caller waits at most the timeout, interrupts the
    query from outside and returns: even a query inside one C call that no interrupt
    reaches (SQLite 3.40's printf('%.*c', 2000000000, 'x') loops ~30 s) fails at its
    timeout; its thread ends when the call does. Daemon threads: such a call never holds
    up the exit. Measured: the hand-over costs ~20 µs of CPU, an ordinary query ~90 µs
    (the landed code spent ~130 µs copying the database for each)."""

    def __init__(self) -> None:
        self.start()
        os.register_at_fork(after_in_child=self.start)  # the parent's threads are not there

    def start(self) -> None:
        self._lock, self._idle = threading.Lock(), 0
        self._jobs: queue.SimpleQueue[Job] = queue.SimpleQueue()

    def submit(self, job: Job) -> None:
        with self._lock:
            spawn = self._idle == 0
            self._idle -= 0 if spawn else 1
        if spawn:
            threading.Thread(target=self._serve, name="patronus-sql", daemon=True).start()
        self._jobs.put(job)

    def _serve(self) -> None:
        while True:
            self._jobs.get().run()
            with self._lock:
                self._idle += 1


_RUNNERS = _Runners()


def within(timeout: float, work: Callable[[Job], Any]) -> Any:
    """``work(job)`` on a runner thread; past ``timeout`` seconds, interrupted and a
    TimeoutError here, whether it stopped or not."""
    job = Job(work)
    _RUNNERS.submit(job)
    if not job.done.acquire(timeout=timeout):
        job.interrupt()
        raise TimeoutError(f"ran past its {timeout:g} s (timeout=), interrupted")
    if job.error is not None:
        raise job.error
    return job.value


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
