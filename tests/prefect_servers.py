"""Real Prefect servers for the tests, on 127.0.0.1.

One server is shared by the whole session (`SessionServer`): it starts in the background
as soon as the tests are collected, so tests without Prefect run while it migrates its
new database (~20 s on 2 cores). Tests that need a server of their own (services off, a
full `server up` stack) start from a copy of its freshly migrated database, which spares
them the migrations.
"""

from __future__ import annotations

import shutil
import socket
import sqlite3
import tempfile
import threading
from pathlib import Path

from patronus_tasks import _stack

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


def start_server(home: Path, template: Path | None = None) -> _stack.Stack:
    """A server of its own in ``home`` (services as the environment says), at normal
    priority; from a copy of ``template`` when given."""
    if template is not None:
        copy_database(template, home)
    return _stack.up(home, home, free_port(), deploy=False, worker=False, nice=0)


class SessionServer:
    """The session's shared server, started by a background thread."""

    def __init__(self) -> None:
        self.home = Path(tempfile.mkdtemp(prefix="patronus-tasks-server-"))
        self.template = self.home.parent / f"{self.home.name}-template" / DB_FILE
        self.stack: _stack.Stack | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._start, name="session-prefect-server",
                                         daemon=True)

    def begin(self) -> None:
        self._thread.start()

    def _start(self) -> None:
        try:
            self.stack = start_server(self.home)
            copy_database(self.home / DB_FILE, self.template.parent)
        except BaseException as exc:
            self.error = exc

    def wait(self) -> _stack.Stack:
        self._thread.join()
        if self.error is not None or self.stack is None:
            raise RuntimeError(f"the session's Prefect server did not start: {self.error}")
        return self.stack

    def stop(self) -> None:
        if self._thread.is_alive() or self._thread.ident is not None:
            self._thread.join()
            _stack.down(self.home, grace=2)  # its database is thrown away: no need to wait
        shutil.rmtree(self.home, ignore_errors=True)
        shutil.rmtree(self.template.parent, ignore_errors=True)
