"""The security suite: every attack this package defends against, as a test that fails on
code that does not defend against it. The threat model is the README's "Security" section:
model output, datasets and names are untrusted input; the server asks who you are.

Sections (each owned by one part of the defence): the SQL sandbox, Markdown this package
writes, the server's authentication, names and other input, the terminal.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from patronus_tasks import DatasetError
from patronus_tasks.evaluators import sql_result_match

# ---------------------------------------------------------------------------------------
# 1. The SQL sandbox: sql_result_match runs the model's query with no files, network,
#    extensions or settings, one statement, within its timeout and result caps.
# ---------------------------------------------------------------------------------------

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


_HUGE = """
import json, os, resource, sys, time
from patronus_tasks.evaluators.sql import Database, run_query
db = Database("CREATE TABLE t (x INT);", "duckdb")
run_query(db, "SELECT 1")  # the worker started
start = time.perf_counter()
try:
    said = repr(run_query(db, "SELECT repeat('x', 2000000000)", timeout=2))
except Exception as exc:
    said = f"{type(exc).__name__}: {exc}"
took = time.perf_counter() - start
assert run_query(db, "SELECT 42") == [(42,)]
cpu = time.process_time()
time.sleep(0.5)  # a call still running here would go on allocating
busy = time.process_time() - cpu
workers = getattr(getattr(db, "local", lambda: None)(), "workers", None)
if workers is not None:
    workers.close()  # reaped: their peak is in RUSAGE_CHILDREN
peak = [resource.getrusage(w).ru_maxrss << 10 for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
print(json.dumps([said, took, busy, *peak]), flush=True)
os._exit(0)  # not waiting for a thread still inside DuckDB
"""


def test_a_huge_duckdb_value_fails_within_the_workers_memory() -> None:
    """Issue 48.1: DuckDB built repeat('x', 2000000000) outside its memory_limit: ~4 GB
    and ~9-25 s inside one call, in the experiment's process. In a worker capped at
    2 GiB of address space it is the row's fail, and nothing grows past the cap."""
    pytest.importorskip("duckdb")
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _HUGE], capture_output=True, text=True, timeout=60,
                         env={k: v for k, v in os.environ.items() if not k.startswith("PATRONUS_TASKS_SQL")})
    said, took, busy, own, workers = json.loads(out.stdout.splitlines()[-1])
    assert said.startswith("ResultTooLarge: past its worker's memory limit, 2 GiB "
                           "(PATRONUS_TASKS_SQL_WORKER_MEMORY)") or "ran past its 2 s" in said, said
    assert took < 3 and busy < 0.1, (took, busy)
    assert own < 300 << 20, own  # the value never reaches this process (~170 MB: DuckDB loaded)
    assert workers < 2 << 30, workers


def test_a_duckdb_query_past_its_timeout_inside_one_call_is_killed() -> None:
    """list_sort over 30 million values runs ~10 s inside one call no interrupt reaches:
    the row fails at its timeout, its worker is killed (no CPU spent on it after), and
    the next query gets a fresh worker."""
    pytest.importorskip("duckdb")
    import time

    check = sql_result_match("CREATE TABLE t (x INT);", engine="duckdb", timeout=0.5)
    assert run(check, "SELECT 42", "SELECT 42").pass_  # its worker started
    result = run(check, "SELECT length(list_sort(range(30000000))::VARCHAR)", "SELECT 1")
    assert not result.pass_
    killed = "ran past its 0.5 s (timeout=), its worker process killed"
    assert killed in result.explanation, result.explanation
    cpu = time.process_time()
    time.sleep(0.5)
    assert time.process_time() - cpu < 0.1  # nothing of the query left running here
    assert run(check, "SELECT 42", "SELECT 42").pass_


# (end of the SQL sandbox section)



# ---------------------------------------------------------------------------------------
# 2. Untrusted text is text in every Markdown this package writes.
# ---------------------------------------------------------------------------------------


#: A space of Unicode's (Zs): where markdown-it sees a space.
_ZS = "\u2000"


def _render(markdown: str) -> str:
    """HTML of ``markdown`` by a CommonMark renderer apart from this package's code and
    the UIs' (markdown-it-py, rich's), raw HTML on, GFM's tables and strikethrough on.
    The UIs' renderers (marked, micromark) take JavaScript's spaces (``\\s``), U+FEFF
    among them; markdown-it takes Unicode's: it gets one of those in its place."""
    from markdown_it import MarkdownIt

    from patronus_tasks.report.markdown import ZWNBSP

    renderer = MarkdownIt("commonmark").enable(["table", "strikethrough"])
    return renderer.render(markdown.replace(ZWNBSP, _ZS))


#: What model text, datasets and names may hold: images that call home, javascript:
#: links (inline, by reference, as HTML, behind an entity), raw HTML, autolinks, and text
#: that is Markdown by accident (issue 50: COUNT(*) twice turned the text italic).
HOSTILE_MARKDOWN = [
    "![t](http://127.0.0.1:9/track.png)", "[clickme](javascript:alert(1))",
    '<img src="http://127.0.0.1:9/x.png"> <a href="javascript:alert(1)">x</a>',
    "[a][1]\n\n[1]: javascript:alert(1)", "[x](&#106;avascript:alert(1)) &#106; &amp;",
    "<http://127.0.0.1:9/angle> <me@example.com>", "SELECT COUNT(*) FROM t WHERE COUNT(*) > 1",
    "*a* _b_ __c__ ~~d~~ `e` a_snake_case_name", "# heading", "- item", "+ item", "1. item",
    "2) item", "> quote", "---", "```\ncode\n```", "    indented", "a | b | c", "back\\slash\\",
    "\\*not escaped\\*", "line one\n\n\nline two  \nthree", "<!-- comment --> <script>x</script>",
    "!", "[", "]", "*", "_", "`", "<", "&", "|", "\\", ""]
#: Text GFM links by itself (GFM in v2 finds it after escapes are undone).
AUTOLINKED = ["see http://127.0.0.1:9/bare now", "https://x.example.com/a?b=1", "www.example.com",
              "WWW.Example.org/x", "ftp://files.example.com/f", "mail me@example.com", "x@y.co"]


def _shown(html: str) -> str:
    """The characters ``html`` shows, word joiners aside."""
    import html as _html
    import re

    from patronus_tasks.report.markdown import plain

    return plain(_html.unescape(re.sub(r"<[^>]+>", "", html))).replace(_ZS, "").strip()


def _gfm_links(markdown: str) -> list[str]:
    """What the UIs' GFM would link in ``markdown`` by itself: v2's remark-gfm finds
    URLs and e-mails in text after escapes are undone (its regexes), v1's marked where
    its tokenizer stands (its regexes)."""
    import re

    undone = re.sub(r"\\(.)", r"\1", markdown)
    patterns = [r"(https?://|www(?=\.))([-.\w]+)([^ \t\r\n]*)", r"([-.\w+]+)@([-\w]+(?:\.[-\w]+)+)",
                r"((?:ftp|https?)://|www\.)(?:[a-zA-Z0-9\-]+\.?)+[^\s<]*",
                r"[A-Za-z0-9._+-]+@[a-zA-Z0-9-_]+(?:\.[a-zA-Z0-9-_]*[a-zA-Z0-9])+"]
    return [m.group() for p in patterns for m in re.finditer(p, undone, re.IGNORECASE)]


def test_untrusted_text_renders_as_its_characters_and_nothing_else() -> None:
    from patronus_tasks.report.markdown import fold, text

    for hostile in HOSTILE_MARKDOWN + AUTOLINKED:
        html = _render(text(hostile))
        assert html in ("", f"<p>{html[3:-5]}</p>\n"), (hostile, html)  # one paragraph
        assert "<" not in html[3:-5], (hostile, html)  # no element: no link, image, emphasis
        assert _shown(html) == fold(hostile), (hostile, html)  # the characters, as given
    assert text("COUNT(*) and COUNT(*)") == "COUNT(\\*) and COUNT(\\*)"  # no italics (issue 50)
    assert text("a_snake_case_name") == "a_snake_case_name"  # inside a word: no emphasis


def test_urls_and_addresses_in_untrusted_text_are_not_linked_by_gfm() -> None:
    from patronus_tasks.report.markdown import text

    assert _gfm_links("http://x.example.com www.example.com me@example.com")  # the check sees them
    for hostile in AUTOLINKED + HOSTILE_MARKDOWN:
        assert _gfm_links(text(hostile)) == [], hostile


def test_a_table_cell_is_one_cell_of_text() -> None:
    from patronus_tasks.report.cells import markdown_table
    from patronus_tasks.report.markdown import fold

    for hostile in HOSTILE_MARKDOWN:
        html = _render("\n".join(markdown_table([{"h | <b>": hostile, "n": 1}])))
        cells = html.split("<td>")[1:]
        assert len(cells) == 2 and "<" not in cells[0].split("</td>")[0], (hostile, html)
        assert _shown(cells[0].split("</td>")[0]) == fold(hostile)[:119] + "…" * (len(fold(hostile)) > 120)
        assert "<th>h | &lt;b&gt;</th>" in html  # the header too


def test_link_texts_and_code_spans_hold_text() -> None:
    from patronus_tasks.report.markdown import code, fold, link

    for hostile in HOSTILE_MARKDOWN + AUTOLINKED:
        html = _render(f"see {link(hostile, '/runs/task-run/1')} and {code(hostile)}")
        assert html.count("<a ") == 1 and '<a href="/runs/task-run/1">' in html, (hostile, html)
        label, rest = html.split('<a href="/runs/task-run/1">')[1].split("</a>", 1)
        assert "<" not in label and _shown(label) == fold(hostile), (hostile, html)
        inside = rest.split("<code>")[1].split("</code>")[0] if fold(hostile) else ""
        assert _shown(inside) == fold(hostile), (hostile, html)


def test_a_table_artifact_cell_carries_invisible_marks_only() -> None:
    """A table artifact's cell is Markdown in v1 (each cell its own document) and text in
    v2: no backslash may show, so its constructs are broken by invisible marks."""
    from patronus_tasks.report.markdown import ZWNBSP, fold, inert, plain

    for hostile in HOSTILE_MARKDOWN + AUTOLINKED:
        cell = inert(hostile)
        assert plain(cell) == fold(hostile), hostile  # nothing visible added
        html = _render(cell)
        for tag in ("<a ", "<img", "<em", "<strong", "<s>", "<h1", "<ul", "<ol", "<blockquote",
                    "<hr", "<pre", "<script", "<!--", "<table", "&#"):
            assert tag not in html, (hostile, tag, html)
        assert _gfm_links(cell.replace(ZWNBSP, "")) == [], hostile
    assert inert(3) == 3 and inert(None) is None and inert("66.7%") == "66.7%"


def test_a_series_is_found_by_its_escaped_name_and_by_its_name_from_before() -> None:
    """The results link's description names its series (escaped now): the next run of the
    series finds it, a link written before this escaping too, another series' not."""
    from patronus_tasks.prefect.ui.artifacts import results_description
    from patronus_tasks.prefect.ui.asking import _of_series

    series = "flow/*nightly* <b>/proj_"
    for said in (results_description("p/x", series), f"p/x: Parquet results (series {series})"):
        assert _of_series({"description": said}, series)  # the artifact as the API's JSON
        assert not _of_series({"description": said}, "flow/nightly/proj")


def test_every_markdown_of_an_experiment_links_only_where_this_package_does(tmp_path) -> None:
    """The -report, -vs-previous, -charts and the parent run's markdown, and the
    artifacts' descriptions, of two runs whose names, sample ids, errors and explanations
    are hostile: every link, image and element is this package's own."""
    import re

    from patronus_tasks import EvaluationResult, evaluator, run_experiment, task
    from patronus_tasks.prefect.ui import artifacts, charts, series
    from patronus_tasks.results.compare import compare_experiments

    name = "judge ![e](http://127.0.0.1:9/e.png) <b>x</b> [l](javascript:alert(1))"

    @task(name="answer <img src=http://127.0.0.1:9/t.png>")
    def answer(evaluated_model_input: str) -> str:
        if evaluated_model_input == "boom":
            raise ValueError(HOSTILE_MARKDOWN[2])
        return evaluated_model_input

    def run(wrong: set[str], experiment: str):
        @evaluator(name=name)
        def judge(evaluated_model_output: str) -> EvaluationResult:
            return EvaluationResult(pass_=evaluated_model_output not in wrong,
                                    explanation=HOSTILE_MARKDOWN[0])

        sids = ["[s](javascript:alert(1))", "<img src=http://127.0.0.1:9/s.png>", "COUNT(*)"]
        data = [{"sid": s, "evaluated_model_input": "boom" if i == 2 else s} for i, s in enumerate(sids)]
        return run_experiment("proj <img src=http://127.0.0.1:9/p.png>", data=data, task=answer,
                              evaluators=[judge], experiment_name=experiment, backend="local",
                              results_dir=tmp_path, print_summary=False, html_report=False)

    before, now = run(set(), "before ![b](http://127.0.0.1:9/b.png)"), run(
        {"[s](javascript:alert(1))", "<img src=http://127.0.0.1:9/s.png>"}, "now [n](javascript:x)")
    title = f"{now.info.project}/{now.name}"
    summary, df = now.summary(), now.to_dataframe(artifacts.REPORT_COLUMNS)
    comparison = compare_experiments(before, now)
    ids = {r: "0000" for r in series.regressed_task_runs(comparison) + artifacts.shown_task_runs(df)}
    previous = series.PreviousRun(str(before.results_path), "1111")
    written = {
        "report": artifacts.report_markdown(title, summary, df, str(now.results_path), now, ids),
        "vs-previous": series.comparison_markdown(title, comparison, previous, ids),
        "charts": charts.charts_markdown(title, now, summary, dict.fromkeys(
            ("rates", "scores", "comparison")), [], now.results_path),
        "parent": charts.parent_markdown(title, now, summary, None, None, "2222"),
        "descriptions": "\n\n".join([artifacts.results_description(title, now.info.series),
                                      artifacts.description(title, summary.headline()),
                                      artifacts.description(title, series.headline(comparison))]),
    }
    assert ids and "**Worse**" in written["vs-previous"]  # the rows that got worse are linked
    for kind, markdown in written.items():
        html = _render(markdown)
        hrefs = re.findall(r'<a href="([^"]*)"', html)
        assert all(h.startswith(("/runs", "file:")) for h in hrefs), (kind, hrefs)
        assert "<img" not in html and "<b>" not in html and "<em>" not in html, (kind, html)
        assert "javascript:" not in "".join(hrefs) and "127.0.0.1" not in "".join(hrefs), kind
        # (neither UI links a URL inside a link's text)
        outside = re.sub(r"\[(?:\\.|[^\]\\])*\]\((?:/runs|file:)[^)]*\)", "", markdown)
        assert _gfm_links(outside) == [], (kind, _gfm_links(outside))


class _Served:
    """A ``Handler`` served on 127.0.0.1 from a thread of this process, at ``url``."""

    def _serve(self, handler: type) -> None:
        import http.server
        import threading

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Beacon(_Served):
    """An HTTP server on 127.0.0.1 that notes every request: what a browser fetched of the
    URLs hostile text named."""

    def __init__(self) -> None:
        import http.server

        self.seen: list[str] = []
        seen = self.seen

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append(self.path)
                self.send_response(404)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._serve(Handler)


class _UI(_Served):
    """Prefect's two UIs (their bundles, as its server serves them: v1 at /, v2 at /v2,
    each page's address answered with its index.html) for the server at ``api_url``, from
    a thread of this process: the session's server serves no UI (it spares the suite
    copying the UI's files), and Prefect's UI application would cost ~4 s of imports."""

    PLACEHOLDER = b"/PREFECT_UI_SERVE_BASE_REPLACE_PLACEHOLDER"

    def __init__(self, api_url: str) -> None:
        import http.server
        import json
        import mimetypes
        from pathlib import Path

        import prefect

        settings = json.dumps({"api_url": api_url, "csrf_enabled": False, "auth": None, "flags": [],
                               "default_ui": "v2", "available_uis": ["v1", "v2"],
                               "v1_base_url": "/", "v2_base_url": "/v2"}).encode()
        bundles = [("/v2", Path(prefect.__ui_v2_static_path__)), ("", Path(prefect.__ui_static_path__))]

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                if path.endswith("/ui-settings"):
                    return self._send(settings, "application/json")
                base, root = next((b, r) for b, r in bundles if path.startswith(b + "/"))
                file = root / path[len(base):].lstrip("/")
                if not file.is_file() or root not in file.resolve().parents:
                    file = root / "index.html"
                kind = mimetypes.guess_type(file.name)[0] or "application/octet-stream"
                return self._send(file.read_bytes().replace(_UI.PLACEHOLDER, base.encode()), kind)

            def _send(self, body: bytes, kind: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._serve(Handler)


def _pictures(beacon: str, field: str) -> str:
    """Text that loads images from ``beacon`` (named after ``field``) and links javascript:,
    in the first 120 characters (what a table cell of the -report shows)."""
    return (f"COUNT(*) COUNT(*) ![b]({beacon}/{field}.png) [js](javascript:alert(1)) "
            f"<img src={beacon}/{field}-h.png>")


def _links(beacon: str, field: str) -> str:
    """Text that is a javascript: link in HTML, then links by itself."""
    return (f"<a href=javascript:alert(2)>a</a> {beacon}/{field}-bare <{beacon}/{field}-a> "
            "www.example.com me@example.com")


#: What each UI's page shows of an artifact: its data and its description.
_CONTENT = {"v1": ".artifact-data-markdown, .artifact-data-table, .artifact-description",
            "v2": ".prose, [data-testid=table-display], .my-2"}

_SEEN = """(() => {
  const roots = [...document.querySelectorAll(%r)];
  const inside = s => roots.flatMap(r => [...r.querySelectorAll(s)]);
  return {text: roots.map(r => r.innerText).join('\\n').replace(/[\\u2060\\ufeff]/g, ''),
          links: inside('a').map(a => a.getAttribute('href')),
          marks: inside('em, del, s, img, iframe, script, blockquote').map(e => e.outerHTML.slice(0, 80)),
          js: [...document.querySelectorAll('a')].map(a => a.href).filter(h => /^\\s*javascript:/i.test(h))};
})()"""


#: Where each UI's page shows an artifact's description.
_DESCRIPTION = {"v1": ".artifact-description", "v2": ".my-2"}


def _text_of(where: str) -> str:
    """A JavaScript expression: the text of what ``where`` selects."""
    return f"[...document.querySelectorAll({where!r})].map(r => r.innerText).join(' ')"


def _open(b, url: str, ready: str, shot) -> None:
    """Open ``url`` in browser ``b`` until ``ready`` (a JavaScript expression) holds; a
    screenshot to ``shot`` either way."""
    b.open(url)
    try:
        b.wait_for(ready, timeout=90)
    finally:
        b.screenshot(shot, full=True)


def _run_hostile(beacon: str, results_dir) -> tuple[dict[str, str], str]:
    """One experiment on the session's server whose every untrusted part is hostile: its
    -report, -summary and -history artifacts' ids, and the id of its verdict's task run."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from patronus_tasks import EvaluationResult, evaluator, run_experiment, task
    from patronus_tasks.prefect.ui.keys import artifact_key

    from .conftest import RECORDED_WITHIN
    from .waits import task_runs_with_states

    @task(name=f"answer <img src={beacon}/task.png>")
    def answer(evaluated_model_input: str) -> str:
        if evaluated_model_input == "boom":
            raise ValueError(_links(beacon, "er"))
        return _pictures(beacon, "out") + _links(beacon, "out")

    @evaluator(name=f"judge <img src={beacon}/ev.png> [e](javascript:alert(1)) *it*")
    def judge(evaluated_model_output: str) -> EvaluationResult:
        return EvaluationResult(pass_=False, explanation=_pictures(beacon, "ex"))

    data = [{"sid": f"s1 *it* ![s]({beacon}/sid.png)", "evaluated_model_input": "q",
             "evaluated_model_gold_answer": _links(beacon, "gold"),
             f"<img src={beacon}/column.png>": _pictures(beacon, "col")},
            {"sid": "s2", "evaluated_model_input": "boom"}]
    exp = run_experiment(f"sec <img src={beacon}/project.png>", data=data, task=answer,
                         evaluators=[judge], print_summary=False, results_dir=results_dir,
                         experiment_name=f"x ![x]({beacon}/experiment.png) [n](javascript:x) _it_",
                         tags={"t": f"<img src={beacon}/tag.png>"})
    assert exp.wait_recorded(RECORDED_WITHIN)
    keys = {artifact_key(exp.info.series, k): k for k in ("report", "summary", "history")}

    async def ids() -> tuple[dict[str, str], str]:
        async with get_client() as client:
            found = await client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=list(keys))))
            runs = await task_runs_with_states(client, exp.manifest["flow_run_id"])
        verdict = next(r for r in runs if r.name.startswith("(x) judge"))
        return {keys[str(a.key)]: str(a.id) for a in found}, str(verdict.id)

    return asyncio.run(ids())


def test_hostile_rows_fetch_nothing_and_link_no_javascript_in_either_prefect_ui(
        prefect_server: str, tmp_path) -> None:
    """One experiment on the session's server whose outputs, explanations, errors, names,
    tags and dataset columns carry image beacons, javascript: links, raw HTML and
    autolinks; its -report, -summary and -history pages and its verdict's task run in
    both of Prefect's UIs, in Chromium: nothing fetched from the beacon, no javascript:
    link, the artifacts' own links only, no emphasis, the hostile text shown as written."""
    import time

    from .chromium import Browser, chromium_or_skip

    chromium_or_skip()
    beacon, ui = _Beacon(), _UI(prefect_server)
    try:
        artifacts, verdict = _run_hostile(beacon.url, tmp_path / "results")
        # What each page shows once rendered, besides its description
        ready = {"report": "First failed evaluations", "summary": "pass rate", "history": "started"}
        shown = {"report": "COUNT(*) COUNT(*) ![b](", "summary": "judge <img src=",
                 "history": "x ![x]("}
        started = time.monotonic()
        with Browser(1500, 1100) as b:
            for ui_name, base in (("v1", ""), ("v2", "/v2")):
                for kind in ("report", "summary", "history"):
                    # (v2 has the artifact's raw text on its page before its Markdown is
                    # rendered, and renders its description apart)
                    _open(b, f"{ui.url}{base}/artifacts/artifact/{artifacts[kind]}",
                          f"{_text_of(_CONTENT[ui_name])}.includes({ready[kind]!r}) && "
                          f"{_text_of(_DESCRIPTION[ui_name])}.trim()",
                          tmp_path / f"{ui_name}-{kind}.png")
                    seen = b.js(_SEEN % _CONTENT[ui_name])
                    assert seen["js"] == [], (ui_name, kind, seen["js"])
                    assert all((h or "").startswith(("/runs", "file:")) for h in seen["links"]), (
                        ui_name, kind, seen["links"])
                    assert seen["marks"] == [], (ui_name, kind, seen["marks"])
                    assert shown[kind] in seen["text"], (ui_name, kind, seen["text"])
                    assert "sec <img src=" in seen["text"]  # the description, as written
                # Its log holds the explanation: text in both UIs (Prefect links its URLs)
                _open(b, f"{ui.url}{base}/runs/task-run/{verdict}",
                      "document.body.innerText.includes('Not passed: COUNT(*)')",
                      tmp_path / f"{ui_name}-task-run.png")
                assert b.js(_SEEN % "body")["js"] == []
        took = time.monotonic() - started
        time.sleep(0.5)  # a request on its way
        assert beacon.seen == [], beacon.seen  # no image loaded, no request made
        print(f"8 pages in {took:.1f} s; screenshots in {tmp_path}")
    finally:
        ui.close()
        beacon.close()

# (end of the Markdown section)



# ---------------------------------------------------------------------------------------
# 3. A server that asks who you are.
# ---------------------------------------------------------------------------------------
# One stack for the section: `patronus-tasks server up --no-deploy` (server, pool, worker;
# from the suite's migrated database), started as a user starts it. Its secret is read from
# the file `server up` keeps it in (None on a stack that asks nothing: the code before).


class _Asking:
    def __init__(self, home: Path, api_url: str, shown: str) -> None:
        self.home, self.api_url, self.shown = home, api_url, shown  # shown: what `up` printed
        found = home / "auth-string"
        self.secret = found.read_text().strip() if found.exists() else None


def _server_cli(*args: str, **env: str) -> tuple[int, str, str]:
    """``patronus-tasks server ARGS`` as a user runs it (no API of the suite's): its exit
    code, output and errors."""
    import os
    import subprocess
    import sys

    from .conftest import ROOT

    given = {k: v for k, v in os.environ.items()
             if k not in ("PREFECT_API_URL", "PREFECT_API_AUTH_STRING")}
    ran = subprocess.run([sys.executable, "-m", "patronus_tasks", "server", *args], cwd=ROOT,
                         env={**given, **env}, capture_output=True, text=True, timeout=300)
    return ran.returncode, ran.stdout, ran.stderr


@pytest.fixture(scope="module")
def asking(tmp_path_factory: pytest.TempPathFactory, prefect_template_db: Path) -> Iterator[_Asking]:
    from patronus_tasks.prefect.server.stack import Stack

    from .prefect_servers import copy_database, free_port

    home = tmp_path_factory.mktemp("asking")
    copy_database(prefect_template_db, home)  # a migrated database: spares ~20 s of start-up
    code, shown, errors = _server_cli("up", "--home", str(home), "--port", str(free_port()),
                                      "--no-deploy", "--nice", "0", PREFECT_WORKER_QUERY_SECONDS="1")
    assert code == 0, shown + errors
    stack = Stack.load(home)
    assert stack is not None
    try:
        yield _Asking(home, stack.api_url, shown)
    finally:
        _server_cli("down", "--home", str(home))


def _basic(secret: str) -> dict[str, str]:
    import base64

    return {"Authorization": f"Basic {base64.b64encode(secret.encode()).decode()}"}


def test_an_unauthenticated_request_is_refused(asking: _Asking) -> None:
    import httpx

    from .prefect_servers import asked_headers

    api = asking.api_url
    assert httpx.get(f"{api}/admin/version").status_code == 401
    assert httpx.get(f"{api}/admin/version", headers=_basic("not-it")).status_code == 401
    assert asking.secret is not None, "server up made no auth string"
    assert httpx.get(f"{api}/admin/version", headers=_basic(asking.secret)).status_code == 200
    # A change needs a CSRF token (403 without: checked before who asks), and a token
    # needs the auth string: none to be had without it.
    assert httpx.post(f"{api}/flow_runs/filter", json={}).status_code == 403
    assert httpx.get(f"{api}/csrf-token", params={"client": "c"}).status_code == 401
    asked = asked_headers(api, asking.secret)
    assert httpx.post(f"{api}/flow_runs/filter", json={}, headers=asked).status_code == 200
    assert httpx.get(f"{api}/health").status_code == 200  # a load balancer's probe: anyone


def test_its_websockets_the_ui_and_other_origins_are_asked_too(asking: _Asking) -> None:
    import json

    import httpx
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect
    from websockets.typing import Subprotocol

    api, ui = asking.api_url, asking.api_url.removesuffix("/api")
    # Events come in through a websocket, authenticated by its first message.
    with connect(f"ws{api.removeprefix('http')}/events/in", subprotocols=[Subprotocol("prefect")],
                 open_timeout=10) as sock:
        sock.send(json.dumps({"type": "auth", "token": "not-it"}))
        with pytest.raises(ConnectionClosed) as closed:
            sock.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    # The UI asks for the auth string on its login page, and sends CSRF tokens.
    settings = httpx.get(f"{ui}/ui-settings").json()
    assert settings["auth"] == "BASIC" and settings["csrf_enabled"] is True
    # A page of another origin may not call the API from a browser; the UI's own may.
    for origin, allowed in (("http://evil.example", False), (ui, True)):
        asked = httpx.options(f"{api}/flow_runs/filter", headers={
            "Origin": origin, "Access-Control-Request-Method": "POST"})
        assert (asked.headers.get("access-control-allow-origin") == origin) is allowed, origin


async def _attack_with_prefect(api: str, secret: str | None, command: str) -> None:
    """The review's attack as a script with Prefect's own client makes it (a CSRF token
    fetched first): a deployment on the stack's pool whose command is a shell command,
    and a flow run of it."""
    from prefect.client.orchestration import PrefectClient

    async with PrefectClient(api, auth_string=secret) as client:
        flow = (await client._client.post("/flows/", json={"name": "innocent"})).json()["id"]
        deployment = (await client._client.post("/deployments/", json={
            "name": "innocent", "flow_id": flow, "work_pool_name": "local-process",
            "job_variables": {"command": command}})).json()["id"]
        await client._client.post(f"/deployments/{deployment}/create_flow_run", json={})


def _attack_raw(api: str, command: str) -> list[int]:
    """The review's attack as plain HTTP requests: each one's status."""
    import httpx

    said = [httpx.post(f"{api}/flows/", json={"name": "innocent"})]
    flow = said[-1].json().get("id") if said[-1].status_code == 201 else "none"
    said.append(httpx.post(f"{api}/deployments/", json={
        "name": "innocent", "flow_id": flow, "work_pool_name": "local-process",
        "job_variables": {"command": command}}))
    made = said[-1].json().get("id") if said[-1].status_code == 201 else "none"
    said.append(httpx.post(f"{api}/deployments/{made}/create_flow_run", json={}))
    return [r.status_code for r in said]


def test_the_reviews_attack_runs_nothing(asking: _Asking, tmp_path: Path) -> None:
    import asyncio

    import httpx

    from .prefect_servers import asked_headers
    from .waits import until

    ran = tmp_path / "ran"
    command = f"touch {ran}"
    assert set(_attack_raw(asking.api_url, command)) <= {401, 403}
    with pytest.raises(httpx.HTTPStatusError) as refused:
        asyncio.run(_attack_with_prefect(asking.api_url, None, command))
    assert refused.value.response.status_code == 401
    assert asking.secret is not None
    asked = asked_headers(asking.api_url, asking.secret)
    made = httpx.post(f"{asking.api_url}/flows/filter", headers=asked,
                      json={"flows": {"name": {"any_": ["innocent"]}}}).json()
    assert made == [] and not ran.exists()  # none of it made: nothing to run, nothing ran
    # Whoever has the auth string may (what the worker runs: the README's "Across hosts"):
    # the same requests with it run the command. So the worker polled meanwhile, asking
    # with the auth string and CSRF tokens of its own.
    asyncio.run(_attack_with_prefect(asking.api_url, asking.secret, command))
    until(ran.exists, "the worker to run the deployment's command", timeout=90)


def _exported(shown: str) -> dict[str, str]:
    import shlex

    lines = [shlex.split(line) for line in shown.splitlines()]
    return dict(words[1].split("=", 1) for words in lines if words[:1] == ["export"])


def _experiment(env: dict[str, str], tmp_path: Path, name: str,
                rows: int) -> tuple[dict[str, object], str]:
    """tests/stack_experiment.py (ROWS rows, three task runs each) with ``env``: what it
    printed, and its errors."""
    import json
    import os
    import subprocess
    import sys

    from .conftest import ROOT

    ran = subprocess.run([sys.executable, str(ROOT / "tests" / "stack_experiment.py"),
                          str(tmp_path / "results"), name, str(rows), "60"],
                         env={**os.environ, **env, "PREFECT_HOME": str(tmp_path / name)},
                         capture_output=True, text=True, timeout=180)
    assert ran.returncode == 0, ran.stderr[-3000:]
    return json.loads(ran.stdout.splitlines()[-1]), ran.stderr


def test_an_experiment_given_server_env_records_every_task_run(asking: _Asking,
                                                               tmp_path: Path) -> None:
    import httpx

    from .prefect_servers import asked_headers

    exported = _exported(_server_cli("env", "--home", str(asking.home))[1])
    assert exported == {"PREFECT_API_URL": asking.api_url, "PREFECT_API_AUTH_STRING": asking.secret}
    out, said = _experiment(exported, tmp_path, "asked", 20)
    assert out["recorded"], out
    assert exported["PREFECT_API_AUTH_STRING"] not in said
    asked = asked_headers(asking.api_url, exported["PREFECT_API_AUTH_STRING"])
    runs = httpx.post(f"{asking.api_url}/task_runs/filter", headers=asked, json={
        "flow_runs": {"id": {"any_": [out["flow_run_id"]]}}, "limit": 200}).json()
    assert len(runs) == 3 * 20 and {r["state_type"] for r in runs} == {"COMPLETED"}
    # Without it the recorder says so at once (not after 30 s of retries), with the fix.
    out, said = _experiment({"PREFECT_API_URL": asking.api_url}, tmp_path, "unasked", 2)
    assert out["flow_run_id"] is None and not out["recorded"]
    assert "asks who you are (401 Unauthorized)" in said and "server env" in said, said[-2000:]
    assert exported["PREFECT_API_AUTH_STRING"] not in said


def test_run_says_the_server_asks_who_you_are(asking: _Asking) -> None:
    import typer
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    from patronus_tasks.cli.run import _check_api

    with temporary_settings({PREFECT_API_URL: asking.api_url}), pytest.raises(typer.Exit) as said:
        _check_api()
    assert said.value.exit_code == 2
    with temporary_settings({PREFECT_API_URL: asking.api_url, PREFECT_API_AUTH_STRING: asking.secret}):
        _check_api()


def test_a_server_that_answers_anyone_is_not_left_running(prefect_server: str) -> None:
    from patronus_tasks.exceptions import ConfigError
    from patronus_tasks.prefect.server.stack import auth

    with pytest.raises(ConfigError, match="answered a request without its auth string"):
        auth.require_asking(prefect_server)  # the suite's server asks nobody


def test_an_auth_string_others_may_read_is_refused(tmp_path: Path) -> None:
    import os

    from patronus_tasks.exceptions import ConfigError
    from patronus_tasks.prefect.server.stack import Stack, down, up

    from .prefect_servers import free_port

    home = tmp_path / "home"
    home.mkdir()
    (home / "auth-string").write_text("seen-by-others")
    os.chmod(home / "auth-string", 0o644)
    try:
        with pytest.raises(ConfigError, match=r"others on this machine may read it \(mode -rw-r--r--\)"):
            up(tmp_path, home, free_port(), deploy=False, worker=False)
        assert Stack.load(home) is None  # refused before anything started
    finally:
        down(home)  # (what a stack that took it started)


def test_the_secret_shows_nowhere_but_server_env(asking: _Asking) -> None:
    """Last of the section: the stack has served the attack and the experiments."""
    import json
    import stat

    from typer.testing import CliRunner

    from patronus_tasks.cli import app
    from patronus_tasks.prefect.server.stack import Stack

    secret = asking.secret
    assert secret is not None
    assert stat.S_IMODE((asking.home / "auth-string").stat().st_mode) == 0o600
    status = CliRunner().invoke(app, ["server", "status", "--home", str(asking.home), "--json"])
    assert status.exit_code == 0 and json.loads(status.stdout), status.stdout
    stack = Stack.load(asking.home)
    assert stack is not None
    titles = [Path(f"/proc/{p.pid}/cmdline").read_bytes().decode(errors="replace")
              for p in stack.procs if p.pid]
    logs = {p.name: p.read_text(errors="replace") for p in asking.home.glob("*.log")}
    assert {"server.log", "worker.log"} <= set(logs)
    seen = {"server up's output": asking.shown, "server status --json": status.stdout,
            "stack.json": (asking.home / "stack.json").read_text(), **logs,
            **{f"process {i}'s title": t for i, t in enumerate(titles)}}
    assert [where for where, text in seen.items() if secret in text] == []
    helped = CliRunner().invoke(app, ["server", "env", "--help"])
    assert "prints a secret" in " ".join(helped.stdout.split())


# (end of the server section)



# ---------------------------------------------------------------------------------------
# 4. Names cannot collide; the report's template; credentials in URLs; huge datasets.
# ---------------------------------------------------------------------------------------


# Imports are in the tests: the sections above are others', and come first.


def _counted_run(results_dir, name: str, calls: list[str], **options):
    """A run of one row whose task counts its calls (a reused row makes none)."""
    from patronus_tasks import run_experiment, task

    @task
    def answer(evaluated_model_input: str) -> str:
        calls.append(name)
        return evaluated_model_input

    return run_experiment("p", data=[{"sid": "1", "evaluated_model_input": "q"}], task=answer,
                          experiment_name=name, backend="local", results_dir=results_dir,
                          print_summary=False, html_report=False, **options)


def test_names_that_clean_alike_keep_a_folder_and_rows_each(results_dir) -> None:
    """``resume=True`` for "nightly/a" reused the rows of "nightly a" ("1 of 1 rows
    reused"): both were kept in ``nightly_a``."""
    import json

    from typer.testing import CliRunner

    from patronus_tasks.cli import app
    from patronus_tasks.results.store import load_experiment

    calls: list[str] = []
    spaced = _counted_run(results_dir, "nightly a", calls)
    slashed = _counted_run(results_dir, "nightly/a", calls, resume=True)
    assert calls == ["nightly a", "nightly/a"]  # its own row ran: nothing of the other's reused
    assert spaced.location != slashed.location
    assert slashed.location.name == "nightly_a-c70714a3"  # the name cleaned, and its hash
    assert json.loads((slashed.path / "manifest.json").read_text())["experiment_name"] == "nightly/a"
    safe = _counted_run(results_dir, "nightly_a", calls)
    assert safe.location.name == "nightly_a"  # a name that is safe already keeps its folder
    # Each is found by its own name, and listed by it beside its folder.
    for name, run in (("nightly/a", slashed), ("p/nightly/a", slashed), ("nightly a", spaced),
                      ("nightly_a", safe), ("nightly_a-c70714a3", slashed)):
        assert load_experiment(name, results_dir).location == run.location, name
    listed = CliRunner().invoke(app, ["list", "--results-dir", str(results_dir)]).stdout
    assert "p/nightly/a (nightly_a-c70714a3)" in listed and "p/nightly_a  " in listed, listed
    shown = CliRunner().invoke(app, ["show", "nightly/a", "--results-dir", str(results_dir)])
    assert shown.exit_code == 0 and "nightly/a" in shown.stdout, shown.output


def test_a_resume_never_goes_on_with_another_names_run(results_dir) -> None:
    """``x-2`` is a name and a second run of ``x``'s folder: resuming ``x`` went on with
    the run named ``x-2``; an ``experiment_id`` of another name's run was resumed as this
    name (into that run's folder). The first is stepped over, the second refused."""
    import pytest

    from patronus_tasks import ConfigError

    calls: list[str] = []
    x = _counted_run(results_dir, "x", calls)
    _counted_run(results_dir, "x-2", calls)
    assert _counted_run(results_dir, "x", calls, resume=True).location == x.location
    assert calls == ["x", "x-2"]  # x's own row, reused
    spaced = _counted_run(results_dir, "nightly a", calls)
    with pytest.raises(ConfigError) as refused:
        _counted_run(results_dir, "nightly/a", calls, resume=True,
                     experiment_id=spaced.manifest.experiment_id)
    said = str(refused.value)
    assert "is a run of p/'nightly a'" in said and "not of p/'nightly/a'" in said, said
    assert "experiment_name='nightly a'" in said and len(calls) == 3
    # A run in the folder an older version gave it (``nightly_a``) is still resumed by
    # its own name, and by no other.
    spaced.path.rename(results_dir / "p" / "nightly_a")
    again = _counted_run(results_dir, "nightly a", calls, resume=True)
    assert again.location.name == "nightly_a" and len(calls) == 3
    other = _counted_run(results_dir, "nightly/a", calls, resume=True)
    assert other.location.name == "nightly_a-c70714a3" and calls[-1] == "nightly/a"


def test_data_never_reaches_the_reports_template(results_dir) -> None:
    """A name or sid holding ``/*DATA*/`` or ``__SECTIONS__`` was replaced by the report's
    records or sections (a 400-byte value grew a report from 0.45 MB to 20.7 MB)."""
    from patronus_tasks import TaskResult, evaluator, run_experiment, task
    from patronus_tasks.report import REPORT_FILE

    from .chromium import Browser, chromium_or_skip
    from .conftest import RECORDED_WITHIN

    chromium_or_skip()
    slots = "/*DATA*/ __SECTIONS__ __HEADER__ __TITLE__"  # each was filled wherever it was

    @task
    def echoed(evaluated_model_input: str) -> str:
        return f"{evaluated_model_input} {slots}"

    @evaluator
    def has_q(task_result: TaskResult) -> bool:
        return "q" in (task_result.evaluated_model_output or "")

    data = [{"sid": f"{slots} {i}", "evaluated_model_input": f"q{i} {slots}"} for i in range(4)]
    exp = run_experiment(f"p {slots}", data=data, task=echoed, evaluators=[has_q],
                         experiment_name=f"n {slots}", backend="local",
                         results_dir=results_dir, print_summary=False)
    assert exp.wait_recorded(RECORDED_WITHIN)  # the report is written after the results
    page = exp.path / REPORT_FILE
    html = page.read_text()
    assert len(html.encode()) < 60_000, len(html)  # 50 kB, as with names free of slots
    assert html.count('<script id="report-data"') == 1 and html.count("data:image/png") == 2
    with Browser() as b:
        b.open(page.as_uri())
        assert b.wait_for("document.body.dataset.ready && document.body.dataset.shown") == "4"
        assert b.js("document.title") == f"p {slots}/n {slots}"
        assert b.js("document.querySelector('h1').textContent") == f"p {slots}/n {slots}"
        assert f"{slots} 3" in b.js("document.querySelector('#rows').innerText")


def test_an_endpoint_url_with_credentials_never_drops_the_key(monkeypatch) -> None:
    """httpx sent a URL's ``user:pass@`` as Basic auth in place of the API key: the key
    was dropped without a word. Now: with a key, refused (the password never said);
    without one, the Basic auth the URL stands for, sent and kept out of the URL."""
    import asyncio
    import base64

    import pytest

    from patronus_tasks import ConfigError
    from patronus_tasks.http import Endpoint
    from patronus_tasks.openai import LLMJudge, openai_endpoint

    from .servers import echo_chat, serve

    with serve(echo_chat) as server:
        url = server.url.replace("http://", "http://alice:pa55word@") + "/v1"
        with pytest.raises(ConfigError) as refused:
            openai_endpoint(url, "sk-key-123456")
        monkeypatch.setenv("OPENAI_BASE_URL", url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-key-123456")
        with pytest.raises(ConfigError) as from_env:
            LLMJudge("judge", "is polite")
        for said in (str(refused.value), str(from_env.value)):
            assert "http://***:***@127.0.0.1" in said and "Authorization" in said, said
            assert "pa55word" not in said and "alice" not in said and "sk-key" not in said
        endpoint = Endpoint(url)  # no key: the URL's credentials are the auth, as documented
        asyncio.run(endpoint.request("POST", "/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": "hi"}]}))
        sent = server.requests[-1].headers["authorization"]
        assert sent == "Basic " + base64.b64encode(b"alice:pa55word").decode()
        assert "pa55word" not in endpoint.base_url + repr(endpoint)  # nor in cache keys


def _wide_sources(folder, columns: int) -> dict[str, object]:
    """One row of ``columns`` columns from each source a dataset comes from."""
    import json

    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    row = {f"c{i}": i for i in range(columns)}
    (folder / "wide.jsonl").write_text(json.dumps(row) + "\n")
    (folder / "wide.csv").write_text(",".join(row) + "\n" + ",".join(map(str, row.values())) + "\n")
    pq.write_table(pa.table({k: [v] for k, v in row.items()}), folder / "wide.parquet")
    return {"a list of dicts": [row], "a DataFrame": pd.DataFrame([row]),
            "JSONL": folder / "wide.jsonl", "CSV": folder / "wide.csv",
            "Parquet": folder / "wide.parquet"}


def test_a_dataset_over_the_column_limit_is_refused_at_once(tmp_path) -> None:
    """10^6 columns ran for minutes with no word (100,000: 92 s): each source is now
    refused, naming the count, the limit and the fix, before it is read whole
    (bench/wide_dataset.py times it for 10^6)."""
    import pandas as pd
    import pytest

    from patronus_tasks import DatasetError
    from patronus_tasks.datasets import Dataset as SDKDataset
    from patronus_tasks.datasets import read_csv as sdk_read_csv
    from patronus_tasks.datasets import read_jsonl as sdk_read_jsonl
    from patronus_tasks.define.dataset import load_dataset
    from patronus_tasks.define.wide import MAX_COLUMNS

    sources = _wide_sources(tmp_path, MAX_COLUMNS + 1)
    refusals = [lambda data=data: load_dataset(data) for data in sources.values()] + [
        lambda: SDKDataset.from_records(sources["a list of dicts"]),
        lambda: sdk_read_csv(sources["CSV"]), lambda: sdk_read_jsonl(sources["JSONL"])]
    for what, refuse in zip([*sources, "SDK records", "SDK CSV", "SDK JSONL"], refusals, strict=True):
        with pytest.raises(DatasetError) as refused:
            refuse()
        said = str(refused.value)
        assert "10,001 columns" in said and "at most 10,000" in said and "df[[" in said, (what, said)
    assert len(load_dataset(pd.DataFrame([{f"c{i}": i for i in range(MAX_COLUMNS)}])).columns) \
        == MAX_COLUMNS + 1  # at the limit: loaded (its sid added)


# (end of the names section)



# ---------------------------------------------------------------------------------------
# 5. A terminal shows untrusted text, never obeys it.
# ---------------------------------------------------------------------------------------

#: What a model's answer could make a terminal do: clear it, set its title, write the
#: clipboard (OSC 52), hide a link (OSC 8), reorder what is read (a bidi override).
CONTROLS = "\x1b[2J\x1b]0;owned\x07\x1b]52;c;ZWNobyBvd25lZA==\x07\x1b]8;;http://127.0.0.1:9/x\x1b\\\u202e"


def test_the_summary_and_the_cli_show_a_terminals_controls_as_text(tmp_path: Path) -> None:
    import subprocess
    import sys

    script = tmp_path / "hostile.py"
    script.write_text(f"""
from patronus_tasks import EvaluationResult, evaluator, run_experiment, task
C = {CONTROLS!r}
@task
def answer(evaluated_model_input: str) -> str:
    return "out" + C
@evaluator
def judge(evaluated_model_input: str) -> EvaluationResult:
    if evaluated_model_input == "x":
        raise ValueError("boom" + C)
    return EvaluationResult(pass_=False, score_raw=0.0, explanation="said" + C)
run_experiment("p", data=[{{"sid": "a", "evaluated_model_input": "q"}},
                          {{"sid": "b[link=http://127.0.0.1:9]b", "evaluated_model_input": "x"}}],
               task=answer, evaluators=[judge], backend="local", html_report=False,
               experiment_name="e[bold]x", results_dir={str(tmp_path / "r")!r})
""")
    ran = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    cli = str(Path(sys.executable).with_name("patronus-tasks"))
    shown = subprocess.run([cli, "show", "e[bold]x", "--failures", "--results-dir", str(tmp_path / "r")],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    for out in (ran.stdout, shown.stdout):
        assert "\\x1b]52;c;" in out  # said, as text
        assert not any(c in out for c in "\x1b\x07\u202e"), out
    assert "said\\x1b[2J" in shown.stdout and "e[bold]x" in shown.stdout


def test_the_lean_clients_settings_never_show_a_secret_in_their_repr() -> None:
    """The recorder's client settings hold the auth string, an API key and custom headers
    (often a token): a repr of them, in a traceback, a log line or a test's failure diff,
    shows none of them."""
    from patronus_tasks.prefect.client_settings import ClientSettings

    shown = repr(ClientSettings("http://127.0.0.1:4200/api", auth_string="admin:s3cret-auth",
                                api_key="pnu_s3cret-key", headers={"X-Token": "s3cret-header"}))
    assert "127.0.0.1:4200" in shown and "s3cret" not in shown, shown


def test_a_refused_api_is_named_without_the_password_in_its_url() -> None:
    """A ``PREFECT_API_URL`` of ``https://user:password@host/api``: the recorder's error
    when that API refuses (401) names the API, not the password in its URL."""
    from patronus_tasks.prefect.clients import refused_fix

    said = refused_fix("https://bob:s3cret-password@prefect.example/api")
    assert "prefect.example/api" in said and "s3cret" not in said, said


_ORPHANED = """
import os, sys, threading
from patronus_tasks.evaluators.sql import Database, run_query
db = Database("CREATE TABLE t (x INT);", "duckdb")
run_query(db, "SELECT 1")  # the worker started
threading.Thread(target=run_query, daemon=True, kwargs=dict(
    db=db, query="SELECT sum(range) FROM range(1000000000000)", timeout=600)).start()
print("running", flush=True)
threading.Event().wait()
"""


def test_a_duckdb_worker_dies_with_the_process_that_started_it() -> None:
    """The experiment's process killed (SIGKILL, the OOM killer) while its DuckDB worker
    runs a hostile query: the worker was adopted by init and ran on at ~90% of a core,
    up to its memory cap, until the query ended. It now ends within a second or so."""
    pytest.importorskip("duckdb")
    import signal
    import subprocess
    import sys

    from .waits import until

    env = {k: v for k, v in os.environ.items() if not k.startswith("PATRONUS_TASKS_SQL")}
    parent = subprocess.Popen([sys.executable, "-c", _ORPHANED], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "running"
        children = Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text().split()
        workers = [int(c) for c in children if "sql_child" in Path(f"/proc/{c}/cmdline").read_text()]
        assert workers, children
        # Killed once the worker is inside the query (its CPU time growing), not before.
        until(lambda: int(Path(f"/proc/{workers[0]}/stat").read_text().rsplit(")", 1)[1].split()[11]) > 50,
              "the worker busy with the query", 30)
    finally:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
    until(lambda: not any(Path(f"/proc/{w}").exists() and "Z" not in
                          Path(f"/proc/{w}/stat").read_text().rsplit(")", 1)[1][:3] for w in workers),
          "the orphaned DuckDB worker to end", 10)
