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
    from types import SimpleNamespace

    from patronus_tasks.prefect.ui.artifacts import results_description
    from patronus_tasks.prefect.ui.series import _of_series

    series = "flow/*nightly* <b>/proj_"
    for said in (results_description("p/x", series), f"p/x: Parquet results (series {series})"):
        assert _of_series(SimpleNamespace(description=said), series)  # type: ignore[arg-type]
        assert not _of_series(SimpleNamespace(description=said), "flow/nightly/proj")  # type: ignore[arg-type]


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


class _Beacon:
    """An HTTP server on 127.0.0.1 that notes every request: what a browser fetched of the
    URLs hostile text named."""

    def __init__(self) -> None:
        import http.server
        import threading

        self.seen: list[str] = []
        seen = self.seen

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append(self.path)
                self.send_response(404)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _UI:
    """Prefect's two UIs (their bundles, as its server serves them: v1 at /, v2 at /v2,
    each page's address answered with its index.html) for the server at ``api_url``, from
    a thread of this process: the session's server serves no UI (it spares the suite
    copying the UI's files), and Prefect's UI application would cost ~4 s of imports."""

    PLACEHOLDER = b"/PREFECT_UI_SERVE_BASE_REPLACE_PLACEHOLDER"

    def __init__(self, api_url: str) -> None:
        import http.server
        import json
        import mimetypes
        import threading
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

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


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
        verdict = next(r for r in runs if r.name.startswith("✗ judge"))
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


# (end of the server section)



# ---------------------------------------------------------------------------------------
# 4. Names cannot collide; the report's template; credentials in URLs; huge datasets.
# ---------------------------------------------------------------------------------------


# (end of the names section)
