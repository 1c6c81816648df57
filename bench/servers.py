"""The Prefect servers the bench records to (`bench.py --server`), each on a fresh home:

- ``builtin``: one ``prefect server start`` on SQLite with the built-in server's settings
  (`SERVER_DEFAULTS`, and the services it runs without: `BUILT_IN_SERVER_OFF`), below
  normal CPU priority: what an experiment's built-in server is, at a URL the bench reads;
- ``up``: ``patronus-tasks server up``'s server (the library's `stack.up`, no pool,
  deployments or worker): the same shape, started the way users start it;
- ``production1`` / ``production2``: ``server up --production`` with 1 or 2 API
  processes: PostgreSQL and Valkey started here, the services in their own process.

A server's CPU is that of every process it started and their children (PostgreSQL's
backends, the API's workers).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from patronus_tasks.prefect.server import stack  # noqa: E402
from patronus_tasks.prefect.settings import BUILT_IN_SERVER_OFF, SERVER_DEFAULTS, SERVER_NICE  # noqa: E402

SERVERS = ["builtin", "up", "production1", "production2"]


@dataclass
class Server:
    kind: str
    api_url: str
    roles: dict[str, list[int]]  # its processes by role (postgres, redis, api, services)
    stop: Callable[[], None]

    @property
    def pids(self) -> list[int]:
        return [pid for pids in self.roles.values() for pid in pids]


def port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def nice() -> int:
    return int(os.environ.get("BENCH_SERVER_NICE", SERVER_NICE))  # as `server up` does


def start(kind: str, home: Path) -> Server:
    if kind == "builtin":
        return _builtin(home)
    topology = {"up": stack.Topology(), "production1": stack.Topology.production(1),
                "production2": stack.Topology.production(2)}[kind]
    started = stack.up(ROOT, home, port(), topology=topology, deploy=False, worker=False,
                       nice=nice())
    roles: dict[str, list[int]] = {}
    for proc in started.procs:
        roles.setdefault(proc.role, []).extend([proc.pid] if proc.pid else [])
    # It asks who you are: every process the bench starts meanwhile gives its auth string.
    os.environ["PREFECT_API_AUTH_STRING"] = stack.auth.read(home) or ""

    def stop() -> None:
        stack.down(home)
        os.environ.pop("PREFECT_API_AUTH_STRING", None)

    return Server(kind, started.api_url, roles, stop)


def _builtin(home: Path) -> Server:
    api_port = port()
    env = {**os.environ, **SERVER_DEFAULTS, **BUILT_IN_SERVER_OFF, "PREFECT_HOME": str(home)}
    env.pop("PREFECT_API_URL", None)
    log = (home / "server.log").open("ab")  # read it for "dropping" if records go missing
    api = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host",
                            "127.0.0.1", "--port", str(api_port)], env=env,
                           stdout=log, stderr=subprocess.STDOUT, preexec_fn=_lower(nice()))
    api_url = f"http://127.0.0.1:{api_port}/api"
    wait(f"{api_url}/health", api)

    def stop() -> None:
        api.terminate()
        api.wait(20)

    return Server("builtin", api_url, {"api": [api.pid]}, stop)


def _lower(nice: int) -> Any:
    if os.environ.get("BENCH_SERVER_IDLE"):  # experiment: SCHED_IDLE instead of nice
        return lambda: os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    return (lambda: os.nice(nice)) if nice else None


def wait(url: str, proc: subprocess.Popen[bytes], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server for {url} exited")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.3)
    raise SystemExit(f"{url} did not come up")


def tree_cpu(pids: list[int]) -> float:
    """CPU seconds used so far by these processes and their children."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for p in tree:
            try:
                times = p.cpu_times()
                total += times.user + times.system
            except psutil.NoSuchProcess:
                pass
    return total


def settle(pids: list[int], window: float = 2.0, idle: float = 0.05,
           timeout: float = 300) -> None:
    """Wait until these processes (and children) used under ``idle`` of a core for ``window``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = tree_cpu(pids)
        time.sleep(window)
        if tree_cpu(pids) - before < idle * window:
            return
