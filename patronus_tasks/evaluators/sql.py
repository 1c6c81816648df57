"""SQL checks: the output query returns the gold query's rows (`sql_result_match`, run on a
SQLite or DuckDB database in the sandbox of `sql_sandbox`), or is the same query once both are parsed,
normalised and optimised by `sqlglot` (`sql_equivalent`, no database needed).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

from patronus_tasks.define.step_results import EvaluationResult
from patronus_tasks.evaluators.base import (
    Check,
    check_choice,
    check_number,
    cut,
    reads,
    verdict,
)
from patronus_tasks.evaluators.sql_bounds import (
    MAX_BYTES,
    MAX_ROWS,
    Limits,
    ResultTooLarge,
    SandboxUnavailable,
)
from patronus_tasks.evaluators.sql_sandbox import Connect, Database, execute, run_query
from patronus_tasks.exceptions import ConfigError, DatasetError

__all__ = ["Database", "run_query", "sql_equivalent", "sql_result_match", "sql_text"]
_GOLD_KEPT = 4096  # gold result sets kept per evaluator (a gold query runs once per process)
_GOLD_BYTES = 256 << 20  # and their size together: a large dataset's gold results stay bounded
_SEARCH_CELLS = 5_000_000  # values compared while looking for a column order (~1 s at worst)


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


def _ordered(query: str, dialect: str) -> bool:
    """Whether the query's own result is ordered (a top-level ORDER BY)."""
    import sqlglot

    try:
        tree = sqlglot.parse_one(query, dialect=dialect)
    except sqlglot.errors.ParseError:
        return bool(re.search(r"\border\s+by\b", query, re.I))
    return tree.args.get("order") is not None


#: The input rule for the SQL checks: an empty gold query is the row's DatasetError (it
#: compared against 0 rows and failed), an empty output fails.
sql_read = reads(gold="value")

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

    def column_order(self, got: list[tuple[Any, ...]], want: list[tuple[Any, ...]], ordered: bool,
                     bag: bool) -> list[int] | None:
        """The order of ``got``'s columns that gives ``want``'s rows, or None. As Spider's
        test-suite evaluation (`result_eq`) but not by trying permutations: a gold column can
        only be a column holding the same values (as a multiset), a choice under which the
        columns chosen so far disagree row by row is dropped at once, and a column equal to
        one already tried is not tried again."""
        width = len(want[0]) if want else 0
        if width < 2 or not got or len(got[0]) != width:
            return None
        g, w = self._keyed(got, ordered, bag), self._keyed(want, ordered, bag)
        if len(g) != len(w):
            return None
        search = _Search(list(zip(*g, strict=True)), list(zip(*w, strict=True)), ordered)
        return search.order([])

    def _keyed(self, rows: list[tuple[Any, ...]], ordered: bool, bag: bool) -> list[tuple[Any, ...]]:
        keys = [self.key(r) for r in rows]
        return keys if ordered or bag else list(dict.fromkeys(keys))  # as a set: once each


class _Search:
    """Which of got's columns stands for each gold column, chosen one column at a time."""

    def __init__(self, got: list[tuple[Any, ...]], want: list[tuple[Any, ...]], ordered: bool) -> None:
        self.got, self.want, self.ordered = got, want, ordered
        held = [Counter(c) for c in got]
        self.options = [[j for j, h in enumerate(held) if h == Counter(c)] for c in want]
        self.cells = _SEARCH_CELLS

    def order(self, chosen: list[int]) -> list[int] | None:
        if len(chosen) == len(self.want):
            return chosen
        tried: list[int] = []
        for j in self.options[len(chosen)]:
            if j in chosen or any(self.got[j] == self.got[t] for t in tried):
                continue
            tried.append(j)
            if self._agree([*chosen, j]) and (found := self.order([*chosen, j])):
                return found
        return None

    def _agree(self, chosen: list[int]) -> bool:
        """The chosen columns hold the gold's first ones, row for row (in any row order
        unless ordered). A column with one option left is checked with the next choice."""
        last = len(chosen) == len(self.want)
        if not last and len(self.options[len(chosen) - 1]) == 1:
            return True
        self.cells -= len(self.want[0]) * len(chosen)
        if self.cells < 0:  # a search this long: no order found (a fail), not minutes spent
            return False
        got = list(zip(*(self.got[j] for j in chosen), strict=True))
        want = list(zip(*self.want[:len(chosen)], strict=True))
        return got == want if self.ordered else Counter(got) == Counter(want)


class SqlResultMatch(Check):
    factory = "sql_result_match"

    def warm(self) -> None:
        import sqlglot  # noqa: F401  (reads the gold query's ORDER BY)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_gold", "_gold_bytes")}

    @sql_read
    def evaluate(self, evaluated_model_gold_answer: str = "",
                 evaluated_model_output: str = "") -> EvaluationResult:
        want = self._gold_rows(evaluated_model_gold_answer)
        try:
            got = execute(self.options["database"], sql_text(evaluated_model_output),
                          self.options["limits"], self.options["dialect"])[0]
        except (SandboxUnavailable, ConfigError):  # it never ran: the evaluator's error
            raise
        except Exception as exc:  # the database's or the sandbox's word: the query is wrong, a finding
            return verdict(False, f"the query failed: {type(exc).__name__}: {cut(str(exc), 300)}")
        rows = _Rows(self.options["float_tolerance"])
        ordered = _ordered(evaluated_model_gold_answer, self.options["dialect"])
        same, got, order = self._compare(rows, got, want, ordered)
        facts: dict[str, Any] = {"rows_expected": len(want), "rows_got": len(got), "ordered": ordered,
                                 "row_overlap": round(rows.overlap(got, want), 6)}
        if same:
            return verdict(True, **facts | ({"column_order": order} if order else {}))
        return verdict(False, f"expected {len(want)} rows {_first(want)}, got {len(got)} rows "
                       f"{_first(got)}" + (" (in order)" if ordered else ""), **facts)

    def _compare(self, rows: _Rows, got: list[tuple[Any, ...]], want: list[tuple[Any, ...]],
                 ordered: bool) -> tuple[bool, list[tuple[Any, ...]], list[int] | None]:
        """Whether the rows are the gold's, the rows (their columns in the gold's order when
        that is what matched) and that order (None: as they came)."""
        bag = self.options["compare"] == "bag"
        if (same := rows.same(got, want, ordered, bag)) or self.options["column_order"] == "strict":
            return same, got, None
        order = rows.column_order(got, want, ordered, bag)
        if order is None:
            return False, got, None
        arranged = [tuple(r[j] for j in order) for r in got]
        return rows.same(arranged, want, ordered, bag), arranged, order

    def _gold_rows(self, gold: str) -> list[tuple[Any, ...]]:
        kept: dict[str, list[tuple[Any, ...]]] = self.__dict__.setdefault("_gold", {})
        if gold not in kept:
            try:
                rows, size = execute(self.options["database"], gold, self.options["limits"],
                                     self.options["dialect"])
            except (SandboxUnavailable, ConfigError):  # not the gold query's fault
                raise
            except Exception as exc:
                fix = ("raise max_rows=/max_bytes= or fix" if isinstance(exc, ResultTooLarge)
                       else "fix")
                raise DatasetError(f"sql_result_match: the gold query fails on "
                                   f"{self.options['database'].described}: {type(exc).__name__}: "
                                   f"{exc}. {fix.capitalize()} the dataset's "
                                   "evaluated_model_gold_answer.") from None
            held = self.__dict__.get("_gold_bytes", 0) + size
            if len(kept) >= _GOLD_KEPT or held > _GOLD_BYTES:
                kept.clear()
                held = size
            kept[gold], self.__dict__["_gold_bytes"] = rows, held
        return kept[gold]


def sql_result_match(database: str | Path | Connect, *, float_tolerance: float = 1e-6,
                     compare: str = "set", column_order: str = "ignore", engine: str | None = None,
                     dialect: str = "sqlite", timeout: float = 10.0, max_rows: int = MAX_ROWS,
                     max_bytes: int = MAX_BYTES, **step: Any) -> SqlResultMatch:
    """The output query returns the same rows as the gold query.

    ``database``: a SQLite or DuckDB file (``.duckdb``/``.ddb``: DuckDB, which needs the
    ``duckdb`` package), a schema script (a ``.sql`` file, or SQL text with ``CREATE
    TABLE``; ``engine="duckdb"`` runs it in DuckDB) or a function returning a new DB-API
    connection. Both queries run in a sandbox (`sql_sandbox`): read-only, no files,
    network, extensions or settings, exactly one statement, stopped at ``timeout``
    seconds, at most ``max_rows`` rows and ``max_bytes`` bytes (Python's size of the rows);
    past any of them the row fails, saying which. The user's file never changes.
    Rows compare as a set (``compare="bag"``: duplicates count too), in order only when the
    gold query has a top-level ``ORDER BY``; numbers equal within ``float_tolerance``
    (relative or absolute); columns in any order (``column_order="ignore"``, as Spider's
    test-suite evaluation: which column comes first is rarely the question; ``"strict"``:
    in the gold's order, as BIRD compares tuples). A gold query that fails is that row's
    error. A query in a Markdown code fence (```sql ... ```) is read from it.
    Score 1 or 0; the metadata has both row counts, the rows' overlap (Jaccard) and, when
    the columns matched in another order, that order (``column_order``: the output's
    column for each gold column).
    """
    owner = "sql_result_match"
    check_choice(owner, "compare", compare, ("set", "bag"))
    check_choice(owner, "column_order", column_order, ("ignore", "strict"))
    if engine is not None:
        check_choice(owner, "engine", engine, ("sqlite", "duckdb"))
    limits = Limits(check_number(owner, "timeout", timeout, low=0.001), _count(owner, "max_rows", max_rows),
                    _count(owner, "max_bytes", max_bytes))
    options = {"database": Database(database, engine), "compare": compare, "dialect": dialect,
               "column_order": column_order, "limits": limits,
               "float_tolerance": check_number(owner, "float_tolerance", float_tolerance)}
    return SqlResultMatch(options, "returns the gold query's rows", step)


def _count(owner: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{owner}: {name} must be a whole number >= 1, not {value!r}.")
    return value


class SqlEquivalent(Check):
    factory = "sql_equivalent"

    def warm(self) -> None:
        from sqlglot.optimizer import optimize  # noqa: F401

    @sql_read
    def evaluate(self, evaluated_model_gold_answer: str = "",
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
