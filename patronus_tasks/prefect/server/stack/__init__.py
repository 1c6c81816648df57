"""A Prefect stack in one command: ``patronus-tasks server up``.

Two shapes (`Topology`), both below normal CPU priority for the server side
(`SERVER_NICE`), the API on 127.0.0.1 (or ``host``) asking for its auth string (`auth`),
then (unless neither is wanted) the ``local-process`` work pool,
``prefect deploy --all`` and a process worker:

- one ``prefect server start``, its services inside, on SQLite in ``home`` (default) or
  on PostgreSQL (``postgres``);
- Prefect's scaled topology (its guide "How to scale self-hosted Prefect"): PostgreSQL
  and Redis (each a given URL, or a local server started here), the database migrated
  once, the API in ``api_processes`` processes on one port, the background services in
  two processes of their own (``events``: the event persister and triggers; ``services``:
  the task-run recorder and the rest).

Every process started is recorded in ``<home>/stack.json`` (role, pid, URL, command line;
never a password); `down` stops each by its pid, `status` tells which run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from patronus_tasks.exceptions import ConfigError
from patronus_tasks.prefect.settings import SERVER_NICE
from patronus_tasks.record.location import redact

from . import auth, broker, database, servers
from .processes import Proc, Stopped, alive, answers, children, lower, port_taken, stop
from .servers import POOL

__all__ = ["LOCAL", "POOL", "SERVER_NICE", "ProcStatus", "Stack", "Topology", "alive", "down",
           "restart", "status", "up", "up_again"]

STATE_FILE = "stack.json"
#: ``--postgres local`` / ``--redis local``: a server started here, its data in ``home``.
LOCAL = "local"


@dataclass(frozen=True)
class Topology:
    """Where the server keeps its state and how many API processes serve it.

    ``postgres`` and ``redis``: None (SQLite in ``home``; Prefect's in-memory broker,
    services in the API process), `LOCAL`, or a URL."""

    postgres: str | None = None
    redis: str | None = None
    api_processes: int = 1

    @classmethod
    def production(cls, api_processes: int = 2) -> Topology:
        """PostgreSQL and Redis started here, ``api_processes`` API processes."""
        return cls(LOCAL, LOCAL, api_processes)

    def check(self) -> None:
        """A `ConfigError` for a combination Prefect cannot run."""
        if self.api_processes < 1:
            raise ConfigError("--api-processes must be 1 or more")
        if self.api_processes > 1 and not (self.postgres and self.redis):
            raise ConfigError(
                f"--api-processes {self.api_processes} needs --postgres and --redis: Prefect's "
                "API processes share their database and events through them "
                "(e.g. --postgres local --redis local)")
        if self.redis and not self.postgres:
            raise ConfigError(
                "--redis needs --postgres: the background services then run in a process "
                "of their own beside the API, sharing its database, which Prefect supports "
                "on PostgreSQL only (e.g. --postgres local --redis local)")


@dataclass
class Stack:
    """What `up` started: the API's URLs and every process (`Proc`), in start order."""

    api_url: str
    ui_url: str
    home: str
    procs: list[Proc] = field(default_factory=list)
    project: str = ""  # the folder the worker runs in (a worker started again runs there)

    def save(self) -> None:
        Path(self.home, STATE_FILE).write_text(json.dumps(asdict(self), indent=2))

    def add(self, proc: Proc) -> Proc:
        self.procs.append(proc)
        self.save()
        return proc

    def get(self, role: str) -> Proc | None:
        return next((p for p in self.procs if p.role == role), None)

    @property
    def server_pid(self) -> int | None:
        api = self.get("api")
        return api.pid if api else None

    @property
    def worker_pid(self) -> int | None:
        worker = self.get("worker")
        return worker.pid if worker else None

    @classmethod
    def load(cls, home: Path) -> Stack | None:
        path = home / STATE_FILE
        return cls.from_json(json.loads(path.read_text())) if path.exists() else None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Stack:
        if "server_pid" in data:  # written before the scaled topology: a server, a worker
            procs = [Proc("api", data["server_pid"], data["api_url"]),
                     *([Proc("worker", data["worker_pid"])] if data.get("worker_pid") else [])]
        else:
            procs = [Proc(**p) for p in data["procs"]]
        return cls(data["api_url"], data["ui_url"], data["home"], procs, data.get("project", ""))


def up(project: Path, home: Path, port: int = 4200, *, topology: Topology = Topology(),
       deploy: bool = True, worker: bool = True, timeout: float = 180.0,
       nice: int = SERVER_NICE, host: str = auth.LOOPBACK) -> Stack:
    """Start the stack, its API on ``host``; return what was started. A missing piece is
    a `ConfigError` before anything starts; on any failure, what was started is stopped."""
    topology.check()
    home = home.resolve()
    home.mkdir(parents=True, exist_ok=True)
    if Stack.load(home) is not None:
        raise ConfigError(f"a stack is already recorded in {home}; run `patronus-tasks "
                          "server down` first")
    reached = auth.reached_at(host)
    if port_taken(port, reached.strip("[]")):
        raise ConfigError(f"port {port} on {reached} is taken: stop what listens there, "
                          "or choose another with --port")
    _check_pieces(topology)
    if deploy and not (project / "prefect.yaml").is_file():
        raise ConfigError(f"no prefect.yaml in {project.resolve()} to deploy: run this from the "
                          "project's folder, or pass --no-deploy for a server and worker alone")
    secret = auth.auth_string(home)  # before anything starts: one others may read is refused
    stack = Stack(f"http://{reached}:{port}/api", f"http://{reached}:{port}", str(home),
                  project=str(project.resolve()))
    stack.save()
    try:
        _start(stack, project, (host, port), secret, topology, deploy, worker, timeout, nice)
    except BaseException:
        down(home)
        raise
    return stack


def up_again(home: Path, project: Path) -> list[Proc] | None:
    """`up` where a stack is recorded: None when none is (or none of it runs: then it is
    forgotten, as by `down`); otherwise the workers started again (none: it all runs).
    A dead worker is only a worker (the server keeps every run): it is started again
    where it ran. Anything else stopped is the user's to look at (its log) before
    `server down` and `up`: a `ConfigError` naming it."""
    stack = Stack.load(home.resolve())
    if stack is None:
        return None
    stopped = [p for p in stack.procs if not _running(p)]
    started_here = [p for p in stack.procs if not p.external]  # a given server may still answer
    if all(p in stopped for p in started_here):  # none runs (a reboot): afresh, as after `down`
        down(home)
        return None
    others = [p for p in stopped if p.role != "worker"]
    if others:
        named = ", ".join(f"{p.role} (pid {p.pid}, log {p.log})" if p.pid else f"{p.role} ({p.url})"
                          for p in others)
        raise ConfigError(f"the stack recorded in {stack.home} is not all running: {named} "
                          "stopped. Look at its log, then run `patronus-tasks server down` "
                          "and `server up` again")
    started, secret = [], auth.read(Path(stack.home))
    for proc in stopped:
        started.append(servers.start_worker(Path(stack.home), stack.api_url, secret,
                                            Path(stack.project) if stack.project else project))
        stack.procs[stack.procs.index(proc)] = started[-1]
        stack.save()
    return started


def _check_pieces(topology: Topology) -> None:
    """Everything the topology needs is there (binaries, packages, given servers)."""
    if topology.postgres == LOCAL:
        database.binaries()
        database.as_non_root()
    elif topology.postgres:
        database.check(database.normalize(topology.postgres))
    if topology.redis == LOCAL:
        broker.require_prefect_redis()
        broker.server_binary()
    elif topology.redis:
        broker.check(topology.redis)


def _start(stack: Stack, project: Path, where: tuple[str, int], secret: str,
           topology: Topology, deploy: bool, worker: bool, timeout: float, nice: int) -> None:
    home = Path(stack.home)
    # Started at this process's priority, lowered by ``nice`` once up (`processes.lower`).
    db_url = _store(stack, "postgres", topology.postgres, database.start_local, 0)
    redis_url = _store(stack, "redis", topology.redis, broker.start_local, 0)
    env = servers.server_env(home, db_url, redis_url, servers.asking(secret, *where))
    api = stack.add(servers.start_api(home, env, *where, topology.api_processes,
                                      bool(redis_url), 0))
    if redis_url:  # the API processes start meanwhile: they touch no table until asked
        servers.prepare(env, home)
        for proc in servers.start_services(home, env, 0):
            stack.add(proc)
    servers.wait_healthy(api, timeout)
    lower(stack.procs, nice)
    auth.require_asking(stack.api_url)
    if deploy or worker:  # neither: the server alone
        servers.pool_and_deployments(home, stack.api_url, secret, project, deploy)
    if worker:
        stack.add(servers.start_worker(home, stack.api_url, secret, project))


def _store(stack: Stack, role: str, given: str | None, start: Callable[[Path, int], Proc],
           nice: int) -> str | None:
    """The URL of PostgreSQL or Redis: started here (`LOCAL`), or the given one."""
    if given is None:
        return None
    if given == LOCAL:
        return str(stack.add(start(Path(stack.home), nice)).url)
    url = database.normalize(given) if role == "postgres" else given
    stack.add(Proc(role, url=redact(url)))
    return url


def down(home: Path, grace: float = 15.0,
         on_stopped: Callable[[Stopped], None] | None = None) -> Stack | None:
    """Stop what `up` started, last started first, each by its pid (killed if still up
    after ``grace`` seconds; ``on_stopped`` hears how each went); forget it."""
    stack = Stack.load(home.resolve())
    if stack is None:
        return None
    for proc in reversed(stack.procs):
        stopped = stop(proc, _grace(proc, grace))
        if on_stopped is not None and proc.pid is not None:
            on_stopped(stopped)
    (home.resolve() / STATE_FILE).unlink(missing_ok=True)
    return stack


#: Seconds a worker running no flow run gets to stop: it has nothing to finish, and on a
#: loaded machine Prefect's worker sometimes never ends after its SIGTERM handler turned
#: the signal into SIGINT (seen in the suite: killed after the whole grace, 15 s).
IDLE_WORKER_GRACE = 5.0


def _grace(proc: Proc, grace: float) -> float:
    """``grace``, or less for a worker with no flow-run process of its own."""
    if proc.role == "worker" and proc.pid is not None and not children(proc.pid):
        return min(grace, IDLE_WORKER_GRACE)
    return grace


@dataclass(frozen=True)
class ProcStatus:
    """One line of `status`: a process of the stack (or a server it uses: pid None)."""

    role: str
    pid: int | None
    running: bool
    url: str = ""


def status(home: Path) -> list[ProcStatus] | None:
    """Every process of the stack, the API's several processes apart; None when no
    stack is recorded in ``home``."""
    stack = Stack.load(home.resolve())
    if stack is None:
        return None
    found: list[ProcStatus] = []
    for proc in stack.procs:
        found.append(ProcStatus(proc.role, proc.pid, _running(proc), proc.url))
        if proc.role == "api":
            found += [ProcStatus("api process", pid, alive(pid))
                      for pid in servers.api_processes(proc)]
    return found


def _running(proc: Proc) -> bool:
    if not proc.external:
        return proc.running()
    parts = urlsplit(proc.url)  # a given server: does it take connections?
    default = 5432 if proc.role == "postgres" else 6379
    return bool(parts.hostname) and answers(parts.hostname or "", parts.port or default)


def restart(home: Path, role: str) -> Proc:
    """Stop the local PostgreSQL or Redis (``role``) if it runs and start it again on the
    same port and data, once it answers."""
    stack = Stack.load(home.resolve())
    proc = stack.get(role) if stack else None
    if stack is None or proc is None or proc.external or role not in _LOCAL_STARTS:
        raise ConfigError(f"no local {role} recorded in {home} to restart")
    stop(proc)
    port = urlsplit(proc.url).port
    # A killed Valkey's child (its AOF rewrite, its background save) holds the listening
    # socket until it is gone too: starting again at once failed "Address already in use".
    deadline = time.monotonic() + 10
    while port is not None and port_taken(port) and time.monotonic() < deadline:
        time.sleep(0.1)
    again = _LOCAL_STARTS[role](Path(stack.home), proc.nice, port)
    stack.procs[stack.procs.index(proc)] = again
    stack.save()
    return again


_LOCAL_STARTS = {"postgres": database.start_local, "redis": broker.start_local}
