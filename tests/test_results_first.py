"""Results first: an experiment returns once its rows are done and its results written;
Prefect's records follow in the background, and the process waits for them at exit.

The Prefect server here is real; what is played is a server slow to take events: posts
of events fail until the test releases them (`held_records.hold`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from patronus_tasks.integrations.prefect import recorder as _recorder

from . import held_records
from .test_recording import _count

HERE = Path(__file__).resolve().parent
CALLS = held_records.ROWS * 2


def _prefect_part(exp_dir: Path) -> dict[str, Any]:
    return dict(json.loads((exp_dir / "manifest.json").read_text())["prefect"])


@pytest.fixture
def release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Posts of events held back in this process until the returned file exists."""
    monkeypatch.setattr(_recorder._Poster, "_send", _recorder._Poster._send)
    monkeypatch.setattr(_recorder, "_BATCH_EVENTS", _recorder._BATCH_EVENTS)
    held_records.hold(tmp_path / "release")
    return tmp_path / "release"


def test_experiment_returns_with_its_results_before_prefect_has_the_records(
        prefect_server: str, results_dir: Path, release: Path) -> None:
    exp = held_records.run(results_dir)
    assert len(exp.to_dataframe()) == CALLS  # every result, already
    assert exp.manifest["status"] == "completed"
    assert _prefect_part(exp.path) == {"task_runs": CALLS, "task_runs_recorded": 0,
                                       "task_runs_lost": 0, "complete": False}
    assert _count(exp.manifest["flow_run_id"]) == 0
    release.touch()
    assert exp.wait_recorded(60)
    assert _count(exp.manifest["flow_run_id"]) == CALLS
    assert _prefect_part(exp.path)["complete"] is True


def test_a_later_run_in_the_same_folder_keeps_its_manifest(
        prefect_server: str, results_dir: Path, release: Path) -> None:
    # The first run's records still on their way must not write its manifest over the
    # resumed run's.
    first = held_records.run(results_dir)
    again = held_records.run(results_dir, resume=True)
    assert again.path == first.path
    release.touch()
    assert first.wait_recorded(60) and again.wait_recorded(60)
    manifest = json.loads((again.path / "manifest.json").read_text())
    assert manifest["flow_run_id"] == again.manifest["flow_run_id"] != first.manifest["flow_run_id"]
    assert manifest["prefect"]["task_runs"] == 0  # the resumed run called nothing


def _start(tmp_path: Path, prefect_server: str, *lose_after: int) -> tuple[Any, Path, Path]:
    """The experiment in a process of its own: (process, release file, its stderr)."""
    release, stderr = tmp_path / "release", tmp_path / "stderr.txt"
    env = {**os.environ, "PREFECT_API_URL": prefect_server}
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "held_records.py"), str(tmp_path / "results"), str(release),
         *map(str, lose_after)], env=env, stdout=subprocess.PIPE, stderr=stderr.open("w"), text=True)
    return proc, release, stderr


def _returned(proc: Any) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("returned "), line
    return str(line.split()[1])


def _until(check: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_the_process_exits_only_once_prefect_has_every_record(
        prefect_server: str, tmp_path: Path) -> None:
    proc, release, stderr = _start(tmp_path, prefect_server)
    try:
        flow_run_id = _returned(proc)
        _until(lambda: "Waiting for Prefect to record" in stderr.read_text())
        assert f"{CALLS} of {CALLS} task runs of held/" in stderr.read_text()
        assert proc.poll() is None  # still there, waiting
        release.touch()
        assert proc.wait(60) == 0
    finally:
        proc.kill()
    assert "Prefect has recorded every task run." in stderr.read_text()
    assert _count(flow_run_id) == CALLS


def test_killed_while_catching_up_keeps_every_row_and_says_what_prefect_holds(
        prefect_server: str, tmp_path: Path) -> None:
    proc, _, _ = _start(tmp_path, prefect_server, 1)
    try:
        flow_run_id = _returned(proc)
        exp_dir = next((tmp_path / "results" / "held").iterdir())
        _until(lambda: _prefect_part(exp_dir)["task_runs_recorded"] > 0)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        proc.kill()
    table = pq.read_table(exp_dir / "results.parquet")
    assert table.num_rows == CALLS and sorted(set(table.column("sid").to_pylist()), key=int) \
        == [str(i) for i in range(1, held_records.ROWS + 1)]
    held = _count(flow_run_id)
    assert 0 < held < CALLS
    assert _prefect_part(exp_dir) == {"task_runs": CALLS, "task_runs_recorded": held,
                                      "task_runs_lost": 0, "complete": False}
