"""Results first: an experiment returns once its rows are done and its results written;
Prefect's records follow from the recorder process, and the process waits for them at exit.

The Prefect server here is real; what is played is a server slow to take events: a gate
in front of it (`prefect_gate`) answers posts of events 503 until the test releases it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from prefect.client.orchestration import get_client

from . import held_records
from .conftest import RECORDED_WITHIN
from .prefect_gate import Gate
from .test_recording import _count
from .waits import sids_written, until

HERE = Path(__file__).resolve().parent
CALLS = held_records.ROWS * 2


def _manifest(exp_dir: Path) -> dict[str, Any]:
    return dict(json.loads((exp_dir / "manifest.json").read_text()))


@pytest.fixture
def gate(prefect_gate: Gate) -> Gate:
    """Posts of events held (503) until ``gate.release()``; this process's API meanwhile."""
    prefect_gate.held = True
    return prefect_gate


def test_experiment_returns_with_its_results_before_prefect_has_the_records(
        results_dir: Path, gate: Gate) -> None:
    exp = held_records.run(results_dir)
    assert len(exp.to_dataframe()) == CALLS  # every result, already
    assert exp.manifest.status == "completed"
    flow_run_id = held_records.flow_run_of(exp)
    assert until(lambda: _manifest(exp.path).get("prefect"), "the manifest's Prefect figures") == {
        "task_runs": CALLS, "task_runs_recorded": 0, "task_runs_lost": 0, "complete": False}
    assert _count(flow_run_id) == 0 and not exp.wait_recorded(0.1)
    gate.release()
    assert exp.wait_recorded(RECORDED_WITHIN)
    assert _count(flow_run_id) == CALLS
    assert _manifest(exp.path)["prefect"]["complete"] is True
    # The object is current, as the file is: every task run recorded, complete.
    prefect = exp.manifest.prefect
    assert prefect is not None and (prefect.task_runs_recorded, prefect.complete) == (CALLS, True)
    assert exp.manifest.to_json() == _manifest(exp.path)


def test_a_later_run_in_the_same_folder_keeps_its_manifest(results_dir: Path, gate: Gate) -> None:
    # The first run's records still on their way must not write its manifest over the
    # resumed run's.
    first = held_records.run(results_dir)
    again = held_records.run(results_dir, resume=True)
    assert again.path == first.path
    gate.release()
    assert first.wait_recorded(RECORDED_WITHIN) and again.wait_recorded(RECORDED_WITHIN)
    manifest = _manifest(again.path)
    assert manifest["flow_run_id"] == again.manifest.flow_run_id != first.manifest.flow_run_id
    assert manifest["prefect"]["task_runs"] == 0  # the resumed run called nothing


def _start(tmp_path: Path, gate: Gate, pause: float = 0.0) -> tuple[Any, Path]:
    """The experiment in a process of its own, against the gate: (process, its stderr)."""
    stderr = tmp_path / "stderr.txt"
    env = {**os.environ, "PREFECT_API_URL": gate.url}
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "held_records.py"), str(tmp_path / "results"), str(pause)],
        env=env, stdout=subprocess.PIPE, stderr=stderr.open("w"), text=True)
    return proc, stderr


def _said(proc: Any, what: str) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith(what), line
    return line.removeprefix(what).strip()


def test_the_process_exits_only_once_prefect_has_every_record(tmp_path: Path, gate: Gate) -> None:
    proc, stderr = _start(tmp_path, gate)
    try:
        _said(proc, "rows done")
        flow_run_id = _said(proc, "flow run")
        until(lambda: "Waiting for Prefect to record" in stderr.read_text(), "the wait said")
        assert f"{CALLS} of {CALLS} task runs of held/" in stderr.read_text()
        assert proc.poll() is None  # still there, waiting
        gate.release()
        assert proc.wait(60) == 0
    finally:
        proc.kill()
    assert "Prefect has recorded every task run." in stderr.read_text()
    assert _count(flow_run_id) == CALLS


async def _state(flow_run_id: str) -> tuple[str, str]:
    async with get_client() as client:
        run = await client.read_flow_run(flow_run_id)
    return run.state.type.value, run.state.message or ""


def test_killed_after_its_rows_its_records_still_reach_prefect(tmp_path: Path, gate: Gate) -> None:
    # Killed outright while Prefect catches up: every row is in the results, and the
    # recorder process, handed every call already, records them all once it can.
    proc, _ = _start(tmp_path, gate)
    try:
        _said(proc, "rows done")
        flow_run_id = _said(proc, "flow run")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        proc.kill()
    exp_dir = next((tmp_path / "results" / "held").iterdir())
    table = pq.read_table(exp_dir / "results.parquet")
    assert table.num_rows == CALLS and sorted(set(table.column("sid").to_pylist()), key=int) \
        == [str(i) for i in range(1, held_records.ROWS + 1)]
    assert _count(flow_run_id) == 0
    gate.release()
    until(lambda: asyncio.run(_state(flow_run_id))[0] == "COMPLETED", "the flow run completed")
    assert _count(flow_run_id) == CALLS


def test_killed_mid_run_its_flow_run_ends_crashed(tmp_path: Path, gate: Gate) -> None:
    # Killed while its rows run: the rows done are kept (a resume goes on from them); the
    # recorder process records the calls it was handed and ends the flow run Crashed.
    gate.release()
    proc, _ = _start(tmp_path, gate, pause=1.0)  # ~15 s of rows
    try:
        exp_dir = until(lambda: next((tmp_path / "results" / "held").glob("*"), None), "its folder")
        flow_run_id = until(lambda: (exp_dir / "manifest.json").exists()
                            and _manifest(exp_dir).get("flow_run_id"), "its flow run")
        until(lambda: sids_written(exp_dir), "a row written")  # a row done: its calls handed on
        assert _manifest(exp_dir)["status"] == "running"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        proc.kill()
    state, message = until(lambda: (found := asyncio.run(_state(flow_run_id)))[0] != "RUNNING"
                           and found, "the flow run's end")
    assert state == "CRASHED" and "process ended before its rows were done" in message
    assert 0 < _count(flow_run_id) < CALLS  # the rows done before: ~4 a second


def test_a_wait_line_is_said_again_only_when_it_changed(capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The same "Waiting for ..." every 5 s looked like a hang: said when it changes, else
    every 20 s, with the time waited."""
    from patronus_tasks.run import background

    clock = [100.0]
    monkeypatch.setattr(background.time, "monotonic", lambda: clock[0])
    line = background.WaitLine("Waiting for {what} ({seconds:.0f} s so far)")
    for at, what in ((100, "9 of 9"), (105, "9 of 9"), (110, "4 of 9"), (125, "4 of 9"), (131, "4 of 9")):
        clock[0] = at
        line.say(what)
    said = [s.removeprefix("patronus-tasks: ") for s in capsys.readouterr().err.splitlines()]
    assert said == ["Waiting for 9 of 9 (0 s so far)", "Waiting for 4 of 9 (10 s so far)",
                    "Waiting for 4 of 9 (31 s so far)"]


_EXIT_SCRIPT = '''
import atexit, gc, sys
from pathlib import Path

# Registered first, so it runs last: after the package's own exit hooks.
atexit.register(lambda: print("frozen", gc.get_freeze_count() > 0, flush=True))

from patronus_tasks import evaluator, run_experiment

class Dropped:  # garbage in a cycle at exit: its finalizer must still run
    def __init__(self): self.me = self
    def __del__(self): Path(sys.argv[2]).write_text("finalized")

@evaluator
def nonempty(evaluated_model_output: str) -> bool:
    return bool(evaluated_model_output)

run_experiment("exits", data=[{"evaluated_model_output": "x"}], evaluators=[nonempty],
               backend="local", results_dir=sys.argv[1], print_summary=False)
Dropped()
'''


def test_a_script_exits_without_the_collectors_full_passes_and_still_finalizes(
        tmp_path: Path) -> None:
    # After a run, the interpreter's teardown walked every object several times (0.3-0.4 s
    # of a 10-row script's exit); the package freezes what is alive once the garbage there
    # is has been collected, so a finalizer of an unreachable cycle still runs.
    flag = tmp_path / "flag"
    done = subprocess.run([sys.executable, "-c", _EXIT_SCRIPT, str(tmp_path / "results"), str(flag)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "frozen True" in done.stdout, done.stdout + done.stderr
    assert flag.read_text() == "finalized"
