"""The sandbox a query of `sql_result_match` runs in (and `run_query`, which the
text-to-SQL flow uses): the model's SQL is untrusted input. Nothing here trusts it.

- SQLite: the database opened read-only (a file: the user's own, ``mode=ro``; a schema
  script: run once per process into a private file, opened immutable); an authorizer lets
  a statement read and call functions and denies the rest (ATTACH, VACUUM, PRAGMA, every
  write to data or schema, transactions); a value longer than ``max_bytes`` fails at once
  (SQLITE_LIMIT_LENGTH); SQLite's heap in this process is capped (``hard_heap_limit``,
  unless one is set) and its temporary store is that heap, not files.
- DuckDB: a private copy (made once per process, again when the file changes), opened
  read-only with external access off (no files, network or extensions), Python variables
  invisible, one thread, a memory limit, nothing spilled to disk, the configuration
  locked; one SELECT statement.
- Every engine: exactly one statement; the timeout enforced from outside (one watchdog
  thread interrupts the connection); rows read one at a time (SQLite) or in small
  batches, within ``max_rows`` and ``max_bytes``.
"""

from __future__ import annotations

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
    WATCHDOG,
    Limits,
    QueryRefused,
    ResultTooLarge,
    collect,
)
from patronus_tasks.exceptions import ConfigError

Connect = Callable[[], Any]  # a DB-API connection, fresh each call
SQLITE_HEAP = 1 << 30  # process-wide: bounds the SQLite side of 16 hostile queries together
DUCKDB_MEMORY = "1GB"  # per database and process, shared by its queries in flight
_LENGTH_FLOOR = 1 << 20  # SQLite's length limit also bounds a sorter's records: never below 1 MiB


class Database:
    """Where queries run: a SQLite or DuckDB file, a schema script, or a connection
    factory. A query cannot change what the next one sees (nothing it runs can write)."""

    def __init__(self, source: Any, engine: str | None) -> None:
        self.source, self.engine = source, engine
        self.kind, self.script = self._kind(source, engine)
        self.described = (getattr(source, "__name__", "a connection factory") if callable(source)
                          else f"{self.engine} {self.kind} {cut(str(source), 60)!r}")
        self._copy: _Copy | None = None

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
        return {**self.__dict__, "_copy": None}  # a process makes its own copy

    def __repr__(self) -> str:
        # Stable across processes: it is part of the cache's key.
        if self.kind == "script":
            import hashlib

            digest = hashlib.sha256((self.script or "").encode()).hexdigest()[:16]
            return f"Database({self.engine}, script sha256:{digest})"
        if self.kind == "factory":
            return f"Database(factory {getattr(self.source, '__qualname__', type(self.source).__name__)})"
        return f"Database({self.engine}, {Path(self.source).resolve()})"

    def open(self, limits: Limits) -> tuple[Any, list[str], Callable[[], None]]:
        """A sandboxed connection, the list its authorizer fills with what it refused, and
        what to call once done with it."""
        if self.kind == "factory":
            conn = self.source()
            return conn, _sandbox_connection(conn, limits), conn.close
        if self.engine == "duckdb":
            cursor, close = self._private().cursor()
            return cursor, [], close
        path = Path(self.source).resolve() if self.kind == "file" else self._private().path
        flags = "mode=ro" if self.kind == "file" else "mode=ro&immutable=1"
        conn = sqlite3.connect(f"file:{quote(str(path))}?{flags}", uri=True, check_same_thread=False)
        return conn, _sandbox_sqlite(conn, limits), conn.close

    def _private(self) -> _Copy:
        with _COPYING:
            copy = self._copy
            if copy is None or copy.pid != os.getpid() or copy.stamp != _stamp(self):
                self._copy = copy = _Copy(self)  # the older one is removed once unused
            return copy


_COPYING = threading.Lock()


def _after_fork() -> None:
    global _COPYING
    _COPYING = threading.Lock()  # the parent's may have been held by a thread the child lacks


os.register_at_fork(after_in_child=_after_fork)


def _stamp(db: Database) -> tuple[int, ...] | None:
    """What changes when a database file does (the DuckDB copy is made again)."""
    if db.kind != "file" or db.engine != "duckdb":
        return None
    stamp: tuple[int, ...] = ()
    for path in (str(db.source), f"{db.source}.wal"):
        try:
            info = os.stat(path)
        except FileNotFoundError:
            continue
        stamp += (info.st_mtime_ns, info.st_size)
    return stamp


class _Copy:
    """This process's private copy of a database: a schema script run once, or a DuckDB
    file copied once (the landed code copied it for every query), in a folder of its own
    removed once no query uses it."""

    def __init__(self, db: Database) -> None:
        self.pid, self.stamp, self.lock = os.getpid(), _stamp(db), threading.Lock()
        folder = tempfile.mkdtemp(prefix="patronus-sql-")
        self.path = Path(folder) / f"copy.{db.engine}"
        self._keeper: list[Any] = []  # the DuckDB connection whose cursors run the queries
        weakref.finalize(self, _remove, folder, self._keeper)
        if db.engine == "duckdb":
            self._duckdb(db)
        else:
            with sqlite3.connect(self.path) as conn:
                conn.executescript(db.script or "")
            conn.close()

    def _duckdb(self, db: Database) -> None:
        duckdb = _duckdb_module()
        if db.kind == "script":
            conn = duckdb.connect(str(self.path))
            try:
                conn.execute(db.script or "")
            finally:
                conn.close()
        else:
            shutil.copyfile(db.source, self.path)
            if os.path.exists(f"{db.source}.wal"):
                shutil.copyfile(f"{db.source}.wal", f"{self.path}.wal")
        self._keeper.append(duckdb.connect(str(self.path), read_only=True, config=_DUCKDB_CONFIG))

    def cursor(self) -> tuple[Any, Callable[[], None]]:
        with self.lock:  # a connection's cursor() is not safe from two threads at once
            cursor = self._keeper[0].cursor()
        return cursor, partial(_close, cursor, self)  # the copy lives while its cursor does


def _close(cursor: Any, _copy: _Copy) -> None:
    cursor.close()


def _remove(folder: str, keeper: list[Any]) -> None:
    for conn in keeper:
        conn.close()
    shutil.rmtree(folder, ignore_errors=True)


_DUCKDB_CONFIG = {
    "enable_external_access": False,  # no files (read_text, COPY, ATTACH), network, extensions
    "autoinstall_known_extensions": False, "autoload_known_extensions": False,
    "allow_community_extensions": False,
    "python_enable_replacements": False,  # `FROM name` would read a DataFrame of this process
    "temp_directory": "",  # past the memory limit a fail, not gigabytes spilled to disk
    "threads": 1, "memory_limit": DUCKDB_MEMORY,
    "lock_configuration": True,  # no SET undoes the above
}


def _duckdb_module() -> Any:
    try:
        import duckdb
    except ImportError:
        raise ConfigError("sql_result_match: a DuckDB database needs the duckdb package "
                          "(pip install duckdb).") from None
    return duckdb


def _is_duckdb(conn: Any) -> bool:
    return type(conn).__module__.split(".")[0] in ("duckdb", "_duckdb")


def _sandbox_connection(conn: Any, limits: Limits) -> list[str]:
    """A factory's connection: SQLite and DuckDB get their engine's sandbox on top of what
    the factory opened; any other driver only the statement count, timeout and caps."""
    if isinstance(conn, sqlite3.Connection):
        return _sandbox_sqlite(conn, limits)
    if _is_duckdb(conn):
        locked, external = conn.execute("SELECT current_setting('lock_configuration'), "
                                        "current_setting('enable_external_access')").fetchone()
        if locked and external:
            raise QueryRefused("the factory's DuckDB connection has its configuration locked with "
                               "external access on: the sandbox cannot turn it off")
        if not locked:  # for its whole database instance: lock_configuration is global
            conn.execute("SET enable_external_access = false; SET autoload_known_extensions = false; "
                         "SET autoinstall_known_extensions = false; "
                         "SET python_enable_replacements = false; SET lock_configuration = true")
    return []


_HEAP_CAPPED = [False]


def _sandbox_sqlite(conn: sqlite3.Connection, limits: Limits) -> list[str]:
    if not _HEAP_CAPPED[0]:  # process-wide, once; a limit set by someone else is kept
        if not conn.execute("PRAGMA hard_heap_limit").fetchone()[0]:
            conn.execute(f"PRAGMA hard_heap_limit = {SQLITE_HEAP}")
        _HEAP_CAPPED[0] = True
    # zeroblob(900000000) fails at once instead of 40 s and 7.8 GB.
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, max(limits.max_bytes, _LENGTH_FLOOR))
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    conn.execute("PRAGMA temp_store = MEMORY")  # a huge sort is bounded by the heap, not the disk
    refused: list[str] = []
    conn.set_authorizer(partial(_authorize, refused))
    return refused


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
    conn, refused, close = db.open(limits)
    watch = WATCHDOG.watch(limits.timeout, getattr(conn, "interrupt", None) or getattr(conn, "cancel", None))
    try:
        return collect(_execute(conn, query, dialect), limits)
    except Exception as exc:
        said = _said(exc, refused, limits, WATCHDOG.release(watch))
        if said is exc:
            raise
        raise said from exc
    finally:
        WATCHDOG.release(watch)
        close()


def _execute(conn: Any, query: str, dialect: str | None) -> Any:
    """The cursor of ``query``, exactly one statement."""
    if isinstance(conn, sqlite3.Connection):
        return conn.execute(query)  # sqlite3 refuses a second statement before running the first
    if _is_duckdb(conn):
        duckdb = _duckdb_module()
        statements = duckdb.extract_statements(query)
        _one(len(statements))
        if statements[0].type != duckdb.StatementType.SELECT:
            raise QueryRefused(f"a {statements[0].type.name} statement: the sandbox runs a query "
                               "(SELECT, WITH, VALUES, FROM) and nothing else")
        return conn.execute(statements[0])
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


def _said(exc: Exception, refused: list[str], limits: Limits, fired: bool) -> Exception:
    """What the sandbox stopped, in its own words (the engines say "not authorized")."""
    if fired:
        return TimeoutError(f"ran past its {limits.timeout:g} s (timeout=), interrupted")
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
                              "PRAGMA hard_heap_limit)")
    return exc
