"""The HTML report, looked at in headless Chromium as a person does: the charts drawn, the
rows filtered, sorted and opened, the comparison with another run; and the command that
makes it for a past run."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from patronus_tasks import EvaluationResult, Row, TaskResult, evaluator, run_experiment, task
from patronus_tasks.cli import app
from patronus_tasks.report import REPORT_FILE
from patronus_tasks.report.rows import unpacked

from .chromium import Browser, chromium_or_skip
from .conftest import RECORDED_WITHIN


@task
def answer(row: Row) -> str:
    if row.category == "broken":
        raise ValueError(f"model down on {row.sid}")
    return str(row.reply)


@evaluator
def exact(task_result: TaskResult, evaluated_model_gold_answer: str) -> EvaluationResult:
    same = task_result.evaluated_model_output == evaluated_model_gold_answer
    return EvaluationResult(pass_=same, score_raw=float(same),
                            explanation=None if same else "the answer differs from the gold one")


@evaluator
def length(task_result: TaskResult) -> float:
    return min(1.0, len(task_result.evaluated_model_output or "") / 10)


def _data(wrong: set[int]) -> list[dict[str, Any]]:
    """40 questions: those in ``wrong`` answered wrongly, every 10th one's model down."""
    return [{"sid": f"s{i:02d}", "evaluated_model_input": f"question {i} <b>&</script>",
             "evaluated_model_gold_answer": f"answer {i}",
             "reply": f"wrong {i}" if i in wrong else f"answer {i}",
             "category": "broken" if i % 10 == 9 else ("maths" if i % 2 else "history"),
             "cost_usd": 0.5} for i in range(40)]


def _run(results_dir: Path, name: str, wrong: set[int], **options: Any) -> Any:
    exp = run_experiment("report-project", data=_data(wrong), task=answer,
                         evaluators=[exact, length], experiment_name=name, backend="local",
                         results_dir=results_dir, print_summary=False, **options)
    assert exp.wait_recorded(RECORDED_WITHIN)  # the report is written after the results
    return exp


#: The text of the row opened, once it shows.
OPENED = "document.querySelector('#detail.shown') && document.querySelector('#detail').innerText"


def _shown(b: Browser) -> int:
    return int(b.wait_for("document.body.dataset.ready && document.body.dataset.shown"))


def _column(b: Browser, heading: str) -> list[str]:
    return list(b.js(f"""(() => {{
        const i = [...document.querySelectorAll('#rows th')]
          .findIndex(th => th.textContent === {json.dumps(heading)});
        return [...document.querySelectorAll('#rows tbody tr')]
          .map(tr => tr.children[i].textContent); }})()"""))


def _choose(b: Browser, select: str, value: str) -> None:
    b.js(f"""(() => {{ const s = document.getElementById({json.dumps(select)});
        s.value = {json.dumps(value)}; s.dispatchEvent(new Event('change')); }})()""")


def _type(b: Browser, field: str, text: str) -> None:
    b.js(f"""(() => {{ const v = document.getElementById({json.dumps(field)});
        v.value = {json.dumps(text)}; v.dispatchEvent(new Event('input')); }})()""")


def test_the_report_shows_charts_and_rows_to_filter_sort_and_open(results_dir: Path) -> None:
    chromium_or_skip()
    exp = _run(results_dir, "first", wrong={1, 2, 3})
    page = exp.path / REPORT_FILE  # every run writes it beside its results
    assert page.is_file()
    records = len(exp.to_dataframe())
    with Browser(1500, 1000) as b:
        b.open(page.as_uri())
        assert _shown(b) == records
        # The charts are drawn: decoded images of real size.
        sizes = b.js("[...document.querySelectorAll('.charts img')]"
                     ".map(i => [i.alt, i.complete && i.naturalWidth])")
        assert [alt for alt, _ in sizes] == ["pass rate per evaluator", "score distribution per evaluator"]
        assert all(width > 300 for _, width in sizes)
        summary = b.js("document.querySelector('table.figures').innerText")
        # 3 wrong; 4 with the model down are not judged, said so
        assert "exact" in summary and "33 of 36 judged rows; 4 rows' tasks failed" in summary
        assert "cost_usd: 20" in b.js("document.body.innerText")  # per row, not per record
        # Filter by verdict: the verdicts that did not pass, and only those.
        _choose(b, "f-verdict", "not passed")
        assert b.wait_for("document.body.dataset.shown === '3'")
        assert _column(b, "sample") == ["s01", "s02", "s03"]
        assert set(_column(b, "verdict")) == {"not passed"}
        # By a dataset column and an error: the rows whose model was down.
        _choose(b, "f-verdict", "")
        _choose(b, "f-column", "category")
        _type(b, "f-value", "=broken")
        assert b.wait_for("document.body.dataset.shown === '4'")
        _type(b, "f-value", "")
        assert b.wait_for(f"document.body.dataset.shown === '{records}'")  # typing settles
        _choose(b, "f-error", "ValueError")
        assert b.wait_for("document.body.dataset.shown === '4'")
        # Sorted by score, highest first, among one evaluator's results.
        _choose(b, "f-error", "")
        _choose(b, "f-evaluator", "length")
        for _ in range(2):  # ascending, then descending
            b.js("[...document.querySelectorAll('#rows th')].find(th => th.textContent === 'score').click()")
        scores = [float(s) for s in _column(b, "score")]
        assert scores == sorted(scores, reverse=True) and len(scores) == 36
        # The page fits its window (1,500 px here): nothing runs off sideways.
        assert b.js("document.documentElement.scrollWidth <= window.innerWidth")
        # A row opened: its input, output, gold answer, explanation.
        _choose(b, "f-evaluator", "exact")
        b.js("[...document.querySelectorAll('#rows tbody tr')]"
             ".find(tr => tr.innerText.includes('s02')).click()")
        opened = b.wait_for(OPENED)
        # The drawer sits beside the table's card, never over it (nor over the opened row),
        # and leaves each column a word or two (cells were squeezed to "tool_c…", ~40 px):
        # the table scrolls sideways in its card instead.
        assert b.js("document.querySelector('#rows').closest('section').getBoundingClientRect()"
                    ".right <= document.querySelector('#detail').getBoundingClientRect().left + 1")
        cells = b.js("[...document.querySelectorAll('#rows tbody tr:first-child td')]"
                     ".map(td => td.clientWidth)")
        assert min(cells) >= 80, cells
        assert b.js("document.documentElement.scrollWidth <= window.innerWidth")
        assert "question 2 <b>&</script>" in opened  # the text as written, never as markup
        assert "wrong 2" in opened and "answer 2" in opened
        assert "the answer differs from the gold one" in opened
        # The address keeps the view: opened again from it, the same row and filters.
        url = b.js("location.href")
        assert "row=" in url and "evaluator=exact" in url
        b.open("about:blank")
        b.open(url)
        again = b.wait_for(OPENED)
        assert again == opened


def test_report_command_writes_a_past_run_and_its_comparison(results_dir: Path) -> None:
    _run(results_dir, "before", wrong={1})
    after = _run(results_dir, "after", wrong={1, 2, 3}, html_report=False)
    assert not (after.path / REPORT_FILE).exists()  # switched off
    cli = CliRunner()
    out = cli.invoke(app, ["report", "after", "--results-dir", str(results_dir)])
    assert out.exit_code == 0, out.output
    assert Path(out.output.strip()) == after.path / REPORT_FILE
    out = cli.invoke(app, ["report", "after", "--against", "before", "--results-dir", str(results_dir)])
    assert out.exit_code == 0, out.output
    page = Path(out.output.strip())
    assert page == after.path / "report-vs-before.html"
    html = page.read_text()
    assert "Against before" in html
    chips = re.findall(r"data-filter='([^']*)'>(s\d\d)<", html)
    assert {sid for _, sid in chips} == {"s02", "s03"}  # the rows that regressed
    assert json.loads(chips[0][0].replace("&quot;", '"'))["value"] == "=s02"
    pictures = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    assert len(pictures) == 3 and all(base64.b64decode(p)[:4] == b"\x89PNG" for p in pictures)
    assert "http://" not in html and "https://" not in html  # nothing fetched from anywhere
    out = cli.invoke(app, ["report", "nowhere", "--results-dir", str(results_dir)])
    assert out.exit_code == 2 and "no experiment 'nowhere'" in out.output


@pytest.mark.parametrize("bad", ["</script><script>alert(1)</script>"])
def test_nothing_in_the_data_ends_the_page_early(results_dir: Path, bad: str) -> None:
    exp = run_experiment("report-project", data=[{"evaluated_model_input": bad}],
                         task=answer_as_is, backend="local", results_dir=results_dir,
                         print_summary=False)
    assert exp.wait_recorded(RECORDED_WITHIN)  # the report is written after the results
    html = (exp.path / REPORT_FILE).read_text()
    data = html.split('<script id="report-data" type="application/gzip;base64">')[1]
    assert "</script>" in data and bad not in data.split("</script>")[0]
    assert bad in unpacked(data.split("</script>")[0])["strings"]


@task
def answer_as_is(evaluated_model_input: str) -> str:
    return evaluated_model_input


def test_charts_draw_at_none_and_all_passed() -> None:
    from patronus_tasks.report import charts

    for passed, n in ((0, 7), (7, 7), (0, 1), (3, 7)):
        low, high = charts.wilson(passed, n)
        assert 0 <= low <= passed / n <= high <= 1
        png = charts.rates_chart([charts.Bar("e", passed / n, low, high, f"{passed}/{n}")])
        assert png is not None and png[:4] == b"\x89PNG"
    # Margins come from the labels: a name too long for them is cut, not an error.
    long = charts.rates_chart([charts.Bar("judge_" * 20, 0.5, 0.4, 0.6, "50.0% (5/10)")])
    assert long is not None and long[:4] == b"\x89PNG"


def test_the_series_chart_draws_one_entry_per_line_in_distinct_colours() -> None:
    from patronus_tasks.prefect.ui.charts import nights
    from patronus_tasks.report.charts import history_figure

    history = [  # the -history table's rows, newest first; metrics are not drawn
        {"started": "2026-11-25 20:08:01", "experiment": "b", "result_matches_gold": "33.3%",
         "same_query": "11.1%", "metrics": "precision 0.64", "errors": "1 task",
         "regressed": "result_matches_gold, same_query"},
        {"started": "2026-11-25 20:07:43", "experiment": "a", "result_matches_gold": "66.7%",
         "same_query": "33.3%", "metrics": "precision 0.95", "errors": "1 task", "regressed": ""}]
    fig = history_figure(nights(history))
    assert fig is not None
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["result_matches_gold", "same_query"]
    drawn = [line for line in ax.get_lines() if line.get_label() in ("result_matches_gold", "same_query")]
    assert len({line.get_color() for line in drawn}) == 2
    # Two runs a minute apart: their labels tell them apart.
    assert [t.get_text() for t in ax.get_xticklabels()] == ["11-25 20:07", "11-25 20:08"]
    same_minute = [{**history[0], "started": "2026-11-25 20:07:55"}, history[1]]
    labels = [t.get_text() for t in history_figure(nights(same_minute)).axes[0].get_xticklabels()]
    assert labels == ["11-25 20:07:43", "11-25 20:07:55"]


def test_a_run_worse_than_its_baseline_says_so_first_in_its_report(results_dir: Path) -> None:
    """The verdict against the baseline is the report's header (its red section was 1,200 px
    down); here a local run judged against the run pinned with baseline=."""
    base = _run(results_dir, "base", wrong=set(), html_report=False)
    worse = _run(results_dir, "worse", wrong={1, 2, 3, 4}, baseline=str(base.path))
    note = worse.manifest.verdict
    assert (note.name, note.baseline, note.since, note.worse) == ("Regressed", "base", "worse", ["exact"])
    assert ("<p class='verdict moved worse' id=verdict>Regressed since worse, against baseline base: "
            "exact worse</p>") in (worse.path / REPORT_FILE).read_text()
