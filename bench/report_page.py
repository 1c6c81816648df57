"""The HTML report at size: how big the file, how long to write it, how long headless
Chromium takes to open it and to filter its rows, for 2,000 and 20,000 rows.

    .venv/bin/python bench/report_page.py [ROWS ...]     # default: 2000 20000

Rows of a text-to-SQL-like experiment run with backend="local" (a question, the SQL as
the output, a gold query, two evaluators: three records per row), ~10% not passing and
1% errors. Needs Debian's chromium.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from patronus_tasks import EvaluationResult, Row, TaskResult, evaluator, run_experiment, task
from patronus_tasks.report import write_report
from tests.chromium import Browser


@task
def answer(row: Row) -> str:
    if int(row.sid[1:]) % 100 == 7:
        raise RuntimeError("model timed out")
    return f"SELECT name, total FROM orders WHERE customer_id = {row.sid[1:]} ORDER BY total"


@evaluator
def matches(task_result: TaskResult, evaluated_model_gold_answer: str) -> EvaluationResult:
    same = sum(map(ord, evaluated_model_gold_answer)) % 10 != 0
    return EvaluationResult(pass_=same, score_raw=float(same),
                            explanation=None if same else "expected 3 rows, got 2: " * 3)


@evaluator
def overlap(task_result: TaskResult) -> float:
    return (len(task_result.evaluated_model_output or "") % 17) / 16


def _rows(n: int) -> list[dict[str, str]]:
    return [{"sid": f"q{i}", "evaluated_model_input": f"Which orders of customer {i} are the "
             "largest, with the customer's name and the total of each order?",
             "evaluated_model_gold_answer": f"SELECT c.name, o.total FROM orders o JOIN customers c "
             f"ON c.id = o.customer_id WHERE c.id = {i} ORDER BY o.total DESC",
             "category": ("joins", "filters", "aggregates")[i % 3]} for i in range(n)]


def measure(n: int, folder: Path) -> str:
    exp = run_experiment("bench-report", data=_rows(n), task=answer, evaluators=[matches, overlap],
                         backend="local", results_dir=folder, print_summary=False,
                         max_concurrency=64, html_report=False)
    started = time.perf_counter()
    page = Path(write_report(exp))
    written = time.perf_counter() - started
    with Browser() as b:
        started = time.perf_counter()
        b.open(page.as_uri())
        b.wait_for("document.body && document.body.dataset.ready", timeout=120)
        opened = time.perf_counter() - started
        script_ms = b.js("+document.body.dataset.renderMs")
        started = time.perf_counter()
        b.js("const s = document.getElementById('f-verdict'); s.value = 'not passed';"
             "s.dispatchEvent(new Event('change'))")
        filtered = time.perf_counter() - started
        shown = b.js("document.body.dataset.shown")
    records = len(exp.to_dataframe(["sid"]))
    return (f"| {n:,} | {records:,} | {page.stat().st_size / 1e6:.1f} MB | {written:.1f} s | "
            f"{opened:.1f} s | {script_ms} ms | {filtered * 1000:.0f} ms ({shown} rows) |")


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [2000, 20000]
    print("| rows | records | report.html | written in | opened in Chromium | its script | "
          "filter by verdict |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for n in sizes:
            print(measure(n, Path(folder)), flush=True)


if __name__ == "__main__":
    main()
