"""Prefect's own processes in the stack: the API (one process, or several behind one
port), the background services (inside the API process, or in their own when Redis
carries the events between them), the work pool, the deployments and a process worker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx

from patronus_tasks.exceptions import ExperimentError
from patronus_tasks.prefect import internal
from patronus_tasks.prefect.settings import (
    SERVER_DEFAULTS,
    client_auth_settings,
    redis_settings,
    server_auth_settings,
)

from . import auth
from .processes import Proc, spawn, wait_for

POOL = "local-process"
#: Prefect's background services (settings `server.services.*`) but `EVENT_SERVICES`. One
#: Prefect adds later runs in both services processes until it is named here or there.
SERVICES = ("cancellation_cleanup", "db_vacuum", "foreman", "late_runs", "scheduler",
            "pause_expirations", "repossessor", "cleanup_reconciler", "task_run_recorder")


def server_env(home: Path, database_url: str | None, redis_url: str | None,
               asks: dict[str, str]) -> dict[str, str]:
    """The environment of the server processes: the settings for many task runs (where
    the user set none), the database and Redis they share, and ``asks``
    (`server_auth_settings`: over the user's, so that nothing set in the shell opens it)."""
    env = {**SERVER_DEFAULTS, **os.environ, "PREFECT_HOME": str(home), **asks}
    env.pop("PREFECT_API_URL", None)
    if database_url:
        env["PREFECT_API_DATABASE_CONNECTION_URL"] = database_url
    if redis_url:
        env.update(redis_settings(redis_url))
        env["PREFECT_API_DATABASE_MIGRATE_ON_START"] = "false"  # done by `prepare`
        env["PREFECT_API_BLOCKS_REGISTER_ON_START"] = "false"
    return env


def client_env(home: Path, api_url: str, auth_string: str | None) -> dict[str, str]:
    """A client's environment (the worker, ``prefect deploy``): the stack's API and its
    auth string (None: a stack started before it had one)."""
    asks = client_auth_settings(auth_string) if auth_string else {}
    return {**os.environ, "PREFECT_HOME": str(home), "PREFECT_API_URL": api_url, **asks}


def asking(auth_string: str, host: str, port: int) -> dict[str, str]:
    """The server settings that make it ask who you are (`server_auth_settings`)."""
    return server_auth_settings(auth_string, auth.ui_origins(host, port))


def prefect(*args: str) -> list[str]:
    return [sys.executable, "-m", "prefect", *args]


def run(args: list[str], env: dict[str, str], cwd: Path, what: str = "") -> None:
    out = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        what = what or f"`{' '.join(args[2:])}`"
        raise ExperimentError(f"{what} failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")


def prepare(env: dict[str, str], cwd: Path) -> None:
    """Migrate the database and register Prefect's block types."""
    run([sys.executable, "-c", internal.PREPARE_DATABASE], env, cwd,
        "migrating the Prefect database")


def start_api(home: Path, env: dict[str, str], host: str, port: int, processes: int,
              services_apart: bool, nice: int) -> Proc:
    """``prefect server start`` on ``host``: with several processes (uvicorn's workers on
    one port, replaced when one dies), or services apart, it runs no services."""
    args = ["server", "start", "--host", host, "--port", str(port)]
    if processes > 1:
        args += ["--workers", str(processes)]
    elif services_apart:
        args.append("--no-services")
    url = f"http://{auth.reached_at(host)}:{port}/api"
    proc = Proc("api", url=url, argv=prefect(*args), log=str(home / "server.log"))
    return spawn(proc, {"PREFECT_UI_API_URL": auth.ui_api_url(host, url), **env}, home, nice)


#: The services that take every event apart from the task-run recorder (which makes task
#: runs visible): storing them (the UI's event feed), automations' triggers and actions.
EVENT_SERVICES = ("event_persister", "triggers", "event_logger")


def _without(others: tuple[str, ...]) -> dict[str, str]:
    """Settings for a services process that runs none of ``others`` (the rest as the user
    or Prefect's defaults set them) and no live event stream: it feeds the websockets of
    an API process; a services process serves none, yet Prefect 3.9 runs it there too,
    reading every event (8-10% of each one's CPU)."""
    return {f"PREFECT_SERVER_SERVICES_{name.upper()}_ENABLED": "false" for name in others} \
        | {"PREFECT_API_EVENTS_STREAM_OUT_ENABLED": "false"}


def start_services(home: Path, env: dict[str, str], nice: int) -> list[Proc]:
    """Prefect's background services in two processes: ``events`` runs `EVENT_SERVICES`,
    ``services`` the rest. In one, the task-run recorder shared an event loop with the
    event persister, whose flushes spend 41% of their CPU in pendulum's datetime
    arithmetic (asyncpg encoding Prefect's DateTimes, Python < 3.13)."""
    rest = Proc("services", argv=prefect("server", "services", "start"),
                log=str(home / "services.log"))
    events = Proc("events", argv=prefect("server", "services", "start"),
                  log=str(home / "events.log"))
    return [spawn(rest, {**env, **_without(EVENT_SERVICES)}, home, nice),
            spawn(events, {**env, **_without(SERVICES)}, home, nice)]


def wait_healthy(api: Proc, timeout: float) -> None:
    wait_for(lambda: _healthy(api.url), api, timeout, "the Prefect API server")


def _healthy(api_url: str) -> bool:
    try:
        return httpx.get(f"{api_url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def api_processes(api: Proc) -> list[int]:
    """The processes serving the API when there are several (uvicorn's workers)."""
    from .processes import children, command_line

    if api.pid is None:
        return []
    return [pid for pid in children(api.pid) if "multiprocessing.spawn" in command_line(pid)]


def pool_and_deployments(home: Path, api_url: str, auth_string: str, project: Path,
                         deploy: bool) -> None:
    env = client_env(home, api_url, auth_string)
    run(prefect("work-pool", "create", POOL, "--type", "process", "--overwrite"), env, project)
    if deploy:
        run(prefect("--no-prompt", "deploy", "--all"), env, project)


def start_worker(home: Path, api_url: str, auth_string: str | None, project: Path) -> Proc:
    proc = Proc("worker", argv=prefect("worker", "start", "--pool", POOL),
                log=str(home / "worker.log"))
    return spawn(proc, client_env(home, api_url, auth_string), project)
