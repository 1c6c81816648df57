"""Steps defined in a user module, for the Dask tests: they must travel to workers."""

import asyncio
import os

from patronus_tasks import EvaluationResult, Parent, Row, TaskResult, evaluator, task


@task
async def where(row: Row) -> TaskResult:
    return TaskResult(evaluated_model_output=f"row {row.sid}", metadata={"pid": os.getpid()})


@evaluator
def said_row(task_result: TaskResult, row: Row) -> bool:
    return task_result.evaluated_model_output == f"row {row.sid}"


# -- one experiment on every backend (test_backends.py): retries, timeouts, `None`, errors,
# -- a chained task reading its parent. Attempts are counted per process, keyed by the run.
ATTEMPTS: dict[str, int] = {}


@task(retries=2, retry_delay_seconds=0)
def answer(row: Row) -> TaskResult | None:
    key = f"{row.run}:{row.sid}"
    ATTEMPTS[key] = ATTEMPTS.get(key, 0) + 1
    if row.kind == "flaky" and ATTEMPTS[key] < 2:
        raise ConnectionError("flaky model")
    if row.kind == "broken":
        raise ValueError("always broken")
    if row.kind == "skip":
        return None
    return TaskResult(evaluated_model_output=row.text.upper(), tags={"kind": row.kind})


@evaluator(timeout_seconds=0.5)
async def upper_judge(row: Row, task_result: TaskResult) -> EvaluationResult:
    if row.kind == "hang":
        await asyncio.sleep(30)
    return EvaluationResult(pass_=task_result.evaluated_model_output.isupper(), score_raw=0.5)


@evaluator
def size(task_result: TaskResult) -> float:
    return float(len(task_result.evaluated_model_output))


@task
def follow_up(parent: Parent) -> str:
    return f"{parent.task.evaluated_model_output}:{parent.find_eval_result('size').score_raw}"


# -- repeats, the cache and metric gates on Dask (test_costs_repeats_metrics.py)
@task(cache=True)
def echo_cached(row: Row) -> str:
    return f"echo {row.sid}"


@evaluator
def fails_while_flagged(row: Row) -> bool:
    if row.sid == "2" and os.path.exists(row.flag):
        raise RuntimeError("flagged")
    return True
