"""The README's main job, run as a user would, on Prefect's built-in local server, in a new
PREFECT_HOME: the run migrates its new database, as on a fresh machine.
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


def _kept(home: Path, flow_run_id: str) -> dict[str, int]:
    """What the built-in server's database keeps of the flow run, besides its task runs."""
    with sqlite3.connect(home / "prefect.db") as db:
        return {table: int(db.execute(f"SELECT count(*) FROM {table} WHERE {column} = ?",
                                      (flow_run_id,)).fetchone()[0])
                for table, column in (("flow_run", "id"), ("artifact", "flow_run_id"),
                                      ("log", "flow_run_id"))} | {
            "events": int(db.execute("SELECT count(*) FROM events").fetchone()[0])}


def _env(home: Path) -> dict[str, str]:
    # No Prefect settings of ours: no API URL, so the built-in server.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["PREFECT_HOME"] = str(home)
    return env


def test_main_job_prints_summary_and_keeps_every_task_run(tmp_path: Path) -> None:
    home = tmp_path / "prefect-home"
    home.mkdir()
    env = _env(home)
    out = subprocess.run([sys.executable, str(ROOT / "flows" / "text_to_sql.py")], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "result_matches_gold [link 0]" in out.stdout and "same_query [link 0]" in out.stdout
    assert "Samples: 12   Task errors: 1   Evaluator errors: 0   Skipped tasks: 2" in out.stdout
    path = Path(out.stdout.split("Results: ")[1].split()[0])
    assert path.is_file() and (tmp_path / "results") in path.parents
    table = pq.read_table(path)
    assert table.num_rows == 12 - 3 + 9 * 2 - 9 + 3  # 9 rows x 2 evaluators + 3 task-only
    manifest = json.loads((path.parent / "manifest.json").read_text())
    assert manifest["rows"] == 12 and manifest["task_errors"] == 1
    # The built-in server stopped with the process; every task run must be in its database,
    # and what is read later (the flow run, its artifacts and logs); no event was stored
    # (the event persister, half the server's CPU per call, is off).
    assert _recorded(home, manifest["flow_run_id"]) == 12 + 9 * 2
    kept = _kept(home, manifest["flow_run_id"])
    assert kept["flow_run"] == 1 and kept["artifact"] >= 5 and kept["log"] >= 1, kept
    assert kept["events"] == 0, kept
    assert "runs on Prefect's built-in server" in out.stderr  # and how to keep one instead
    assert "patronus-tasks server up" in out.stderr
