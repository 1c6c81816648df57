"""A local Prefect stack in one command: server, work pool, deployments, worker.

``patronus-tasks server up`` starts a Prefect server on 127.0.0.1 (its database under
``--home``, default ``./.prefect``) with the settings for many task runs, at a lower CPU
priority (`SERVER_NICE`) than the experiments it records, creates the
``local-process`` work pool, deploys ``prefect.yaml`` and starts a process worker. The
process ids go to ``<home>/stack.json``; ``server down`` stops them, ``server status``
tells whether they run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from patronus_tasks.exceptions import ExperimentError
from patronus_tasks.settings import SERVER_DEFAULTS, SERVER_NICE

POOL = "local-process"
STATE_FILE = "stack.json"


@dataclass
class Stack:
    """What `up` started: URLs, process ids and log files."""

    api_url: str
    ui_url: str
    home: str
    server_pid: int
    worker_pid: int | None = None

    def save(self) -> None:
        Path(self.home, STATE_FILE).write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, home: Path) -> Stack | None:
        path = home / STATE_FILE
        return cls(**json.loads(path.read_text())) if path.exists() else None


def _env(home: Path, api_url: str | None = None) -> dict[str, str]:
    env = {**SERVER_DEFAULTS, **os.environ, "PREFECT_HOME": str(home)}
    env.pop("PREFECT_API_URL", None)
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return env


def _prefect(*args: str) -> list[str]:
    return [sys.executable, "-m", "prefect", *args]


def _spawn(args: list[str], env: dict[str, str], log: Path, cwd: Path, nice: int = 0) -> int:
    with log.open("ab") as out:
        proc = subprocess.Popen(args, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=_niceness(nice))
    return proc.pid


def _niceness(nice: int) -> Callable[[], None] | None:
    if nice <= 0 or not hasattr(os, "nice"):
        return None

    def lower() -> None:  # runs in the child, before the server starts
        os.nice(nice)

    return lower


def _wait_healthy(api_url: str, pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            raise ExperimentError("the Prefect server exited while starting; see its log")
        try:
            if httpx.get(f"{api_url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise ExperimentError(f"the Prefect server did not answer on {api_url} within {timeout:.0f} s")


def _run(args: list[str], env: dict[str, str], cwd: Path) -> None:
    out = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise ExperimentError(f"`{' '.join(args[2:])}` failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")


def up(project: Path, home: Path, port: int = 4200, *, deploy: bool = True,
       worker: bool = True, timeout: float = 120.0, nice: int = SERVER_NICE) -> Stack:
    """Start server, work pool, deployments and worker; return what was started.

    The server runs ``nice`` steps below normal CPU priority (0: the same as the worker).
    """
    home = home.resolve()
    home.mkdir(parents=True, exist_ok=True)
    api_url, ui_url = f"http://127.0.0.1:{port}/api", f"http://127.0.0.1:{port}"
    server_args = _prefect("server", "start", "--host", "127.0.0.1", "--port", str(port))
    # The UI finds the API from PREFECT_UI_API_URL, which Prefect derives from its port
    # setting (4200), not from --port: on another port the UI could not reach its API.
    server_env = {"PREFECT_UI_API_URL": api_url, **_env(home)}
    server_pid = _spawn(server_args, server_env, home / "server.log", project, nice)
    stack = Stack(api_url, ui_url, str(home), server_pid)
    stack.save()
    try:
        _wait_healthy(api_url, stack.server_pid, timeout)
        env = _env(home, api_url)
        _run(_prefect("work-pool", "create", POOL, "--type", "process", "--overwrite"), env, project)
        if deploy:
            _run(_prefect("--no-prompt", "deploy", "--all"), env, project)
        if worker:
            stack.worker_pid = _spawn(_prefect("worker", "start", "--pool", POOL), env,
                                      home / "worker.log", project)
            stack.save()
    except BaseException:
        down(home)
        raise
    return stack


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child counts as gone.
    try:
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return True


def _stop(pid: int, grace: float = 15.0) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def down(home: Path, grace: float = 15.0) -> Stack | None:
    """Stop what `up` started (worker first), by process id, killing what is still up
    after ``grace`` seconds; forget it."""
    stack = Stack.load(home.resolve())
    if stack is None:
        return None
    for pid in (stack.worker_pid, stack.server_pid):
        if pid:
            _stop(pid, grace)
    (home.resolve() / STATE_FILE).unlink(missing_ok=True)
    return stack


def status(home: Path) -> dict[str, bool] | None:
    """Which of the stack's processes are alive, or None when none was started."""
    stack = Stack.load(home.resolve())
    if stack is None:
        return None
    return {"server": _alive(stack.server_pid),
            "worker": bool(stack.worker_pid) and _alive(stack.worker_pid or 0)}
