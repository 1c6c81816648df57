"""Real Prefect servers for the tests, on 127.0.0.1.

Prefect ships a harness (`prefect.testing.utilities.prefect_test_harness`): a server on a
new database per process, waited for (~20 s of migrations on 2 cores, for each xdist
worker), with Prefect's ephemeral settings. Here one server serves the whole session,
xdist's workers included (`SessionServer`), with every service on and the settings for
many task runs (`SERVER_DEFAULTS`): the first pytest process starts it in the background
as soon as it is configured, and tests without Prefect run while it migrates. Its freshly
migrated database is kept as a template: tests that need a server of their own (services
off, a restart) start from a copy of it, which spares them the migrations.
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
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from patronus_tasks.prefect import internal
from patronus_tasks.prefect.settings import SERVER_DEFAULTS

DB_FILE = "prefect.db"  # Prefect's default database, in PREFECT_HOME
#: Where the session's server is (``port:pid:home``), for xdist's workers: they inherit it
#: from the process that started it.
_SHARED = "PATRONUS_TESTS_SESSION_SERVER"
#: The session server's process: its database migrated (and block types registered), a
#: copy kept as the template, then served; one process, so Prefect is imported once.
_MIGRATE_COPY_SERVE = f"""
import os, sqlite3, sys, uvicorn
template, port = sys.argv[1], int(sys.argv[2])
exec({internal.PREPARE_DATABASE!r})
database = os.path.join(os.environ["PREFECT_HOME"], "{DB_FILE}")
with sqlite3.connect(database) as src, sqlite3.connect(template) as dst:
    src.backup(dst)
uvicorn.run("{internal.SERVER_MODULE}:create_app", factory=True, host="127.0.0.1", port=port,
            log_level="error", lifespan="on")
"""


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
    prepared: bool = False  # its database migrated and its block types registered already

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def start(self, timeout: float = 120) -> Server:
        """Start it (again, on the same database and port, after `kill`)."""
        self.spawn(internal.server_command(self.port))
        return self.wait(timeout)

    def spawn(self, argv: list[str]) -> None:
        env = {**SERVER_DEFAULTS, **os.environ, "PREFECT_HOME": str(self.home),
               "PREFECT_UI_ENABLED": "0"}
        env.pop("PREFECT_API_URL", None)
        if self.prepared:  # (the session server's process prepares its template first)
            env.update(PREFECT_SERVER_DATABASE_MIGRATE_ON_START="false",
                       PREFECT_SERVER_REGISTER_BLOCKS_ON_START="false")
        with (self.home / "server.log").open("ab") as log:
            self.pid = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True).pid

    def wait(self, timeout: float) -> Server:
        """Once it answers; a RuntimeError if its process ends first, or past ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _alive(self.pid):
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.api_url}/health", timeout=2).status_code == 200:
                    return self
            time.sleep(0.2)
        raise RuntimeError(f"no Prefect server on {self.api_url} ({timeout} s, process "
                           f"{'alive' if _alive(self.pid) else 'gone'}); see {self.home}/server.log")

    def kill(self) -> None:
        """Kill it outright (SIGKILL): what it had queued in memory is lost."""
        self.stop(grace=0)

    def stop(self, grace: float = 2.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds; reaped either way."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGTERM if grace else signal.SIGKILL)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and _alive(self.pid):
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (not ended, nor a zombie; Linux's /proc)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@contextlib.contextmanager
def api_of(url: str) -> Iterator[None]:
    """This process's Prefect API is ``url`` meanwhile.

    Prefect's events worker (which carries its task engine's events) is one per process,
    bound to the API it first saw: begun here, it would send every later test's events to
    this server, gone by then (the engine's task runs of a later test never arrived). So
    it is drained on the way out, and the next one is made for the API then current."""
    from prefect.events.worker import EventsWorker
    from prefect.settings import PREFECT_API_URL, temporary_settings

    EventsWorker.drain_all(timeout=10, at_exit=False)  # one begun before: to its own API
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
    return Server(home, free_port(), prepared=template is not None).start()


class SessionServer:
    """The session's shared server: started once, by the first pytest process (xdist's
    controller, before its workers exist, or the only process); xdist's workers find it
    through `_SHARED`. One server, one migration (~15 s of CPU), however many workers."""

    def __init__(self) -> None:
        self.server: Server | None = None
        self.owner = False

    @property
    def home(self) -> Path:
        return self._found().home

    @property
    def template(self) -> Path:
        home = self.home
        return home.parent / f"{home.name}-template" / DB_FILE

    def begin(self) -> None:
        """Start it, unless it is started already (here, or by the process that started
        this one)."""
        if self.server is not None or os.environ.get(_SHARED):
            return
        home = Path(tempfile.mkdtemp(prefix="patronus-tasks-server-"))
        self.server, self.owner = Server(home, free_port(), prepared=True), True
        self.template.parent.mkdir()
        self.server.spawn([sys.executable, "-c", _MIGRATE_COPY_SERVE, str(self.template),
                           str(self.server.port)])
        os.environ[_SHARED] = f"{self.server.port}:{self.server.pid}:{self.server.home}"

    def _found(self) -> Server:
        if self.server is None:
            port, pid, home = os.environ[_SHARED].split(":", 2)
            self.server = Server(Path(home), int(port), int(pid))
        return self.server

    def wait(self, timeout: float = 300) -> Server:
        """The server, once it is up (its template made before)."""
        return self._found().wait(timeout)

    def stop(self) -> None:
        """Stop it, if this process started it."""
        if self.server is None or not self.owner:
            return
        self.server.stop(grace=2)  # its database is thrown away: no need to wait long
        shutil.rmtree(self.server.home, ignore_errors=True)
        shutil.rmtree(self.template.parent, ignore_errors=True)


def asked_headers(api_url: str, auth_string: str) -> dict[str, str]:
    """The headers a client of a server that asks who you are (`server up`'s) sends: its
    auth string, and a CSRF token (CSRF protection on: every POST, the filters' too, needs
    one; Prefect's own client fetches it the same way, for an hour)."""
    import base64
    import uuid

    asked = {"Authorization": f"Basic {base64.b64encode(auth_string.encode()).decode()}"}
    client = str(uuid.uuid4())
    csrf = httpx.get(f"{api_url}/csrf-token", params={"client": client}, headers=asked,
                     timeout=30).raise_for_status().json()
    return {**asked, "Prefect-Csrf-Token": csrf["token"], "Prefect-Csrf-Client": client}
