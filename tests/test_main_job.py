"""The README's main job, run as a user would, on Prefect's built-in local server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from .conftest import ROOT

COUNT = """
import asyncio, sys
from patronus_tasks._prefect import count_task_runs
print(asyncio.run(count_task_runs(sys.argv[1])))
"""


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PREFECT_") or k.startswith("PREFECT_SERVER_")}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    return env


def test_main_job_prints_summary_and_keeps_every_task_run(tmp_path: Path) -> None:
    env = _env(tmp_path)
    out = subprocess.run([sys.executable, str(ROOT / "flows" / "text_to_sql.py")], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "result_matches_gold [link 0]" in out.stdout and "row_overlap [link 0]" in out.stdout
    assert "Samples: 12   Task errors: 1   Evaluator errors: 0   Skipped tasks: 2" in out.stdout
    path = Path(out.stdout.split("Results: ")[1].split()[0])
    assert path.is_file() and (tmp_path / "results") in path.parents
    table = pq.read_table(path)
    assert table.num_rows == 12 - 3 + 9 * 2 - 9 + 3  # 9 rows x 2 evaluators + 3 task-only
    manifest = json.loads((path.parent / "manifest.json").read_text())
    assert manifest["rows"] == 12 and manifest["task_errors"] == 1
    # The built-in server stopped with the process; every task run must be in its database.
    count = subprocess.run([sys.executable, "-c", COUNT, manifest["flow_run_id"]], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=300)
    assert count.returncode == 0, count.stderr[-3000:]
    assert int(count.stdout.strip().splitlines()[-1]) == 12 + 9 * 2


MANY = """
from patronus_tasks import evaluator, run_experiment, task

@task
def echo(evaluated_model_input: str) -> str:
    return evaluated_model_input

@evaluator
def nonempty(evaluated_model_output: str) -> bool:
    return bool(evaluated_model_output)

exp = run_experiment("many", data=[{"evaluated_model_input": str(i)} for i in range(200)],
                     task=echo, evaluators=[nonempty], max_concurrency=32, print_summary=False)
print(exp.manifest["flow_run_id"])
"""


def test_built_in_server_keeps_hundreds_of_task_runs_after_exit(tmp_path: Path) -> None:
    env = _env(tmp_path)
    run = subprocess.run([sys.executable, "-c", MANY], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    flow_run_id = run.stdout.strip().splitlines()[-1]
    count = subprocess.run([sys.executable, "-c", COUNT, flow_run_id], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
    assert int(count.stdout.strip().splitlines()[-1]) == 400, count.stderr[-2000:]
