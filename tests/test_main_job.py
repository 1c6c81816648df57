"""The README's main job, run as a user would, on Prefect's built-in local server.

Both tests use one new PREFECT_HOME: the first run migrates its new database, as on a
fresh machine; the second finds it migrated, as every later run does.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from .conftest import ROOT

# Handed out early (conftest.SLOWEST), and whole by one worker (`--dist loadfile`).
pytestmark = pytest.mark.heavy

FINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


def _recorded(home: Path, flow_run_id: str) -> int:
    """Task runs of the flow run in a final state, read from the built-in server's database
    once its process is gone (a server started only to count would take seconds)."""
    with sqlite3.connect(home / "prefect.db") as db:
        query = (f"SELECT count(*) FROM task_run WHERE flow_run_id = ? "
                 f"AND state_type IN ({', '.join('?' * len(FINAL))})")
        return int(db.execute(query, (flow_run_id, *FINAL)).fetchone()[0])


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("prefect-home")


def _env(home: Path) -> dict[str, str]:
    # No Prefect settings of ours: no API URL, so the built-in server.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["PREFECT_HOME"] = str(home)
    return env


def test_main_job_prints_summary_and_keeps_every_task_run(tmp_path: Path, home: Path) -> None:
    env = _env(home)
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
    assert _recorded(home, manifest["flow_run_id"]) == 12 + 9 * 2
    assert "runs on Prefect's built-in server" in out.stderr  # and how to keep one instead
    assert "patronus-tasks server up" in out.stderr


MANY = """
from patronus_tasks import evaluator, run_experiment, task

@task
def echo(evaluated_model_input: str) -> str:
    return evaluated_model_input

@evaluator
def nonempty(evaluated_model_output: str) -> bool:
    return bool(evaluated_model_output)

exp = run_experiment("many", data=[{"evaluated_model_input": str(i)} for i in range(120)],
                     task=echo, evaluators=[nonempty], max_concurrency=32, print_summary=False)
exp.wait_recorded(240)  # the flow run is made in the background: its id follows
print(exp.manifest["flow_run_id"])
"""


def _kept(home: Path, flow_run_id: str) -> dict[str, int]:
    """What the built-in server's database keeps of the flow run, besides its task runs."""
    with sqlite3.connect(home / "prefect.db") as db:
        return {table: int(db.execute(f"SELECT count(*) FROM {table} WHERE {column} = ?",
                                      (flow_run_id,)).fetchone()[0])
                for table, column in (("flow_run", "id"), ("artifact", "flow_run_id"),
                                      ("log", "flow_run_id"))} | {
            "events": int(db.execute("SELECT count(*) FROM events").fetchone()[0])}


def test_built_in_server_keeps_hundreds_of_task_runs_after_exit(tmp_path: Path, home: Path) -> None:
    env = _env(home)
    run = subprocess.run([sys.executable, "-c", MANY], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    flow_run_id = run.stdout.strip().splitlines()[-1]
    assert _recorded(home, flow_run_id) == 240
    # Lean: what is read later (flow run, its artifacts and logs) is there; no event was
    # stored (the event persister, half the server's CPU per call, is off).
    kept = _kept(home, flow_run_id)
    assert kept["flow_run"] == 1 and kept["artifact"] >= 5 and kept["log"] >= 1
    assert kept["events"] == 0
