"""Real Prefect servers for the tests, on 127.0.0.1.

One server is shared by the whole session, xdist's workers included (`SessionServer`): it
starts in the background as soon as pytest is configured, so tests without Prefect run
while it migrates its new database (~20 s on 2 cores). Tests that need a server of their
own (services off, a restart) start from a copy of its freshly migrated database, which
spares them the migrations. These servers are Prefect's application under uvicorn with
every service and no UI (~6.5 s to start, against ~11 s for `prefect server start`, which
`server up` and its own test use).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from patronus_tasks.settings import SERVER_DEFAULTS

DB_FILE = "prefect.db"  # Prefect's default database, in PREFECT_HOME


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def copy_database(source: Path, home: Path) -> None:
    """``source`` (a live SQLite database) copied consistently into ``home``."""
    home.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(source) as src, sqlite3.connect(home / DB_FILE) as dst:
        src.backup(dst)


@dataclass
class Server:
    """A Prefect server process of a test, in ``home`` on ``port``."""

    home: Path
    port: int
    pid: int = 0

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def start(self, timeout: float = 120) -> Server:
        """Start it (again, on the same database and port, after `kill`)."""
        import prefect

        env = {**SERVER_DEFAULTS, **os.environ, "PREFECT_HOME": str(self.home),
               "PREFECT_UI_ENABLED": "0"}
        env.pop("PREFECT_API_URL", None)
        with (self.home / "server.log").open("ab") as log:
            self.pid = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "--app-dir", str(prefect.__module_path__.parent),
                 "--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1",
                 "--port", str(self.port), "--log-level", "error", "--lifespan", "on"],
                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True).pid
        self._wait(timeout)
        return self

    def _wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.api_url}/health", timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"no Prefect server on {self.api_url} after {timeout} s; "
                           f"see {self.home / 'server.log'}")

    def kill(self) -> None:
        """Kill it outright (SIGKILL): what it had queued in memory is lost."""
        self.stop(grace=0)

    def stop(self, grace: float = 2.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds; reaped either way."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGTERM if grace else signal.SIGKILL)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and os.waitpid(self.pid, os.WNOHANG) == (0, 0):
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


@contextlib.contextmanager
def api_of(url: str) -> Iterator[None]:
    """This process's Prefect API is ``url`` meanwhile.

    Prefect's events worker (which carries its task engine's events) is one per process,
    bound to the API it first saw: begun here, it would send every later test's events to
    this server, gone by then (the engine's task runs of a later test never arrived). So
    it is drained on the way out, and the next one is made for the API then current."""
    from prefect.events.worker import EventsWorker
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: url}):
        try:
            yield
        finally:
            EventsWorker.drain_all(timeout=10, at_exit=False)


def start_server(home: Path, template: Path | None = None) -> Server:
    """A server of its own in ``home`` (services as the environment says), from a copy of
    ``template`` when given."""
    if template is not None:
        copy_database(template, home)
    home.mkdir(parents=True, exist_ok=True)
    return Server(home, free_port()).start()


#: Where the session's server is (``port:home``), for xdist's workers: they inherit it from
#: the process that started the server.
_SHARED = "PATRONUS_TESTS_SESSION_SERVER"


class SessionServer:
    """The session's shared server: started once, by the first pytest process (xdist's
    controller, before its workers exist, or the only process), in a background thread;
    xdist's workers find it through `_SHARED`. One server, one migration (~15 s of CPU),
    however many workers."""

    def __init__(self) -> None:
        self.home, self.port = Path(), 0
        self.owner = False
        self.server: Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def template(self) -> Path:
        return self.home.parent / f"{self.home.name}-template" / DB_FILE

    @property
    def _ready(self) -> Path:
        return self.template.parent / "ready"

    @property
    def _failed(self) -> Path:
        return self.home / "failed-to-start"

    def begin(self) -> None:
        """Start it, unless it is started already (here, or by the process that started
        this one)."""
        if self._thread is not None or os.environ.get(_SHARED):
            return
        self.home = Path(tempfile.mkdtemp(prefix="patronus-tasks-server-"))
        self.port, self.owner = free_port(), True
        os.environ[_SHARED] = f"{self.port}:{self.home}"
        self._thread = threading.Thread(target=self._start, name="session-prefect-server",
                                        daemon=True)
        self._thread.start()

    def _start(self) -> None:
        try:
            self.server = Server(self.home, self.port)
            self.server.start()
            copy_database(self.home / DB_FILE, self.template.parent)
            self._ready.touch()
        except BaseException as exc:
            with contextlib.suppress(OSError):  # stopped meanwhile: its home is gone
                self._failed.write_text(f"{type(exc).__name__}: {exc}")

    def wait(self, timeout: float = 300) -> Server:
        """The server, once it is up and its template database made."""
        if not self.owner:
            port, home = os.environ[_SHARED].split(":", 1)
            self.home, self.port = Path(home), int(port)
        deadline = time.monotonic() + timeout
        while not self._ready.exists() and time.monotonic() < deadline:
            if self._failed.exists():
                raise RuntimeError("the session's Prefect server did not start: "
                                   + self._failed.read_text())
            time.sleep(0.2)
        if not self._ready.exists():
            raise RuntimeError(f"the session's Prefect server did not start in {timeout} s")
        return self.server or Server(self.home, self.port)

    def _starting(self) -> bool:
        alive = self._thread is not None and self._thread.is_alive()
        return alive and not (self.server is not None and self.server.pid)

    def stop(self) -> None:
        """Stop it, if this process started it (it does not wait for one still starting)."""
        if not self.owner:
            return
        deadline = time.monotonic() + 5  # started a moment ago: its process is on its way
        while self._starting() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.server is not None and self.server.pid:
            self.server.stop(grace=2)  # its database is thrown away: no need to wait long
        shutil.rmtree(self.home, ignore_errors=True)
        shutil.rmtree(self.template.parent, ignore_errors=True)
