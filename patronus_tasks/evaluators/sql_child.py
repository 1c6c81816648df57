"""The process a DuckDB query of the SQL sandbox runs in (`sql_worker` starts and kills
it): its address space is capped before DuckDB is imported, so what DuckDB allocates
outside its own ``memory_limit`` (``repeat('x', 2000000000)`` took ~4 GB inside one call)
is an allocation failure here, never the experiment's memory. It opens the private copy
read-only with the sandbox's settings, runs one query at a time, and sends back only
what is within ``max_rows`` and ``max_bytes``: rows are counted while read, here.

The wire: frames of an 8-byte length and a pickle, on stdin (the queries) and the
stdout it was started with (the answers; fd 1 itself goes to /dev/null, so nothing
DuckDB or Python prints can break a frame). SIGUSR1 interrupts the query running.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import resource
import signal
import struct
import threading
import time
from typing import Any

from patronus_tasks.evaluators.sql_bounds import Limits, QueryRefused, ResultTooLarge, collect

HEADER = struct.Struct("<Q")
DUCKDB_CONFIG = {
    "enable_external_access": False,  # no files (read_text, COPY, ATTACH), network, extensions
    "autoinstall_known_extensions": False, "autoload_known_extensions": False,
    "allow_community_extensions": False,
    "python_enable_replacements": False,  # `FROM name` would read a DataFrame of the process
    "temp_directory": "",  # past the memory limit a fail, not gigabytes spilled to disk
    "threads": 1,
    "lock_configuration": True,  # no SET undoes the above
}


def duckdb_module() -> Any:
    try:
        import duckdb
    except ImportError:
        from patronus_tasks.exceptions import ConfigError

        raise ConfigError("sql_result_match: a DuckDB database needs the duckdb package "
                          "(pip install duckdb).") from None
    return duckdb


def duckdb_cursor(conn: Any, query: str) -> Any:
    """``query`` run on ``conn``: exactly one statement, and a query (nothing that writes,
    loads or sets)."""
    duckdb = duckdb_module()
    statements = duckdb.extract_statements(query)
    if len(statements) != 1:
        raise QueryRefused(f"{len(statements)} statements: the sandbox runs exactly one")
    if statements[0].type != duckdb.StatementType.SELECT:
        raise QueryRefused(f"a {statements[0].type.name} statement: the sandbox runs a query "
                           "(SELECT, WITH, VALUES, FROM) and nothing else")
    return conn.execute(statements[0])


def send(fd: int, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def receive(fd: int) -> Any:
    """The next message on ``fd``; EOFError at its end (the other side gone). One read
    for most (a syscall fewer each way is ~5% of an ordinary query's time)."""
    data = os.read(fd, 1 << 16)
    while 0 < len(data) < HEADER.size:
        data += _exact(fd, HEADER.size - len(data))
    if not data:
        raise EOFError
    size = HEADER.unpack_from(data)[0]
    body = data[HEADER.size:]
    return body + _exact(fd, size - len(body)) if len(body) < size else body


def _exact(fd: int, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def main(setup: dict[str, Any]) -> None:
    """Started by `sql_worker`: ``setup`` has ``path``, ``memory`` (bytes of address
    space) and ``memory_limit`` (DuckDB's)."""
    resource.setrlimit(resource.RLIMIT_AS, (setup["memory"], setup["memory"]))
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})  # for the watcher alone
    out = os.dup(1)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    try:
        conn = duckdb_module().connect(setup["path"], read_only=True, config=DUCKDB_CONFIG | {
            "memory_limit": setup["memory_limit"]})
    except Exception as exc:  # said to the parent, which says it to the user
        return send(out, ("error", type(exc).__name__, str(exc)))
    current: list[Any] = [None, threading.Lock()]
    threading.Thread(target=_watch, args=(current,), daemon=True).start()
    threading.Thread(target=_die_with_parent, args=(os.getppid(),), daemon=True).start()
    send(out, ("ready", os.getpid()))
    while True:
        try:
            request = receive(0)
        except EOFError:  # the parent is gone, or done with this worker
            return
        send(out, answer(conn, current, *pickle.loads(request)))


def _die_with_parent(parent: int) -> None:
    """End once the parent is gone (killed: SIGKILL, the OOM killer, a cancelled run's
    process): its closed pipe is read only between queries, and a hostile query went on
    for as long as it ran, at its cap of memory. Polled: Linux's parent-death signal
    follows the thread that started the worker, and rows start workers from threads that
    end."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def _watch(current: list[Any]) -> None:
    """SIGUSR1: interrupt the query running (each query has its own cursor, so a late
    signal only reaches one that already ended)."""
    while True:
        signal.sigwait({signal.SIGUSR1})
        with current[1], contextlib.suppress(Exception):
            if current[0] is not None:
                current[0].interrupt()


def answer(conn: Any, current: list[Any], query: str, max_rows: int, max_bytes: int) -> tuple[Any, ...]:
    cursor = conn.cursor()
    current[0] = cursor
    try:
        rows, size = collect(duckdb_cursor(cursor, query), Limits(0, max_rows, max_bytes))
        return "rows", rows, size
    except (QueryRefused, ResultTooLarge) as exc:
        return "sandbox", type(exc).__name__, str(exc)
    except MemoryError as exc:  # Python's allocation failing, under the cap
        return "memory", "MemoryError", str(exc)
    except Exception as exc:
        kind = "memory" if type(exc).__name__ == "OutOfMemoryException" else "error"
        return kind, type(exc).__name__, str(exc)
    finally:
        with current[1]:
            current[0] = None
        with contextlib.suppress(Exception):
            cursor.close()
