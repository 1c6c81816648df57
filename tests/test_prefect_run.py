"""Experiments as Prefect flow runs, read back through the Prefect API of a real server."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from prefect.client.orchestration import get_client

from patronus_tasks import EvaluationResult, Row, TaskResult, evaluator, run_experiment, task

from .conftest import RECORDED_WITHIN
from .waits import task_runs_with_states


@task
def shout(evaluated_model_input: str) -> str | None:
    if evaluated_model_input == "boom":
        raise ValueError("cannot shout boom")
    if evaluated_model_input == "skip":
        return None
    return evaluated_model_input.upper()


@task
def shout_and_log(evaluated_model_input: str) -> str:
    from prefect.logging import get_run_logger

    get_run_logger().info("shouting %s", evaluated_model_input)  # inside a user's flow
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
    """The flow run's task runs. Their states are read from the task run's own columns
    (``state_type``, ``state_name``, written with it): on the suite's shared server a
    task run's state row was now and then missing (``state`` None after 30 s) while
    those columns held the final state (noted on issue 35)."""
    async with get_client() as client:
        return await task_runs_with_states(client, flow_run_id)


def test_experiment_is_one_flow_run_with_a_task_run_per_call(prefect_server: str,
                                                             results_dir: Path) -> None:
    exp = run_experiment("Shouting", data=DATA, task=shout, evaluators=[is_upper, length],
                         tags={"unit": "R&D"}, experiment_name="shout", results_dir=results_dir,
                         print_summary=False)
    assert exp.wait_recorded(RECORDED_WITHIN)  # it returned with its results; Prefect caught up after
    runs = asyncio.run(_task_runs(exp.manifest["flow_run_id"]))
    names = sorted(r.name for r in runs)
    # 5 task calls; evaluators only for the 3 rows whose task returned a string.
    assert names == sorted(
        [f"shout-{i}" for i in range(1, 6)]
        + [f"is_upper-{i}" for i in (1, 2, 5)] + [f"length-{i}" for i in (1, 2, 5)]
    )
    states = {r.name: r.state_type.value for r in runs}  # the run's own columns: see _task_runs
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


def test_prefect_retries_are_used_and_counted(prefect_server: str, results_dir: Path) -> None:
    calls: dict[str, int] = {}

    @task(retries=2, retry_delay_seconds=0)
    def flaky(row: Row) -> str:
        calls[row.sid] = calls.get(row.sid, 0) + 1
        if row.sid == "1" and calls[row.sid] < 3:
            raise ConnectionError("flaky model")
        if row.sid == "2":
            raise ConnectionError("always down")
        return "fine"

    exp = run_experiment("Retries", data=[{"x": 1}, {"x": 2}], task=flaky,
                         results_dir=results_dir, print_summary=False)
    df = exp.to_dataframe().set_index("sid")
    assert calls == {"1": 3, "2": 3}
    assert df.loc["1", "status"] == "ok" and df.loc["1", "task_attempts"] == 3
    assert df.loc["2", "error_type"] == "ConnectionError" and df.loc["2", "task_attempts"] == 3
    assert exp.wait_recorded(RECORDED_WITHIN)
    runs = {r.name: r for r in asyncio.run(_task_runs(exp.manifest["flow_run_id"]))}
    assert runs["flaky-1"].run_count == 3 and runs["flaky-1"].state_type.value == "COMPLETED"
    assert runs["flaky-2"].state_type.value == "FAILED"


def test_prefect_timeout_is_a_row_error(prefect_server: str, results_dir: Path) -> None:
    @task(timeout_seconds=0.5)
    async def hangs(row: Row) -> str:
        await asyncio.sleep(30 if row.sid == "1" else 0)
        return "done"

    exp = run_experiment("Timeouts", data=[{"x": 1}, {"x": 2}], task=hangs,
                         results_dir=results_dir, print_summary=False)
    df = exp.to_dataframe().set_index("sid")
    assert df.loc["1", "error_type"] == "TimeoutError"
    assert df.loc["2", "task_output"] == "done"


def test_experiment_inside_a_user_flow_is_a_subflow(prefect_server: str, results_dir: Path) -> None:
    from prefect import flow
    from prefect.context import FlowRunContext

    @flow
    def nightly() -> tuple[str, str]:
        ctx = FlowRunContext.get()
        assert ctx is not None
        exp = run_experiment("Nested", data=DATA[:2], task=shout_and_log, evaluators=[is_upper],
                             results_dir=results_dir, print_summary=False)
        return str(ctx.flow_run.id), exp.manifest["flow_run_id"]

    parent_id, child_id = nightly()

    async def read(flow_run_id: str) -> Any:
        async with get_client() as client:
            return await client.read_flow_run(flow_run_id)

    # Inside a flow run, the experiment returned only once Prefect held its records.
    child = asyncio.run(read(child_id))
    assert child_id != parent_id and child.parent_task_run_id is not None
    assert child.name.startswith("exp-") and child.state.type.value == "COMPLETED"
    runs = asyncio.run(_task_runs(child_id))
    assert len(runs) == 4
    # get_run_logger() in a step inside a user's flow: its record is on the call's task
    # run (once: Prefect does not send it to the parent flow run too).
    logs = asyncio.run(_logs_of([r.id for r in runs if r.name.startswith("shout_and_log-")]))
    assert sorted(logs) == ["shouting hello", "shouting world"]


async def _logs_of(task_run_ids: list[Any]) -> list[str]:
    from prefect.client.schemas.filters import LogFilter, LogFilterTaskRunId

    async with get_client() as client:
        found = await client.read_logs(LogFilter(task_run_id=LogFilterTaskRunId(any_=task_run_ids)))
    return [log.message for log in found]
