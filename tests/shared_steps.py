"""The steps several tests run, in a module of their own (Dask sends steps to its workers
by reference: they must be importable there)."""

import asyncio
import os

from patronus_tasks import EvaluationResult, Parent, Row, TaskResult, evaluator, span, task


@task
async def where(row: Row) -> TaskResult:
    return TaskResult(evaluated_model_output=f"row {row.sid}", metadata={"pid": os.getpid()})


@evaluator
def said_row(task_result: TaskResult, row: Row) -> bool:
    return task_result.evaluated_model_output == f"row {row.sid}"


# -- one chain of every kind of call (test_backends.py on every backend, test_recording.py
# -- against Prefect's own engine): retries, a timeout, `None`, errors, a chained task
# -- reading its parent. A row's `kind` says what its task does; `run` keys its attempts
# -- (counted per process).
ATTEMPTS: dict[str, int] = {}


def respond(kind: str, text: str, key: str) -> TaskResult | None:
    """What `answer` does for a row of ``kind`` (its attempts counted under ``key``)."""
    ATTEMPTS[key] = ATTEMPTS.get(key, 0) + 1
    if kind == "flaky" and ATTEMPTS[key] < 2:
        raise ConnectionError("flaky model")
    if kind == "broken":
        raise ValueError("always broken")
    if kind == "skip":
        return None
    return TaskResult(evaluated_model_output=text.upper(), tags={"kind": kind})


@task(retries=2, retry_delay_seconds=0)
def answer(row: Row) -> TaskResult | None:
    return respond(row.kind, row.text, f"{row.run}:{row.sid}")


@evaluator(timeout_seconds=0.5)
async def upper_judge(row: Row, task_result: TaskResult) -> EvaluationResult:
    if row.kind == "hang":
        await asyncio.sleep(30)
    return EvaluationResult(pass_=task_result.evaluated_model_output.isupper(), score_raw=0.5)


@evaluator
def size(task_result: TaskResult) -> float:
    return float(len(task_result.evaluated_model_output))


def _follow(parent: Parent) -> str:
    return f"{parent.task.evaluated_model_output}:{parent.find_eval_result('size').score_raw}"


@task
def follow_up(parent: Parent) -> str:
    return _follow(parent)


@task
def follow_up_traced(parent: Parent) -> str:
    """`follow_up` recording a span (not in test_recording: Prefect's engine records none)."""
    with span("read_parent", kind="retrieval", link=1) as s:
        s.set(output=parent.task.evaluated_model_output)
    return _follow(parent)


# -- repeats, the cache and metric gates on Dask (test_costs_repeats_metrics.py)
@task(cache=True)
def echo_cached(row: Row) -> str:
    return f"echo {row.sid}"


@evaluator
def fails_while_flagged(row: Row) -> bool:
    if row.sid == "2" and os.path.exists(row.flag):
        raise RuntimeError("flagged")
    return True
