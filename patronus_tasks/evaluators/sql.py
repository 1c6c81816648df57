"""SQL checks: the output query returns the gold query's rows (`sql_result_match`, on a
fresh copy of a SQLite or DuckDB database), or is the same query once both are parsed,
normalised and optimised by `sqlglot` (`sql_equivalent`, no database needed).
"""

from __future__ import annotations

import decimal
import math
import re
import shutil
import sqlite3
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from patronus_tasks.define.step_results import EvaluationResult
from patronus_tasks.evaluators.base import (
    Check,
    check_choice,
    check_number,
    cut,
    needs_output,
    verdict,
)
from patronus_tasks.exceptions import ConfigError, DatasetError

Connect = Callable[[], Any]  # a DB-API connection, fresh each call
_GOLD_KEPT = 4096  # gold result sets kept per evaluator (a gold query runs once per process)


class Database:
    """Where queries run: each call of `connect` is a fresh copy, so a query that changes
    the data cannot change what the next one sees."""

    def __init__(self, source: Any, engine: str | None) -> None:
        self.source, self.engine = source, engine
        self.kind, self.script = self._kind(source, engine)
        self.described = (getattr(source, "__name__", "a connection factory") if callable(source)
                          else f"{self.engine} {self.kind} {cut(str(source), 60)!r}")

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

    def __repr__(self) -> str:
        # Stable across processes: it is part of the cache's key.
        if self.kind == "script":
            import hashlib

            digest = hashlib.sha256((self.script or "").encode()).hexdigest()[:16]
            return f"Database({self.engine}, script sha256:{digest})"
        if self.kind == "factory":
            return f"Database(factory {getattr(self.source, '__qualname__', type(self.source).__name__)})"
        return f"Database({self.engine}, {Path(self.source).resolve()})"

    def connect(self) -> tuple[Any, Callable[[], None]]:
        """A fresh connection and what to call once done with it."""
        if self.kind == "factory":
            conn = self.source()
            return conn, conn.close
        if self.engine == "duckdb":
            return self._duckdb()
        conn = sqlite3.connect(":memory:", check_same_thread=False)
        if self.kind == "script":
            conn.executescript(self.script or "")
        else:
            with sqlite3.connect(f"file:{Path(self.source).resolve()}?mode=ro", uri=True) as src:
                src.backup(conn)
        return conn, conn.close

    def _duckdb(self) -> tuple[Any, Callable[[], None]]:
        try:
            import duckdb
        except ImportError:
            raise ConfigError("sql_result_match: a DuckDB database needs the duckdb package "
                              "(pip install duckdb).") from None
        if self.kind == "script":
            conn = duckdb.connect(":memory:")
            conn.execute(self.script or "")
            return conn, conn.close
        folder = tempfile.mkdtemp(prefix="patronus-sql-")
        copy = Path(folder) / Path(self.source).name
        shutil.copyfile(self.source, copy)
        conn = duckdb.connect(str(copy))

        def done() -> None:
            conn.close()
            shutil.rmtree(folder, ignore_errors=True)

        return conn, done


def run_query(db: Database, query: str, timeout: float) -> list[tuple[Any, ...]]:
    """The rows ``query`` returns on a fresh copy of ``db``."""
    conn, done = db.connect()
    timer = None
    try:
        if isinstance(conn, sqlite3.Connection):
            deadline = time.monotonic() + timeout
            conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
        elif hasattr(conn, "interrupt"):  # DuckDB: stopped from another thread
            timer = threading.Timer(timeout, conn.interrupt)
            timer.start()
        cursor = conn.execute(query) if hasattr(conn, "execute") else _cursor(conn, query)
        return [tuple(_value(v) for v in row) for row in cursor.fetchall()]
    except Exception as exc:
        if timer is not None and not timer.is_alive():
            raise TimeoutError(f"ran past its {timeout:g} s (timeout=)") from exc
        raise
    finally:
        if timer is not None:
            timer.cancel()
        done()


_FENCE = re.compile(r"```([^\n`]*)\n?(.*?)(?:```|\Z)", re.S)  # an unclosed one: cut off
_SQL_TAGS = frozenset({"sql", "sqlite", "postgres", "postgresql", "psql", "mysql", "mariadb",
                       "duckdb", "tsql", "mssql", "plsql", "oracle", "bigquery", "snowflake",
                       "redshift", "spark", "sparksql", "hive", "trino", "presto", "clickhouse"})
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def sql_text(text: str) -> str:
    """The query in a model's answer: the first Markdown code fence tagged as SQL (chat
    models wrap SQL in ```sql fences), else the first untagged one (or a one-line
    ```SELECT 1```), else the text as it is. A fence tagged as another language is not
    the query."""
    untagged = None
    for info, body in _FENCE.findall(text):
        info = info.strip()
        tag = info.split()[0].lower() if info else ""
        if tag in _SQL_TAGS:
            return f"{info[len(tag):]}\n{body}".strip()
        one_line = bool(info) and not body.strip()  # ```SELECT 1```: the query is the "tag"
        if untagged is None and (not info or one_line):
            untagged = (info if one_line else body).strip()
    return untagged if untagged is not None else text


def _plain(exc: Exception) -> str:
    return _ANSI.sub("", str(exc))  # sqlglot underlines the error with terminal codes


def _cursor(conn: Any, query: str) -> Any:
    cursor = conn.cursor()
    cursor.execute(query)
    return cursor


def _value(v: Any) -> Any:
    return float(v) if isinstance(v, decimal.Decimal) else v


def _ordered(query: str, dialect: str) -> bool:
    """Whether the query's own result is ordered (a top-level ORDER BY)."""
    import sqlglot

    try:
        tree = sqlglot.parse_one(query, dialect=dialect)
    except sqlglot.errors.ParseError:
        return bool(re.search(r"\border\s+by\b", query, re.I))
    return tree.args.get("order") is not None


class _Rows:
    """Comparing two result sets, floats to a tolerance."""

    def __init__(self, tolerance: float) -> None:
        self.tol = tolerance
        self.digits = max(0, min(15, int(-math.log10(tolerance)) if tolerance > 0 else 15))

    def key(self, row: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(self._key(v) for v in row)

    def _key(self, v: Any) -> Any:
        if isinstance(v, float):
            return round(v, self.digits)
        if isinstance(v, list | tuple):  # DuckDB's lists and structs
            return tuple(self._key(x) for x in v)
        if isinstance(v, dict):
            return tuple(sorted((k, self._key(x)) for k, x in v.items()))
        return v

    def same_row(self, a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
        return len(a) == len(b) and all(self._same(x, y) for x, y in zip(a, b, strict=True))

    def _same(self, x: Any, y: Any) -> bool:
        if isinstance(x, list | tuple) and isinstance(y, list | tuple):
            return self.same_row(tuple(x), tuple(y))
        if isinstance(x, int | float) and isinstance(y, int | float) \
                and not isinstance(x, bool) and not isinstance(y, bool):
            return math.isclose(x, y, rel_tol=self.tol, abs_tol=self.tol)
        return bool(x == y)

    def same(self, got: list[tuple[Any, ...]], want: list[tuple[Any, ...]], ordered: bool,
             bag: bool) -> bool:
        if not ordered:
            got, want = self._canonical(got, bag), self._canonical(want, bag)
        return len(got) == len(want) and all(self.same_row(a, b) for a, b in zip(got, want, strict=True))

    def _canonical(self, rows: list[tuple[Any, ...]], bag: bool) -> list[tuple[Any, ...]]:
        kept = rows if bag else list({self.key(r): r for r in rows}.values())
        return sorted(kept, key=lambda r: repr(self.key(r)))

    def overlap(self, got: list[tuple[Any, ...]], want: list[tuple[Any, ...]]) -> float:
        a, b = Counter(map(self.key, got)), Counter(map(self.key, want))
        union = sum((a | b).values())
        return sum((a & b).values()) / union if union else 1.0


class SqlResultMatch(Check):
    factory = "sql_result_match"

    def warm(self) -> None:
        import sqlglot  # noqa: F401  (reads the gold query's ORDER BY)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_gold"}

    @needs_output
    def evaluate(self, evaluated_model_gold_answer: str,
                 evaluated_model_output: str = "") -> EvaluationResult:
        want = self._gold_rows(evaluated_model_gold_answer)
        try:
            got = run_query(self.options["database"], sql_text(evaluated_model_output),
                            self.options["timeout"])
        except Exception as exc:  # the database's own error: the query is wrong, a finding
            return verdict(False, f"the query failed: {type(exc).__name__}: {cut(str(exc), 300)}")
        rows = _Rows(self.options["float_tolerance"])
        ordered = _ordered(evaluated_model_gold_answer, self.options["dialect"])
        same = rows.same(got, want, ordered, self.options["compare"] == "bag")
        facts: dict[str, Any] = {"rows_expected": len(want), "rows_got": len(got), "ordered": ordered,
                 "row_overlap": round(rows.overlap(got, want), 6)}
        if same:
            return verdict(True, **facts)
        return verdict(False, f"expected {len(want)} rows {_first(want)}, got {len(got)} rows "
                       f"{_first(got)}" + (" (in order)" if ordered else ""), **facts)

    def _gold_rows(self, gold: str) -> list[tuple[Any, ...]]:
        kept: dict[str, list[tuple[Any, ...]]] = self.__dict__.setdefault("_gold", {})
        if gold not in kept:
            try:
                rows = run_query(self.options["database"], gold, self.options["timeout"])
            except Exception as exc:
                raise DatasetError(f"sql_result_match: the gold query fails on "
                                   f"{self.options['database'].described}: {type(exc).__name__}: "
                                   f"{exc}. Fix the dataset's evaluated_model_gold_answer.") from None
            if len(kept) >= _GOLD_KEPT:
                kept.clear()
            kept[gold] = rows
        return kept[gold]


def sql_result_match(database: str | Path | Connect, *, float_tolerance: float = 1e-6,
                     compare: str = "set", engine: str | None = None, dialect: str = "sqlite",
                     timeout: float = 10.0, **step: Any) -> SqlResultMatch:
    """The output query returns the same rows as the gold query.

    ``database``: a SQLite or DuckDB file (``.duckdb``/``.ddb``: DuckDB, which needs the
    ``duckdb`` package), a schema script (a ``.sql`` file, or SQL text with ``CREATE
    TABLE``; ``engine="duckdb"`` runs it in DuckDB) or a function returning a new DB-API
    connection. Each query runs on a fresh copy (read from the file, or the script run
    anew), so one that changes data changes nothing for the next.
    Rows compare as a set (``compare="bag"``: duplicates count too), in order only when the
    gold query has a top-level ``ORDER BY``; numbers equal within ``float_tolerance``
    (relative or absolute). A query that fails or runs past ``timeout`` seconds (SQLite
    and DuckDB; a connection factory's database as its driver allows) is a fail with the
    database's message; a gold query that fails is that row's error. A query in a Markdown
    code fence (```sql ... ```) is read from it.
    Score 1 or 0; the metadata has both row counts and the rows' overlap (Jaccard).
    """
    owner = "sql_result_match"
    check_choice(owner, "compare", compare, ("set", "bag"))
    if engine is not None:
        check_choice(owner, "engine", engine, ("sqlite", "duckdb"))
    options = {"database": Database(database, engine), "compare": compare, "dialect": dialect,
               "float_tolerance": check_number(owner, "float_tolerance", float_tolerance),
               "timeout": check_number(owner, "timeout", timeout, low=0.001)}
    return SqlResultMatch(options, "returns the gold query's rows", step)


class SqlEquivalent(Check):
    factory = "sql_equivalent"

    def warm(self) -> None:
        from sqlglot.optimizer import optimize  # noqa: F401

    @needs_output
    def evaluate(self, evaluated_model_gold_answer: str,
                 evaluated_model_output: str = "") -> EvaluationResult:
        import sqlglot

        try:
            want = self.canonical(evaluated_model_gold_answer)
        except sqlglot.errors.SqlglotError as exc:
            raise DatasetError(f"sql_equivalent: the gold query is not valid "
                               f"{self.options['dialect']} SQL: {_plain(exc)}. Fix the dataset's "
                               "evaluated_model_gold_answer.") from None
        try:
            got = self.canonical(sql_text(evaluated_model_output))
        except sqlglot.errors.SqlglotError as exc:
            return verdict(False, f"not valid {self.options['dialect']} SQL: {cut(_plain(exc), 300)}")
        if got == want:
            return verdict(True, normalized=got)
        return verdict(False, f"differs once normalised:\n  got:      {cut(got, 300)}\n  "
                       f"expected: {cut(want, 300)}", normalized=got, expected=want)

    def canonical(self, query: str) -> str:
        """``query`` parsed, normalised and optimised, as SQL text."""
        import sqlglot
        from sqlglot import exp
        from sqlglot.optimizer import optimize

        dialect, schema = self.options["dialect"], self.options["schema"]
        tree = sqlglot.parse_one(query, dialect=dialect)
        try:
            tree = optimize(tree, schema=schema, dialect=dialect, validate_qualify_columns=False)
        except sqlglot.errors.OptimizeError:  # a query the optimiser cannot resolve: normalised only
            tree = sqlglot.parse_one(tree.sql(dialect=dialect, normalize=True, comments=False),
                                     dialect=dialect)
        if self.options["ignore_aliases"] and isinstance(tree, exp.Select):
            for column in list(tree.expressions):
                if isinstance(column, exp.Alias):
                    column.replace(column.this)
        return str(tree.sql(dialect=dialect, comments=False))  # a comment is not the query


def sql_equivalent(*, dialect: str = "sqlite", schema: dict[str, Any] | None = None,
                   ignore_aliases: bool = True, **step: Any) -> SqlEquivalent:
    """The output query is the gold query once both are parsed in ``dialect``, normalised
    and optimised by `sqlglot` (``sqlglot.optimizer.optimize``: identifiers, literals on
    the right, ``NOT a <= 3`` as ``a > 3``, conditions in one order, ...). ``schema``
    (``{"table": {"column": "type"}}``) lets the optimiser resolve columns of joins; the
    output columns' aliases are ignored unless ``ignore_aliases=False``. No database needed;
    two queries that differ here may still return the same rows (`sql_result_match`).
    Score 1 or 0."""
    import sqlglot

    owner = "sql_equivalent"
    try:
        sqlglot.Dialect.get_or_raise(dialect)
    except ValueError as exc:
        raise ConfigError(f"{owner}: {exc}") from None
    if schema is not None and not isinstance(schema, dict):
        raise ConfigError(f"{owner}: schema must be a dict of tables to {{column: type}}, not {schema!r}.")
    options = {"dialect": dialect, "schema": schema,
               "ignore_aliases": check_choice(owner, "ignore_aliases", ignore_aliases, (True, False))}
    return SqlEquivalent(options, f"the same query as the gold one ({dialect}, normalised by sqlglot)", step)


def _first(rows: list[tuple[Any, ...]], shown: int = 3) -> str:
    """The first rows, saying how many more there are (an explanation said "got 4 rows"
    and listed 3)."""
    more = f" and {len(rows) - shown} more" if len(rows) > shown else ""
    return cut(repr(rows[:shown]), 150) + more
