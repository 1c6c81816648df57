"""Prefect's built-in server, started so that a fresh machine meets it and nothing outlives it.

With no ``PREFECT_API_URL``, Prefect starts a private server process for the first API
call of a process (`internal.SubprocessASGIServer`). Three things about
its own start-up fail on a fresh 2-core machine: it waits 20 s, and a new database takes
~19 s of migrations; each thread that asks during a failed start spawns another process,
and all but the last outlive the caller; and its processes inherit the caller's pipes.

`LocalServer` takes the place of Prefect's default instance (`install`, when Prefect loads
its server module, see `hook`: Prefect looks that instance up by key, so every
caller, a user's own ``@flow`` included, gets this one). It starts one process under a
lock, waits `STARTUP_TIMEOUT` (unless
``PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS`` is set), passes the settings for
many task runs (`SERVER_DEFAULTS`, where unset) to that process only, runs it below normal
CPU priority once it is up, logs to a file under ``PREFECT_HOME``, and kills it on failure. On Linux the
process also dies with this one, even when this one is killed.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from prefect.settings import get_current_settings

from patronus_tasks.exceptions import ExperimentError
from patronus_tasks.prefect import internal
from patronus_tasks.prefect.internal import SubprocessASGIServer
from patronus_tasks.prefect.settings import (
    BUILT_IN_SERVER_OFF,
    PERSISTER_SETTING,
    SERVER_DEFAULTS,
    SERVER_NICE,
)
from patronus_tasks.run import background as _background

logger = logging.getLogger("patronus_tasks")
#: Seconds to wait for the server: a new database took 18.6-19.0 s to migrate on a quiet
#: 2-core machine, more under load; Prefect's own 20 s default fails there.
STARTUP_TIMEOUT = 120
TIMEOUT_SETTING = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
LOG_FILE = "built-in-server.log"
_PORT_IN_USE = 3  # uvicorn's exit code when its port is taken
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child: SIGTERM when the thread that started it ends (Linux only)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _lower_priority(pid: int) -> None:
    """Once it is up, the server records `SERVER_NICE` below this process's CPU priority. Not
    while it starts: a new database's migrations (~20 s of CPU), niced on a machine
    busy with other work, got a tenth of a core and missed any time limit.

    Every thread of it (`stack.processes.renice`; imported here, once: the stack's
    package is not otherwise needed by a script's built-in server)."""
    from patronus_tasks.prefect.server.stack.processes import renice

    with contextlib.suppress(OSError, AttributeError):
        renice(pid, min(os.getpriority(os.PRIO_PROCESS, 0) + SERVER_NICE, 19))  # below ours


def _startup_timeout(given: float | None) -> float:
    """``given``, else the user's setting if they made one, else `STARTUP_TIMEOUT`."""
    if given:
        return float(given)
    ephemeral = get_current_settings().server.ephemeral
    if "startup_timeout_seconds" in ephemeral.model_fields_set:
        return float(ephemeral.startup_timeout_seconds)
    return float(STARTUP_TIMEOUT)


def server_env() -> dict[str, str]:
    """The server process's environment: ours, the settings for many task runs and the
    services it does without where unset, and this process's Prefect settings (its
    database among them)."""
    env = {**SERVER_DEFAULTS, **BUILT_IN_SERVER_OFF, **os.environ}
    env.update(get_current_settings().to_environment_variables(exclude_unset=True))
    env.update(PREFECT_UI_ENABLED="0", **internal.BUILT_IN_SERVER_ENV)
    return env


class LocalServer(SubprocessASGIServer):
    """Prefect's built-in server, started once per process (see the module's doc)."""

    _lock = threading.Lock()
    started_in = 0.0  # seconds the last start took
    persisting = True  # whether its event persister runs (`server_env`)
    hinted = False  # whether an experiment said it runs here (`hint`)

    def start(self, timeout: float | None = None) -> None:
        with self._lock:
            if self.running:
                return
            wait = _startup_timeout(timeout)
            began = time.monotonic()
            self._spawn_until_up(wait)
            self.persisting = server_env()[PERSISTER_SETTING].lower() not in ("false", "0", "no")
            self.running = True
            self.started_in = time.monotonic() - began
            import atexit

            atexit.register(self.stop)

    def _spawn_until_up(self, wait: float) -> None:
        deadline = time.monotonic() + wait
        while True:
            port = self.port = self.find_available_port()
            self.server_process = self._spawn(port)
            code = self._wait_healthy(deadline)
            if code is None:
                _lower_priority(self.server_process.pid)
                return
            self._kill()
            if code != _PORT_IN_USE or time.monotonic() >= deadline:
                raise ExperimentError(self._failure(wait, code))

    def _spawn(self, port: int) -> subprocess.Popen[Any]:
        """The server process, started from a thread that lives as long as it does (the
        child's death signal follows the thread that started it, not the process)."""
        started: list[subprocess.Popen[Any]] = []
        ready = threading.Event()
        log = self.log_path
        log.parent.mkdir(parents=True, exist_ok=True)

        def keeper() -> None:
            with log.open("ab") as out:
                proc = subprocess.Popen(
                    internal.server_command(port), env=server_env(),
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    preexec_fn=_die_with_parent)
            started.append(proc)
            ready.set()
            proc.wait()

        threading.Thread(target=keeper, name="prefect-built-in-server", daemon=True).start()
        ready.wait()
        return started[0]

    @property
    def log_path(self) -> Path:
        return Path(get_current_settings().home) / LOG_FILE

    def _wait_healthy(self, deadline: float) -> int | None:
        """None once the server answers; its exit code if it exits; -1 past ``deadline``."""
        assert self.server_process is not None
        with httpx.Client(timeout=2) as client:
            while time.monotonic() < deadline:
                code = self.server_process.poll()
                if code is not None:
                    return code
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.api_url}/health").status_code == 200:
                        return None
                time.sleep(0.1)
        return -1

    def _failure(self, wait: float, code: int) -> str:
        what = (f"did not answer within {wait:.0f} s" if code == -1
                else f"exited with code {code} while starting")
        return (f"Prefect's built-in server {what} (log: {self.log_path}); raise {TIMEOUT_SETTING}, "
                "or run a server of your own: `patronus-tasks server up`, then "
                "`eval \"$(patronus-tasks server env)\"` (its API's URL and auth string)")

    def _kill(self) -> None:
        proc = self.server_process
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=5)  # it finishes migrating before it heeds SIGTERM
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        self.server_process = None

    def stop(self) -> None:
        if self.server_process is not None:
            _background.drain()  # records still on their way to it come first
        with self._lock:
            self._kill()
            self.running = False
            internal.forget_built_in_server(self)
        install()  # a later call in this process starts a server again


def install() -> None:
    """Make `LocalServer` the instance Prefect uses for its built-in server, unless one
    already exists (a running server, or a test harness's)."""
    if internal.built_in_server() is None:
        LocalServer(None)


def built_in() -> LocalServer | None:
    """This process's built-in server, if it runs one."""
    found = internal.built_in_server()
    return found if isinstance(found, LocalServer) and found.running else None
