"""The sandbox a query of `sql_result_match` runs in (and `run_query`, which the
text-to-SQL flow uses): the model's SQL is untrusted input. Nothing here trusts it.

- SQLite: the database opened read-only (a file: the user's own, ``mode=ro``; a schema
  script: run once per process into a private file, opened immutable); an authorizer lets
  a statement read and call functions and denies the rest (ATTACH, VACUUM, PRAGMA, every
  write to data or schema, transactions); a value longer than ``max_bytes`` fails at once
  (SQLITE_LIMIT_LENGTH); SQLite's heap in this process is capped (``hard_heap_limit``,
  unless one is set) and its temporary store is that heap, not files.
- DuckDB: a private copy (made once per process, again when the file changes), queried
  in worker processes (`sql_worker`, `sql_child`) whose address space is capped, which
  open it read-only with external access off (no files, network or extensions), Python
  variables invisible, one thread, a memory limit, nothing spilled to disk, the
  configuration locked; one SELECT statement; at the timeout the worker is interrupted,
  then killed.
- Every engine: exactly one statement; the timeout enforced from outside (SQLite's query
  runs on a thread of its own, interrupted at the timeout); rows read one at a time
  (SQLite) or in small batches, within ``max_rows`` and ``max_bytes`` (`sql_bounds`).
- A connection factory's connection: a sqlite3 or duckdb one gets its engine's sandbox
  on top of what the factory opened; any other driver only the statement count, the
  timeout (its ``interrupt()`` or ``cancel()``) and the caps.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import sqlite3
import tempfile
import threading
import weakref
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote

from patronus_tasks.evaluators.base import cut
from patronus_tasks.evaluators.sql_bounds import (
    MAX_BYTES,
    MAX_ROWS,
    Job,
    Limits,
    QueryRefused,
    ResultTooLarge,
    SandboxUnavailable,
    collect,
    within,
)
from patronus_tasks.evaluators.sql_child import duckdb_cursor, duckdb_module
from patronus_tasks.evaluators.sql_worker import Workers, settings
from patronus_tasks.exceptions import ConfigError

Connect = Callable[[], Any]  # a DB-API connection, fresh each call
SQLITE_HEAP = 1 << 30  # process-wide: bounds the SQLite side of 16 hostile queries together
_LENGTH_FLOOR = 1 << 20  # SQLite's length limit also bounds a sorter's records: never below 1 MiB
_IDLE_KEPT = 16  # connections kept open per database and process (each: a page cache of <= 2 MB)


class Database:
    """Where queries run: a SQLite or DuckDB file, a schema script, or a connection
    factory. A query cannot change what the next one sees (nothing it runs can write)."""

    def __init__(self, source: Any, engine: str | None) -> None:
        self.source, self.engine = source, engine
        self.kind, self.script = self._kind(source, engine)
        if self.engine == "duckdb" and self.kind != "factory":
            settings()  # a wrong PATRONUS_TASKS_SQL_WORKER* is a ConfigError now, not at a row
        self.described = (getattr(source, "__name__", "a connection factory") if callable(source)
                          else f"{self.engine} {self.kind} {cut(str(source), 60)!r}")
        self._local: _Local | None = None

    def _kind(self, source: Any, engine: str | None) -> tuple[str, str | None]:
        if callable(source):
            self.engine = engine or "connection"
            return "factory", None
        if isinstance(source, str) and re.search(r"\bcreate\s+(table|view)\b", source, re.I):
            self.engine = engine or "sqlite"
            return "script", source
        path = Path(source)
        if not path.is_file():
            raise ConfigError(f"sql_result_match: database {str(source)!r} is not a file, a schema "
                              "script (SQL text with CREATE TABLE) or a connection factory; give "
                              "one of those.")
        if path.suffix.lower() == ".sql":
            self.engine = engine or "sqlite"
            return "script", path.read_text(encoding="utf-8")
        self.engine = engine or ("duckdb" if path.suffix.lower() in (".duckdb", ".ddb") else "sqlite")
        return "file", None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_local": None}  # a process makes its own copy, opens its own

    def __repr__(self) -> str:
        # Stable across processes: it is part of the cache's key.
        if self.kind == "script":
            import hashlib

            digest = hashlib.sha256((self.script or "").encode()).hexdigest()[:16]
            return f"Database({self.engine}, script sha256:{digest})"
        if self.kind == "factory":
            return f"Database(factory {getattr(self.source, '__qualname__', type(self.source).__name__)})"
        return f"Database({self.engine}, {Path(self.source).resolve()})"

    def open(self, limits: Limits) -> tuple[Any, list[str], Callable[[bool], None]]:
        """A sandboxed connection, the list in which SQLite's authorizer says what it
        denied, and what to call once done (True: the connection may serve again)."""
        if self.kind == "factory":
            conn, refused = self._connect(), list[str]()
            try:
                _sandbox_connection(conn, limits, refused)
            except BaseException:
                conn.close()
                raise
            return conn, refused, lambda _again: conn.close()
        return self.local().take(limits)

    def _connect(self) -> Any:
        """The factory's connection; its failure is the sandbox's (the database down),
        never the query's."""
        try:
            return self.source()
        except Exception as exc:
            raise SandboxUnavailable(f"{self.described}: the connection factory failed: "
                                     f"{type(exc).__name__}: {cut(str(exc), 300)}") from exc

    def local(self) -> _Local:
        """This process's side of the database (made again when its file changed)."""
        with _LOCAL:
            local = self._local
            if local is not None and local.pid != os.getpid():
                _INHERITED.append(local)  # a forked child's: closing the parent's DuckDB here crashes
            if local is None or local.pid != os.getpid() or local.stamp != _stamp(self):
                self._local = local = _Local(self)  # an older one goes once no query uses it
        return local


_LOCAL = threading.Lock()
_INHERITED: list[Any] = []  # never closed here: the parent's connections and workers


def _after_fork() -> None:
    global _LOCAL
    _LOCAL = threading.Lock()  # the parent's may have been held by a thread the child lacks


os.register_at_fork(after_in_child=_after_fork)


def _stamp(db: Database) -> tuple[int, ...] | None:
    """What changes when a file does: a DuckDB file is copied again, a SQLite file opened
    again (one changed in place, its open connections see; one replaced, they would not)."""
    if db.kind != "file":
        return None
    stamp: tuple[int, ...] = ()
    for path in (str(db.source), f"{db.source}.wal")[:2 if db.engine == "duckdb" else 1]:
        with contextlib.suppress(FileNotFoundError):
            info = os.stat(path)
            stamp += (info.st_mtime_ns, info.st_size)
    return stamp


class _Local:
    """This process's side of a database: a private copy where one is needed (a schema
    script run once; a DuckDB file copied once, again when it changes: the landed code
    copied it for every query), and connections (SQLite) or worker processes (DuckDB)
    kept between queries. Nothing a query runs can change one (no write, ATTACH, PRAGMA,
    SET or TEMP object gets through), and opening one costs about as much as an ordinary
    query (the file, its schema). Removed, folder, connections and workers, once no query
    uses it."""

    def __init__(self, db: Database) -> None:
        self.pid, self.stamp, self.lock, self.engine = os.getpid(), _stamp(db), threading.Lock(), db.engine
        self._idle: list[tuple[Any, list[str]]] = []
        self.workers: Workers | None = None
        self._kept: list[Workers] = []
        own_file = db.kind == "file" and db.engine == "sqlite"
        folder = None if own_file else tempfile.mkdtemp(prefix="patronus-sql-")
        weakref.finalize(self, _remove, self.pid, folder, self._idle, self._kept)
        if db.engine == "duckdb":
            self.workers = Workers(_duckdb_copy(db, Path(folder or "") / "copy.duckdb"), settings())
            self._kept.append(self.workers)
        elif folder is None:  # the user's own file, read-only: no copy needed, nothing can write
            self.uri = f"file:{quote(str(Path(db.source).resolve()))}?mode=ro"
        else:
            with sqlite3.connect(Path(folder) / "copy.sqlite") as conn:
                conn.executescript(db.script or "")
            conn.close()
            self.uri = f"file:{quote(str(Path(folder) / 'copy.sqlite'))}?mode=ro&immutable=1"

    def take(self, limits: Limits) -> tuple[Any, list[str], Callable[[bool], None]]:
        with self.lock:
            conn, refused = self._idle.pop() if self._idle else (None, [])
        if conn is None:
            conn = sqlite3.connect(self.uri, uri=True, check_same_thread=False)
            _sandbox_sqlite(conn, refused)
        # zeroblob(900000000) fails at once, not 40 s and 7.8 GB
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, max(limits.max_bytes, _LENGTH_FLOOR))
        refused.clear()
        return conn, refused, partial(self._release, conn, refused)

    def _release(self, conn: Any, refused: list[str], again: bool) -> None:
        with self.lock:
            if again and len(self._idle) < _IDLE_KEPT:
                self._idle.append((conn, refused))
                return
        conn.close()


def _duckdb_copy(db: Database, path: Path) -> str:
    """The private copy the workers open read-only (this process keeps no DuckDB open:
    a forked child that closed its parent's instance crashed)."""
    if db.kind == "script":
        conn = duckdb_module().connect(str(path))
        try:
            conn.execute(db.script or "")
        finally:
            conn.close()
    else:
        shutil.copyfile(db.source, path)
        if os.path.exists(f"{db.source}.wal"):
            shutil.copyfile(f"{db.source}.wal", f"{path}.wal")
    return str(path)


def _remove(pid: int, folder: str | None, idle: list[tuple[Any, list[str]]], kept: list[Workers]) -> None:
    if pid != os.getpid():  # at a forked child's exit: the parent's, not to touch
        return
    for conn, _ in idle:
        conn.close()
    for workers in kept:
        workers.close()
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


def _is_duckdb(conn: Any) -> bool:
    return type(conn).__module__.split(".")[0] in ("duckdb", "_duckdb")


def _sandbox_connection(conn: Any, limits: Limits, refused: list[str]) -> None:
    """A factory's connection: SQLite and DuckDB get their engine's sandbox on top of what
    the factory opened; any other driver only the statement count, timeout and caps."""
    if isinstance(conn, sqlite3.Connection):
        _sandbox_sqlite(conn, refused)
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, max(limits.max_bytes, _LENGTH_FLOOR))
    elif _is_duckdb(conn):
        locked, external = conn.execute("SELECT current_setting('lock_configuration'), "
                                        "current_setting('enable_external_access')").fetchone()
        if locked and external:
            raise SandboxUnavailable("the factory's DuckDB connection has its configuration locked with "
                               "external access on: the sandbox cannot turn it off")
        if not locked:  # for its whole database instance: lock_configuration is global
            conn.execute("SET enable_external_access = false; SET autoload_known_extensions = false; "
                         "SET autoinstall_known_extensions = false; "
                         "SET python_enable_replacements = false; SET lock_configuration = true")


_HEAP_CAPPED = [False]


def _sandbox_sqlite(conn: sqlite3.Connection, refused: list[str]) -> None:
    if not _HEAP_CAPPED[0]:  # process-wide, once; a limit set by someone else is kept
        if not conn.execute("PRAGMA hard_heap_limit").fetchone()[0]:
            conn.execute(f"PRAGMA hard_heap_limit = {SQLITE_HEAP}")
        _HEAP_CAPPED[0] = True
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    conn.execute("PRAGMA temp_store = MEMORY")  # a huge sort is bounded by the heap, not the disk
    conn.set_authorizer(partial(_authorize, refused))


_READS = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE})
_NO_FUNCTIONS = frozenset({"fts3_tokenizer", "load_extension"})  # a pointer's address; a library
_ACTIONS = {getattr(sqlite3, f"SQLITE_{name}"): name for name in (
    "CREATE_INDEX", "CREATE_TABLE", "CREATE_TEMP_INDEX", "CREATE_TEMP_TABLE", "CREATE_TEMP_TRIGGER",
    "CREATE_TEMP_VIEW", "CREATE_TRIGGER", "CREATE_VIEW", "DELETE", "DROP_INDEX", "DROP_TABLE",
    "DROP_TEMP_INDEX", "DROP_TEMP_TABLE", "DROP_TEMP_TRIGGER", "DROP_TEMP_VIEW", "DROP_TRIGGER",
    "DROP_VIEW", "INSERT", "PRAGMA", "TRANSACTION", "UPDATE", "ATTACH", "DETACH", "ALTER_TABLE",
    "REINDEX", "ANALYZE", "CREATE_VTABLE", "DROP_VTABLE", "FUNCTION", "SAVEPOINT")}


def _authorize(refused: list[str], action: int, arg1: str | None, arg2: str | None,
               _db: str | None, _trigger: str | None) -> int:
    """Reading and calling functions, nothing else (VACUUM INTO asks for ATTACH first)."""
    if action in _READS or (action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() not in _NO_FUNCTIONS):
        return sqlite3.SQLITE_OK
    refused.append(" ".join(str(a) for a in (_ACTIONS.get(action, action), arg1, arg2) if a))
    return sqlite3.SQLITE_DENY


def run_query(db: Database, query: str, timeout: float = 10.0, *, max_rows: int = MAX_ROWS,
              max_bytes: int = MAX_BYTES, dialect: str | None = None) -> list[tuple[Any, ...]]:
    """The rows ``query`` returns on ``db``, run in the sandbox."""
    return execute(db, query, Limits(timeout, max_rows, max_bytes), dialect)[0]


def execute(db: Database, query: str, limits: Limits,
            dialect: str | None = None) -> tuple[list[tuple[Any, ...]], int]:
    """The rows ``query`` returns and their size in bytes; `QueryRefused`, `ResultTooLarge`,
    `TimeoutError` or the database's own error otherwise. ``dialect``: how to count the
    statements of a query for a connection factory's driver (sqlglot's name)."""
    if db.engine == "duckdb" and db.kind != "factory":  # in a worker process, capped there
        workers = db.local().workers
        assert workers is not None
        return workers.run(query, limits)
    seen: list[list[str]] = []  # what SQLite's authorizer refused
    try:
        rows: tuple[list[tuple[Any, ...]], int] = within(
            limits.timeout, partial(_run, db, query, limits, dialect, seen))
        return rows
    except TimeoutError:
        raise
    except Exception as exc:
        said = _said(exc, seen[0] if seen else [], limits, db.engine)
        if said is exc:
            raise
        raise said from exc


def _run(db: Database, query: str, limits: Limits, dialect: str | None, seen: list[list[str]],
         job: Job) -> tuple[list[tuple[Any, ...]], int]:
    """On the query's own thread: the connection is opened there (a factory's sqlite3
    connection is only used by the thread that made it)."""
    conn, refused, release = db.open(limits)
    seen.append(refused)
    job.attach(getattr(conn, "interrupt", None) or getattr(conn, "cancel", None), release)
    cursor = _execute(conn, query, dialect)
    try:
        return collect(cursor, limits)
    finally:
        if cursor is not conn:  # DuckDB's is the connection (closed only when the query failed)
            cursor.close()  # its statement reset: the connection serves again as new


def _execute(conn: Any, query: str, dialect: str | None) -> Any:
    """The cursor of ``query``, exactly one statement."""
    if isinstance(conn, sqlite3.Connection):
        return conn.execute(query)  # sqlite3 refuses a second statement before running the first
    if _is_duckdb(conn):
        return duckdb_cursor(conn, query)
    import sqlglot
    from sqlglot.tokens import TokenType

    tokens = [t.token_type for t in sqlglot.tokenize(query, read=dialect)]
    _one(sum(1 for a, b in itertools.pairwise([TokenType.SEMICOLON, *tokens])
             if a == TokenType.SEMICOLON and b != TokenType.SEMICOLON))
    cursor = conn.cursor()
    cursor.execute(query)
    return cursor


def _one(statements: int) -> None:
    if statements != 1:
        raise QueryRefused(f"{statements} statements: the sandbox runs exactly one")


def _said(exc: Exception, refused: list[str], limits: Limits, engine: str | None) -> Exception:
    """What the sandbox stopped, in its own words (the engines say "not authorized")."""
    if refused:
        return QueryRefused(f"the sandbox refused {cut(refused[0], 120)}: a query only reads "
                            "(no ATTACH, VACUUM, PRAGMA, transactions or writes)")
    text = str(exc)
    if isinstance(exc, sqlite3.ProgrammingError) and "one statement" in text:
        return QueryRefused("more than one statement: the sandbox runs exactly one")
    if isinstance(exc, sqlite3.DataError) and "too big" in text:
        return ResultTooLarge(f"a value longer than {max(limits.max_bytes, _LENGTH_FLOOR):,} bytes "
                              "(max_bytes=)")
    if isinstance(exc, MemoryError):
        return ResultTooLarge(f"past SQLite's memory in this process ({SQLITE_HEAP >> 20} MiB, "
                              "PRAGMA hard_heap_limit)" if engine == "sqlite" else "out of memory")
    return exc
