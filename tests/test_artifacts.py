"""Prefect UI artifacts of an experiment, read back through the Prefect API."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

from patronus_tasks import evaluator, run_experiment, task
from patronus_tasks.prefect.ui.artifacts import artifact_key

from .conftest import RECORDED_WITHIN


@task
def maybe(evaluated_model_input: str) -> str:
    if evaluated_model_input == "x":
        raise ValueError("x | is | not | allowed")
    return evaluated_model_input


@evaluator
def short(evaluated_model_output: str) -> bool:
    return len(evaluated_model_output) < 3


async def _artifacts(keys: list[str]) -> dict[str, list[Any]]:
    async with get_client() as client:
        found = await client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=keys)))
    out: dict[str, list[Any]] = {}
    for a in found:
        out.setdefault(a.key, []).append(a)
    return out


def test_artifacts_keep_a_history_per_series(prefect_server: str, results_dir: Path) -> None:
    data = [{"evaluated_model_input": v} for v in ["ab", "abcd", "x", "a"]]
    runs = [run_experiment("UI Project", data=data, task=maybe, evaluators=[short],
                           experiment_name=name, results_dir=results_dir,
                           print_summary=False) for name in ("Nightly Eval", None)]
    assert all(r.wait_recorded(RECORDED_WITHIN) for r in runs)  # artifacts follow the results
    kinds = ["summary", "report", "results", "progress", "vs-previous", "charts"]
    keys = [artifact_key("UI Project", k) for k in kinds]  # run on its own: the project's
    assert keys[0] == "ui-project-summary"
    found = asyncio.run(_artifacts(keys))
    assert {k: len(v) for k, v in found.items()} == {k: 2 for k in keys}  # one per run
    flow_runs = {str(a.flow_run_id) for a in found[keys[0]]}
    assert flow_runs == {r.manifest["flow_run_id"] for r in runs}
    table = found[keys[0]][0].data
    rows = table if isinstance(table, list) else __import__("json").loads(table)
    assert rows[0]["evaluator"] == "short" and rows[0]["pass rate"] == "66.7%"
    assert rows[0]["results"] == 3 and rows[0]["task errors"] == 1
    report = found[keys[1]][0].data
    assert "| short | 66.7% | 2/3 |" in report and "## First errors" in report
    assert "x \\| is \\| not \\| allowed" in report  # table-safe message
    assert "## First failed evaluations" in report
    links = {a.data for a in found[keys[2]]}  # stored as markdown: [text](uri)
    host = socket.gethostname()  # a file:// link opens on its own machine only: say which
    assert links == {f"[{host}:{r.results_path}]({r.results_path.resolve().as_uri()})"
                     for r in runs}
    assert all(float(a.data) == 100.0 for a in found[keys[3]])


def test_a_history_table_that_is_not_json_reads_as_no_rows() -> None:
    # Read before this run's artifacts are posted: a broken one must not stop them.
    from patronus_tasks.prefect.ui.asking import read_table

    assert read_table('[{"started": "2026-11-27", "verdict": "Same"}') == []
    assert read_table('[{"started": "2026-11-27", "verdict": "Same"}]') == [
        {"started": "2026-11-27", "verdict": "Same"}]
