"""Text-to-SQL evaluation: run each row's generated SQL against a bundled shop database
and compare the result set with the gold query's (`sql_result_match`), and the query
itself with the gold one once both are normalised (`sql_equivalent`).

Runs offline: the "model output" is the SQL in the dataset's ``query`` column, as if a
model had written it (the task stands in for the model call, and runs the SQL: a query
that fails is the task's error). Rows that are not SQL (``language != "sql"``) return
None from the task, which skips their evaluators (the reference's conditional task).

Besides the per-row verdicts, two dataset-level metrics: precision, recall and F1 of
the result rows over the whole dataset (micro-averaged: a query returning 1,000 rows
weighs more than one returning 1), and the accuracy per question category. With
``cache=True`` a second run calls no step again (each answer is read from the cache
beside the results); ``repeats=N`` runs every question N times.

    python flows/text_to_sql.py                # run on the bundled data, print the summary
    patronus-tasks run flows/text_to_sql.py    # the same through the command line
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from prefect import flow
from prefect.states import State

from patronus_tasks import Row, TaskResult, run_experiment, task
from patronus_tasks.evaluators import sql_equivalent, sql_result_match
from patronus_tasks.evaluators.sql import Database, run_query
from patronus_tasks.metrics import accuracy_by, metric
from patronus_tasks.prefect import experiment_flow_run_name, use_built_in_server, verdict_state

HERE = Path(__file__).resolve().parent
SCHEMA = HERE.parent / "datasets" / "text_to_sql" / "shop.sql"
SHOP = Database(SCHEMA, "sqlite")


def in_project(path: str) -> Path:
    """A relative path from the working directory (a deployment's is the project folder),
    else from this project's folder (the flow run as a script from elsewhere)."""
    here = Path(path)
    return here if here.is_absolute() or here.exists() else HERE.parent / here


@task
def perform_sql_query(row: Row) -> TaskResult | None:
    """The row's SQL as the model's answer, once it has run; rows that are not SQL are skipped."""
    if row.language != "sql":
        return None
    rows = run_query(SHOP, row.query, timeout=10)
    return TaskResult(evaluated_model_output=row.query, metadata={"row_count": len(rows)},
                      tags={"language": "sql"})


#: Result sets compared to two decimals (averages of prices), in order only where the
#: gold query orders.
result_matches_gold = sql_result_match(SCHEMA, float_tolerance=0.01, name="result_matches_gold")
same_query = sql_equivalent(dialect="sqlite", name="same_query")


def _rows(query: str | None) -> set[tuple[Any, ...]]:
    if not query:
        return set()
    try:
        return {tuple(round(v, 2) if isinstance(v, float) else v for v in r)
                for r in run_query(SHOP, query, timeout=10)}
    except Exception:  # a query that fails returned no rows
        return set()


@metric
def result_rows(outputs: list[str | None], gold_answers: list[str | None]) -> dict[str, float]:
    """Precision, recall and F1 of the result rows, over the whole dataset: of all rows the
    queries returned, the share the gold queries return too, and the other way round
    (rows not SQL, with no gold query, left out; a query that failed returned none)."""
    found = wanted = both = 0
    for output, gold in zip(outputs, gold_answers, strict=True):
        if not gold:
            continue
        got, want = _rows(output), _rows(gold)
        found, wanted, both = found + len(got), wanted + len(want), both + len(got & want)
    precision, recall = both / found if found else 0.0, both / wanted if wanted else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


METRICS = [result_rows, accuracy_by("category", evaluator="result_matches_gold")]


@flow(name="text-to-sql-eval", flow_run_name=experiment_flow_run_name)
def text_to_sql_eval(dataset: str = "datasets/text_to_sql.jsonl", project: str = "text-to-sql",
                     experiment_name: str | None = None, max_concurrency: int = 8,
                     results_dir: str | None = None,
                     fail_on_regression: bool | Literal["significant", "worse"] = False,
                     cache: bool = False, repeats: int = 1,
                     min_f1: float | None = None, resume: bool = False) -> State:
    """Evaluate the dataset's SQL against the gold answers; return the run's manifest
    (the flow run ends Completed with the experiment's figures as its message, so the
    deployment's runs show them too).

    Args:
        dataset: JSONL or CSV, a row per question: `sid`, the question
            (`evaluated_model_input`), the SQL to run (`query`), its `language` (rows
            not `sql` are skipped), its `category` (accuracy per category) and the gold
            SQL (`evaluated_model_gold_answer`). A
            relative path is read from the flow's working directory (a deployment's:
            the project folder).
        project: Project the experiment belongs to; with the deployment, it names the
            series of nightly runs compared with each other.
        experiment_name: Name of this run's experiment; empty for a new timestamped one
            per run (the runs of a deployment still form one series).
        max_concurrency: Rows evaluated at once.
        results_dir: Where the Parquet results go: a folder (relative to the working
            directory) or an object-storage URL (`s3://bucket/prefix`); empty for
            `$PATRONUS_TASKS_RESULTS_DIR`, else `./results`.
        fail_on_regression: Fail the run when it does worse than the previous run of
            its series: true or "significant" (McNemar's test, p < 0.05), "worse" (its
            pass rate fell 5 points or more, or more rows got worse than better).
        cache: Answer each step from the cache (`.cache` in the results directory) when
            it got exactly the same inputs before, and store new answers there.
        repeats: Run every question this many times (pass@k, pass^k, rows that flip).
        min_f1: Fail the run when the F1 of the result rows over the dataset is lower.
        resume: Go on with the latest run named `experiment_name` (an interrupted or
            crashed one): its finished rows are kept, only the rest run.
    """
    experiment = run_experiment(
        project, data=in_project(dataset), task=perform_sql_query,
        evaluators=[result_matches_gold, same_query], tags={"suite": "text-to-sql"},
        experiment_name=experiment_name, max_concurrency=max_concurrency,
        results_dir=results_dir, fail_on_regression=fail_on_regression,
        cache=True if cache else None, repeats=repeats, metrics=METRICS,
        min_metrics={"f1": min_f1} if min_f1 is not None else None, resume=resume,
    )
    return verdict_state(experiment)  # named after the verdict, the figures its message


if __name__ == "__main__":
    use_built_in_server()  # without PREFECT_API_URL: a fresh machine's first start takes ~20 s
    text_to_sql_eval()
