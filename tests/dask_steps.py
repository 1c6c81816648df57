"""Steps defined in a user module, for the Dask test: they must travel to workers."""

import os

from patronus_tasks import Row, TaskResult, evaluator, task


@task
async def where(row: Row) -> TaskResult:
    return TaskResult(evaluated_model_output=f"row {row.sid}", metadata={"pid": os.getpid()})


@evaluator
def said_row(task_result: TaskResult, row: Row) -> bool:
    return task_result.evaluated_model_output == f"row {row.sid}"
