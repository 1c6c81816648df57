"""Rows spread over a Dask LocalCluster of two worker processes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pyarrow.parquet as pq
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

from patronus_tasks import run_experiment

from .dask_steps import said_row, where


def test_rows_on_two_dask_worker_processes(prefect_server: str, results_dir: Path) -> None:
    exp = run_experiment("dask", data=[{"x": i} for i in range(40)], task=where,
                         evaluators=[said_row], experiment_name="spread", backend="dask",
                         results_dir=results_dir, print_summary=False, max_concurrency=4)
    table = pq.read_table(exp.results_path)
    sids = table.column("sid").to_pylist()
    assert sorted(sids, key=int) == [str(i) for i in range(1, 41)]  # every row, once
    assert all(table.column("pass").to_pylist())
    pids = {json.loads(m)["pid"] for m in table.column("task_metadata").to_pylist()}
    assert len(pids) >= 2  # calls executed in more than one process
    assert exp.manifest["rows"] == 40 and len(exp.manifest["worker_pids"]) >= 2
    assert not (exp.path / "parts").exists()

    async def runs() -> list[str]:
        async with get_client() as client:
            found = await client.read_task_runs(flow_run_filter=FlowRunFilter(
                id=FlowRunFilterId(any_=[exp.manifest["flow_run_id"]])))
            return [r.name for r in found]

    names = asyncio.run(runs())
    assert {f"where-{i}" for i in range(1, 41)} <= set(names)
    assert {f"said_row-{i}" for i in range(1, 41)} <= set(names)
    assert len([n for n in names if n.startswith("batch-")]) >= 2
