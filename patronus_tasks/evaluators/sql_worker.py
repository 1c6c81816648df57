"""The processes DuckDB queries of the SQL sandbox run in (`sql_child`): long-lived, at
most ``PATRONUS_TASKS_SQL_WORKERS`` (4) per database and process, each with its address
space capped at ``PATRONUS_TASKS_SQL_WORKER_MEMORY`` (2 GiB). A query goes to an idle
worker (a new one is started while fewer are running, else it waits for one, within its
timeout); at the timeout the worker is interrupted (SIGUSR1) and, if it has not answered
within `GRACE`, killed (SIGKILL): the next query starts a fresh one. A worker that dies
(past its memory) is that row's fail; the others go on. Measured (2 cores under load):
the hand-over through the pipes costs ~0.15 ms a query (`SELECT 1`: 0.33 ms against 0.18
in-process), a worker ~0.3 s to start.
"""

from __future__ import annotations

import datetime
import decimal
import io
import json
import os
import pickle
import re
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
import zoneinfo
from dataclasses import dataclass
from typing import Any

from patronus_tasks.evaluators.sql_bounds import Limits, QueryRefused, ResultTooLarge, SandboxUnavailable
from patronus_tasks.evaluators.sql_child import receive, send
from patronus_tasks.exceptions import ConfigError

GRACE = 0.25  # seconds an interrupted query has to answer before its worker is killed
_START_WAIT = 60.0  # a worker that is not ready by then (a machine swapping) failed to start
_FLOOR = 3 << 29  # 1.5 GiB: DuckDB alone reserves ~0.7 GB of address space once connected
_OVERHEAD = 1 << 30  # what a worker needs outside DuckDB's memory_limit: its code, Python, reservations
#: What a worker inherits (no key reaches one); TZ: DuckDB's time zone is the process's,
#: so a query's timestamps with time zone read as they would here.
_ENV = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "LANG", "LC_ALL", "SYSTEMROOT", "TZ")


@dataclass(frozen=True)
class Settings:
    memory: int = 2 << 30  # bytes of address space per worker (RLIMIT_AS)
    workers: int = 4  # per database and process: the DuckDB side is at most workers x memory

    @property
    def memory_limit(self) -> str:
        return f"{(self.memory - _OVERHEAD) >> 20}MiB"

    @property
    def said(self) -> str:
        return f"{_size(self.memory)} (PATRONUS_TASKS_SQL_WORKER_MEMORY)"


def settings() -> Settings:
    """The environment's, read when a database's workers are made: a wrong value is a
    ConfigError naming the variable."""
    memory = os.environ.get("PATRONUS_TASKS_SQL_WORKER_MEMORY", "2GiB")
    workers = os.environ.get("PATRONUS_TASKS_SQL_WORKERS", "4")
    found = re.fullmatch(r"\s*(\d+)\s*([kmgt]i?b?)?\s*", memory, re.I)
    size = int(found[1]) * 1024 ** " kmgt".index((found[2] or " ")[0].lower()) if found else 0
    if size < _FLOOR:
        raise ConfigError(f"PATRONUS_TASKS_SQL_WORKER_MEMORY={memory!r}: give a size of at least "
                          "1.5GiB (bytes, or with KiB, MiB, GiB), e.g. 2GiB")
    if not workers.strip().isdigit() or int(workers) < 1:
        raise ConfigError(f"PATRONUS_TASKS_SQL_WORKERS={workers!r}: give a whole number of at least 1")
    return Settings(size, int(workers))


def _size(n: int) -> str:
    return f"{n / (1 << 30):g} GiB"


class Died(Exception):
    """The worker ended without answering (killed past its memory, or crashed)."""


class Worker:
    """One process (`sql_child`) and its pipes."""

    def __init__(self, path: str, setup: Settings) -> None:
        boot = ("import sys, json; a = json.loads(sys.argv[1]); sys.path[:] = a.pop('sys_path'); "
                "from patronus_tasks.evaluators.sql_child import main; main(a)")
        args = {"sys_path": sys.path, "path": path, "memory": setup.memory,
                "memory_limit": setup.memory_limit}
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-c", boot, json.dumps(args)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0,
            env={k: os.environ[k] for k in _ENV if k in os.environ})
        try:
            ready = self.receive(time.monotonic() + _START_WAIT)
        except Died:
            ready = ("error", "Died", f"exit code {self.proc.poll()}")
        except BaseException:  # an answer that is not one: the process is not left behind
            self.kill()
            raise
        if ready is None or ready[0] != "ready":
            self.kill()
            said = f"{ready[1]}: {ready[2]}" if ready else f"not ready in {_START_WAIT:g} s"
            raise ConfigError(f"sql_result_match: the DuckDB worker did not start ({said}); with "
                              f"{setup.said} of address space")

    def ask(self, request: tuple[Any, ...]) -> None:
        try:
            send(self.proc.stdin.fileno(), request)  # type: ignore[union-attr]
        except OSError:  # BrokenPipe: it died between queries
            raise Died from None

    def receive(self, deadline: float) -> tuple[Any, ...] | None:
        """The worker's answer; None if none came by ``deadline``."""
        fd = self.proc.stdout.fileno()  # type: ignore[union-attr]
        poll = select.poll()  # select() refuses a descriptor past 1023: a process with many files
        poll.register(fd, select.POLLIN)
        if not poll.poll(max(0.0, deadline - time.monotonic()) * 1000):
            return None
        try:
            body = receive(fd)
        except EOFError:
            self.proc.wait()
            raise Died from None
        answer: tuple[Any, ...] = _Values(io.BytesIO(body)).load()
        return answer

    def interrupt(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGUSR1)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


class Workers:
    """A database's workers in this process: at most ``setup.workers``, idle ones kept."""

    def __init__(self, path: str, setup: Settings) -> None:
        self.path, self.setup, self.cond = path, setup, threading.Condition()
        self.idle: list[Worker] = []
        self.running, self.closed = 0, False

    def run(self, query: str, limits: Limits) -> tuple[list[tuple[Any, ...]], int]:
        start = time.monotonic()
        worker, starting = self._asked((query, limits.max_rows, limits.max_bytes),
                                       start + limits.timeout)
        deadline = start + starting + limits.timeout  # a worker's start is not the query's time
        keep = False
        try:
            answer = worker.receive(deadline)
            if answer is None:
                worker.interrupt()
                late = worker.receive(time.monotonic() + GRACE)
                # Kept only when the signal is spent: a result that raced it leaves it
                # pending, to interrupt the worker's next query.
                keep = late is not None and late[1] == "InterruptException"
                raise TimeoutError(f"ran past its {limits.timeout:g} s (timeout=), "
                                   + ("interrupted" if keep else "its worker process killed"))
            keep = True
            return _result(answer, self.setup)
        except Died:
            raise ResultTooLarge(f"its worker process ended (exit code {worker.proc.returncode}): "
                                 f"past its memory limit, {self.setup.said}?") from None
        finally:
            self._give(worker, keep)

    def _asked(self, request: tuple[Any, ...], deadline: float) -> tuple[Worker, float]:
        """A worker that has ``request``, and the seconds its start took. An idle worker
        that ended between queries (killed from outside) never got it: a fresh one does,
        and the query is not blamed for it."""
        worker, starting = self._take(deadline)
        try:
            worker.ask(request)
            return worker, starting
        except Died:
            self._give(worker, False)
        worker, more = self._take(deadline)
        try:
            worker.ask(request)
        except Died:
            self._give(worker, False)
            raise SandboxUnavailable("its DuckDB worker ended before it was sent the query, "
                                     "twice: the query never ran") from None
        return worker, starting + more

    def _take(self, deadline: float) -> tuple[Worker, float]:
        with self.cond:
            while not self.idle and self.running >= self.setup.workers:
                if not self.cond.wait(deadline - time.monotonic()):
                    raise SandboxUnavailable(
                        f"waited past its timeout for one of the {self.setup.workers} DuckDB "
                        "workers of this database: the query never ran (raise "
                        "PATRONUS_TASKS_SQL_WORKERS, or run fewer rows at once)")
            if self.idle:
                return self.idle.pop(), 0.0
            self.running += 1
        started = time.monotonic()
        try:
            return Worker(self.path, self.setup), time.monotonic() - started
        except BaseException:
            self._give(None, False)
            raise

    def _give(self, worker: Worker | None, keep: bool) -> None:
        with self.cond:
            if keep and worker is not None and not self.closed:
                self.idle.append(worker)
                worker = None
            else:
                self.running -= 1
            self.cond.notify()
        if worker is not None:
            worker.kill()

    def close(self) -> None:
        """Idle workers killed now, busy ones when their query ends."""
        with self.cond:
            self.closed, idle, self.idle = True, self.idle, []
            self.running -= len(idle)
        for worker in idle:
            worker.kill()


def _result(answer: tuple[Any, ...], setup: Settings) -> tuple[list[tuple[Any, ...]], int]:
    kind = answer[0]
    if kind == "rows":
        return answer[1], answer[2]
    if kind == "sandbox":
        raise (QueryRefused if answer[1] == "QueryRefused" else ResultTooLarge)(answer[2])
    if kind == "memory":
        raise ResultTooLarge(f"past its worker's memory limit, {setup.said}: "
                             f"{answer[1]}: {answer[2].splitlines()[0] if answer[2] else ''}")
    raise _error(answer[1])(answer[2])


_ERRORS: dict[str, type[Exception]] = {}


def _error(name: str) -> type[Exception]:
    """DuckDB's error, by its name (the message says which: `Catalog Error: ...`)."""
    if name not in _ERRORS:
        _ERRORS[name] = type(name, (RuntimeError,), {"__module__": "duckdb"})
    return _ERRORS[name]


_ALLOWED = {("datetime", n) for n in ("datetime", "date", "time", "timedelta", "timezone")} | {
    ("uuid", "UUID"), ("decimal", "Decimal"), ("zoneinfo", "ZoneInfo")}
_MODULES = {"datetime": datetime, "uuid": uuid, "decimal": decimal, "zoneinfo": zoneinfo}


class _Values(pickle.Unpickler):
    """What a worker sends: rows of DuckDB's values and nothing that runs code (a worker
    a query got control of could otherwise send this process any call)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return getattr(_MODULES[module], name)
        if (module, name) == ("builtins", "getattr"):
            return _zone_getattr  # ZoneInfo pickles as getattr(ZoneInfo, '_unpickle')
        raise pickle.UnpicklingError(f"a worker sent {module}.{name}: not a value of a row")


def _zone_getattr(owner: Any, name: str) -> Any:
    if owner is zoneinfo.ZoneInfo and name == "_unpickle":
        return zoneinfo.ZoneInfo._unpickle  # type: ignore[attr-defined]
    raise pickle.UnpicklingError(f"a worker sent getattr({owner!r}, {name!r})")
