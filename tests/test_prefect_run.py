"""Experiments as Prefect flow runs, read back through the Prefect API of a real server."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.client.schemas.sorting import TaskRunSort

from patronus_tasks import EvaluationResult, Row, TaskResult, evaluator, run_experiment, task


@task
def shout(evaluated_model_input: str) -> str | None:
    if evaluated_model_input == "boom":
        raise ValueError("cannot shout boom")
    if evaluated_model_input == "skip":
        return None
    return evaluated_model_input.upper()


@evaluator
def is_upper(evaluated_model_output: str) -> bool:
    return evaluated_model_output.isupper()


@evaluator(name="length", criteria="len/10")
async def length(task_result: TaskResult, row: Row) -> EvaluationResult:
    if row.evaluated_model_input == "fail-eval":
        raise RuntimeError("evaluator exploded")
    return EvaluationResult(score_raw=len(task_result.evaluated_model_output) / 10, pass_=True)


DATA = [{"evaluated_model_input": x} for x in ["hello", "world", "boom", "skip", "fail-eval"]]


async def _task_runs(flow_run_id: str) -> list[Any]:
    async with get_client() as client:
        flt = FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        return await client.read_task_runs(flow_run_filter=flt, sort=TaskRunSort.EXPECTED_START_TIME_DESC)


def test_experiment_is_one_flow_run_with_a_task_run_per_call(prefect_server: str,
                                                             results_dir: Path) -> None:
    exp = run_experiment("Shouting", data=DATA, task=shout, evaluators=[is_upper, length],
                         tags={"unit": "R&D"}, experiment_name="shout", results_dir=results_dir,
                         print_summary=False)
    runs = asyncio.run(_task_runs(exp.manifest["flow_run_id"]))
    names = sorted(r.name for r in runs)
    # 5 task calls; evaluators only for the 3 rows whose task returned a string.
    assert names == sorted(
        [f"shout-{i}" for i in range(1, 6)]
        + [f"is_upper-{i}" for i in (1, 2, 5)] + [f"length-{i}" for i in (1, 2, 5)]
    )
    states = {r.name: r.state.type.value for r in runs}
    assert states["shout-3"] == "FAILED" and states["length-5"] == "FAILED"
    assert states["shout-1"] == "COMPLETED" and states["is_upper-5"] == "COMPLETED"
    assert all({"project:Shouting", "unit:R&D", "experiment:shout"} <= set(r.tags) for r in runs)
    # Evaluators wait for their row's task: the graph shows task -> evaluator.
    by_name = {r.name: r for r in runs}
    upstream = by_name["is_upper-1"].task_inputs["wait_for"][0].id
    assert upstream == by_name["shout-1"].id

    table = pq.read_table(exp.results_path)
    rows = {(r["sid"], r["evaluator_name"]): r for r in table.to_pylist()}
    assert rows[("3", None)]["error_type"] == "ValueError"
    assert "cannot shout boom" in rows[("3", None)]["error_message"]
    assert rows[("4", None)]["status"] == "skipped"
    assert rows[("5", "length")]["error_type"] == "RuntimeError"
    assert rows[("5", "is_upper")]["pass"] is True
    assert rows[("1", "length")]["score"] == 0.5
    assert rows[("1", "length")]["criteria"] == "len/10"
    assert table.num_rows == 8
