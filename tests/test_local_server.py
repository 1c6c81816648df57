"""Prefect's built-in server as this package starts it: a start-up timeout a slow machine
meets, one clear line when it still fails, and no server process left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, temporary_settings

from patronus_tasks.prefect.settings import SERVER_NICE

from .conftest import ROOT
from .prefect_servers import copy_database

ONE_ROW = """
from patronus_tasks import evaluator, run_experiment

@evaluator
def nonempty(evaluated_model_output: str) -> bool:
    return bool(evaluated_model_output)

run_experiment("slow-start", data=[{"evaluated_model_output": "x"}], evaluators=[nonempty])
"""

#: The nice value of each of the built-in server's threads, printed ("nices [...]").
NICES = """import glob, json
from patronus_tasks.prefect.server.local import built_in
tasks = glob.glob(f"/proc/{built_in().server_process.pid}/task/*/stat")
print("nices", json.dumps([int(open(t).read().rsplit(")", 1)[1].split()[16]) for t in tasks]))"""


def _local_server() -> Any:
    """The module, imported when a test needs it: it imports Prefect's whole server (~3.5 s
    of CPU, which every test process would spend collecting)."""
    from patronus_tasks.prefect.server import local as local_server

    return local_server


def test_start_up_timeout_is_generous_unless_the_user_set_one() -> None:
    assert _local_server()._startup_timeout(None) == _local_server().STARTUP_TIMEOUT >= 120
    with temporary_settings({PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: 7}):
        assert _local_server()._startup_timeout(None) == 7
    assert _local_server()._startup_timeout(30) == 30  # a caller's own (a test harness's)


def _processes_with(marker: str) -> list[int]:
    """Processes whose environment holds ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc")
@pytest.mark.heavy
def test_a_server_that_does_not_start_in_time_says_so_in_one_line_and_is_gone(
        tmp_path: Path) -> None:
    # The rows never wait for a server: the results are written; the recording says in
    # one line why nothing is on Prefect, and how many task runs that is.
    home = tmp_path / "fresh-home"  # a new database: migrations take far more than 1 s
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="1")
    out = subprocess.run([sys.executable, "-c", ONE_ROW], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Pass rate : 100.0%" in out.stdout and list(tmp_path.rglob("results.parquet"))
    said = [line for line in out.stderr.splitlines() if "built-in server" in line]
    assert len(said) == 1 and "did not answer within 1 s" in said[0], out.stderr[-3000:]
    assert "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS" in said[0]
    assert "`patronus-tasks server up`" in said[0]
    assert "Prefect did not record 1 task runs" in out.stderr.strip().splitlines()[-1]
    assert _processes_with(f"PREFECT_HOME={home}") == []
    assert (home / _local_server().LOG_FILE).exists()


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc")
@pytest.mark.heavy
def test_the_built_in_server_is_niced_and_dies_with_its_process(
        tmp_path: Path, prefect_template_db: Path) -> None:
    # Killed outright (no atexit), the process takes its server with it.
    script = ONE_ROW.replace('run_experiment(', 'import os, signal\n'
                             'from prefect.client.orchestration import get_client\n'
                             'from patronus_tasks.prefect import use_built_in_server\n'
                             'use_built_in_server()  # a script using Prefect itself opts in\n'
                             'get_client(sync_client=True)  # starts the server\n'
                             f'{NICES}\n'
                             'print("up", flush=True)\n'
                             'os.kill(os.getpid(), signal.SIGKILL)\nrun_experiment(')
    home = tmp_path / "home"
    copy_database(prefect_template_db, home)  # migrated: the server is up in seconds
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["PREFECT_HOME"] = str(home)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.startswith("nices"), out.stderr[-3000:]
    # Every thread of the server below the process's priority (not only its main one).
    nices = json.loads(out.stdout.splitlines()[0].split(" ", 1)[1])
    assert len(nices) > 1 and set(nices) == {min(SERVER_NICE + os.nice(0), 19)}, nices
    assert out.stdout.splitlines()[1] == "up", out.stderr[-3000:]
    for _ in range(100):
        if not _processes_with(f"PREFECT_HOME={home}"):
            break
        time.sleep(0.1)
    assert _processes_with(f"PREFECT_HOME={home}") == []


def test_the_servers_flush_intervals_are_whole_seconds_as_prefect_reads_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Prefect 3.8's services take int() of their flush interval: 0.5 s became sleep(0), a
    # loop that kept a core busy on an idle server. Read them the way the services do.
    from prefect.settings import Settings

    from patronus_tasks.prefect.settings import SERVER_DEFAULTS

    for name, value in SERVER_DEFAULTS.items():
        monkeypatch.setenv(name, value)
    services = Settings().server.services
    for service in (services.task_run_recorder, services.event_persister):
        assert int(service.flush_interval) >= 1, service
        assert int(service.flush_interval) == service.flush_interval, service
