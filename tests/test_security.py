"""The security suite: every attack this package defends against, as a test that fails on
code that does not defend against it. The threat model is the README's "Security" section:
model output, datasets and names are untrusted input; the server asks who you are.

Sections (each owned by one part of the defence): the SQL sandbox, Markdown this package
writes, the server's authentication, names and other input.
"""

from __future__ import annotations

# ---------------------------------------------------------------------------------------
# 1. The SQL sandbox: sql_result_match runs the model's query with no files, network,
#    extensions or settings, one statement, within its timeout and result caps.
# ---------------------------------------------------------------------------------------
import hashlib
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from patronus_tasks import DatasetError
from patronus_tasks.evaluators import sql_result_match

SHOP = ("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT, qty INTEGER);"
        "INSERT INTO orders VALUES (1, 'pen', 2), (2, 'desk', 1), (3, 'lamp', 4);")
COUNT = "SELECT count(*) FROM orders"


class UserFiles:
    """The user's own databases, each hashed: a test ends by checking none changed."""

    def __init__(self, folder: Path) -> None:
        self.sqlite, self.duckdb = folder / "shop.db", folder / "shop.duckdb"
        with sqlite3.connect(self.sqlite) as conn:
            conn.executescript(SHOP)
        conn.close()
        duckdb = pytest.importorskip("duckdb")
        with duckdb.connect(str(self.duckdb)) as conn:
            conn.execute(SHOP)
        self.hashes = self.hash()

    def hash(self) -> dict[str, str]:
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(self.sqlite.parent.iterdir()) if p.name.startswith("shop.")}


@pytest.fixture
def user(tmp_path: Path) -> Iterator[UserFiles]:
    files = UserFiles(tmp_path)
    yield files
    assert files.hash() == files.hashes  # the user's files, byte for byte (and no new ones)


def run(check: Any, query: str, gold: str = COUNT) -> Any:
    return check.evaluate(evaluated_model_gold_answer=gold, evaluated_model_output=query)


def test_duckdb_query_reads_no_file_nor_the_environment(user: UserFiles, tmp_path: Path) -> None:
    """Issue 48: read_text('/proc/self/environ') put OPENAI_API_KEY into the explanation
    (so into results.parquet, the report and the Prefect UI); read_csv('/etc/passwd') rows
    showed there too."""
    secrets = tmp_path / "secrets.env"
    secrets.write_text("OPENAI_API_KEY=sk-sandbox-secret-1234\n")
    check = sql_result_match(user.duckdb)
    for query in [f"SELECT content FROM read_text('{secrets}')",
                  "SELECT regexp_extract(content, 'PATH=[^\\x00]*') FROM read_text('/proc/self/environ')",
                  "SELECT * FROM read_csv('/etc/passwd', header = false)",
                  "SELECT * FROM glob('/etc/*')", "SELECT * FROM 'http://127.0.0.1:9/x.csv'"]:
        result = run(check, query)
        assert not result.pass_
        assert "file system operations are disabled" in result.explanation, (query, result.explanation)
        for leaked in ("sk-sandbox-secret", os.environ["PATH"].split(":")[0], "root:x:0:"):
            assert leaked not in result.explanation, result.explanation


def test_duckdb_query_writes_no_file(user: UserFiles, tmp_path: Path) -> None:
    """Issue 48: COPY (SELECT 'import os; ...') TO '<venv>/site-packages/x.pth' made the
    next Python start run code."""
    site = tmp_path / "site-packages"
    site.mkdir()
    check = sql_result_match(user.duckdb)
    for query in [f"COPY (SELECT 'import os') TO '{site}/x.pth' (HEADER false)",
                  f"EXPORT DATABASE '{site}/dump'", "INSTALL httpfs", "LOAD httpfs",
                  "SET enable_external_access = true", "CHECKPOINT"]:
        result = run(check, query)
        assert not result.pass_ and "the sandbox runs a query" in result.explanation, result.explanation
    assert list(site.iterdir()) == []


def test_duckdb_query_leaves_the_users_file_alone(user: UserFiles) -> None:
    """Issue 48: `ATTACH '<the user's file>' AS orig; DELETE FROM orig.orders; SELECT ...`
    emptied the user's own database, and the row still passed."""
    check = sql_result_match(user.duckdb)
    attack = f"ATTACH '{user.duckdb}' AS orig; DELETE FROM orig.orders; SELECT 3"
    result = run(check, attack)
    assert not result.pass_ and "3 statements: the sandbox runs exactly one" in result.explanation
    result = run(check, f"ATTACH '{user.duckdb}' AS orig")
    assert not result.pass_ and "a ATTACH statement" in result.explanation
    assert not run(check, "DELETE FROM orders").pass_
    assert run(check, "SELECT 3").pass_  # the data as it was


def test_sqlite_query_writes_no_file_and_changes_no_setting(user: UserFiles, tmp_path: Path) -> None:
    """Issue 48: on SQLite, VACUUM INTO '/any/path' and ATTACH still wrote files; a PRAGMA
    could lift the sandbox's own heap limit."""
    out = tmp_path / "out"
    out.mkdir()
    for database in (user.sqlite, SHOP):
        check = sql_result_match(database)
        for query, refused in [(f"VACUUM INTO '{out}/copy.db'", "ATTACH"),
                               (f"ATTACH '{out}/new.db' AS w", "ATTACH"),
                               (f"ATTACH '{user.sqlite}' AS orig", "ATTACH"),
                               ("PRAGMA hard_heap_limit = 0", "PRAGMA hard_heap_limit"),
                               ("PRAGMA query_only = 0", "PRAGMA query_only"),
                               ("DELETE FROM orders", "DELETE orders"),
                               ("CREATE TEMP TABLE t AS SELECT 1", ""),  # its first step
                               ("SELECT fts3_tokenizer('simple')", "FUNCTION fts3_tokenizer")]:
            result = run(check, query)
            assert not result.pass_
            assert f"the sandbox refused {refused}" in result.explanation, (query, result.explanation)
        assert run(check, "SELECT 3").pass_
    assert list(out.iterdir()) == []
    assert sqlite3.connect(":memory:").execute("PRAGMA hard_heap_limit").fetchone()[0] > 0


def test_one_statement_on_each_engine(user: UserFiles) -> None:
    for database in (user.sqlite, user.duckdb, SHOP):
        result = run(sql_result_match(database), "SELECT 3; SELECT 3")
        assert not result.pass_ and "the sandbox runs exactly one" in result.explanation, result.explanation


def test_a_huge_value_fails_at_once() -> None:
    """Issue 48: SELECT zeroblob(900000000) with timeout=3 ran 40.7 s and peaked at 7.8 GB."""
    result = run(sql_result_match(SHOP, timeout=3), "SELECT zeroblob(900000000)", "SELECT 1")
    assert not result.pass_ and "a value longer than 33,554,432 bytes (max_bytes=)" in result.explanation
    result = run(sql_result_match(SHOP, max_bytes=2 << 20), "SELECT hex(randomblob(2000000))", "SELECT 1")
    assert not result.pass_ and "a value longer than 2,097,152 bytes" in result.explanation


def test_the_timeout_holds_inside_one_call_no_interrupt_reaches() -> None:
    """SQLite 3.40's printf('%.*c', N, 'x') appends N characters one by one, long after
    the length limit refused them, inside one call that neither an interrupt nor the
    progress handler reaches: the row fails at its timeout all the same."""
    result = run(sql_result_match(SHOP, timeout=0.2), "SELECT printf('%.*c', 100000000, 'x')", "SELECT 1")
    assert not result.pass_ and "ran past its 0.2 s (timeout=)" in result.explanation, result.explanation


def test_results_are_capped_while_read(user: UserFiles) -> None:
    """Issue 48: DuckDB's SELECT * FROM range(200000000) took 4.6 GB, an endless recursive
    CTE 1 GB: rows are counted and sized as they are read."""
    endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c"
    result = run(sql_result_match(user.duckdb), "SELECT * FROM range(200000000)")
    assert not result.pass_ and "more than max_rows=100,000 rows" in result.explanation
    result = run(sql_result_match(user.sqlite, max_rows=10_000), endless)
    assert not result.pass_ and "more than max_rows=10,000 rows" in result.explanation
    wide = "SELECT randomblob(1000) FROM (" + endless + " LIMIT 5000)"
    result = run(sql_result_match(user.sqlite, max_bytes=1_000_000), wide)
    assert not result.pass_ and "more than max_bytes=1,000,000 bytes in its first 9" in result.explanation
    assert run(sql_result_match(user.sqlite, max_rows=3), "SELECT 3").pass_


def test_the_gold_query_runs_with_the_same_limits(user: UserFiles) -> None:
    check = sql_result_match(user.sqlite, max_rows=2)
    with pytest.raises(DatasetError, match=r"the gold query fails .*max_rows=2 rows\. Raise max_rows="):
        run(check, "SELECT 1", "SELECT * FROM orders")
    with pytest.raises(DatasetError, match="the sandbox refused ATTACH"):
        run(check, "SELECT 1", f"ATTACH '{user.sqlite}' AS again")


def test_a_factorys_sqlite_or_duckdb_connection_gets_its_engines_sandbox(user: UserFiles) -> None:
    """The user's own read-write connection: the sandbox is on top of it."""
    duckdb = pytest.importorskip("duckdb")

    def sqlite_rw() -> sqlite3.Connection:
        return sqlite3.connect(user.sqlite, isolation_level=None)  # autocommit: a DELETE would stay

    def duckdb_rw() -> Any:
        return duckdb.connect(str(user.duckdb))

    for factory, refused in [(sqlite_rw, "the sandbox refused DELETE"), (duckdb_rw, "a DELETE statement")]:
        check = sql_result_match(factory)
        result = run(check, "DELETE FROM orders")
        assert not result.pass_ and refused in result.explanation, result.explanation
        assert run(check, "SELECT 3").pass_
    result = run(sql_result_match(duckdb_rw), "SELECT * FROM read_text('/etc/hostname')")
    assert not result.pass_ and "file system operations are disabled" in result.explanation


# (end of the SQL sandbox section)



# ---------------------------------------------------------------------------------------
# 2. Untrusted text is text in every Markdown this package writes.
# ---------------------------------------------------------------------------------------


# (end of the Markdown section)



# ---------------------------------------------------------------------------------------
# 3. A server that asks who you are.
# ---------------------------------------------------------------------------------------


# (end of the server section)



# ---------------------------------------------------------------------------------------
# 4. Names cannot collide; the report's template; credentials in URLs; huge datasets.
# ---------------------------------------------------------------------------------------


# (end of the names section)
