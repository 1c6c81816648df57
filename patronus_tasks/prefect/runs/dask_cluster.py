"""The local Dask cluster of ``backend="dask"``: worker processes that do not re-run the script.

Dask's `LocalCluster` starts its workers with multiprocessing's ``spawn``, which imports
the parent's ``__main__`` again in each of them: a script without
``if __name__ == "__main__":`` ran once more per worker, its experiment with it (model
calls paid again) before Dask gave up with ``Nanny failed to start``. Here each worker
is a new interpreter (``python -m dask spec``, a Nanny in it, as distributed's
`SubprocessCluster` starts them), whose ``__main__`` is Dask's own: the user's script is
never imported there. Steps defined in the script travel by value (cloudpickle), as
before; the script's ``sys.path`` and Dask config go along (spawn passed both).
The scheduler runs in this process, as `LocalCluster`'s does.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import os
import signal
import sys
from typing import Any

import dask.config
from distributed import LocalCluster, Scheduler
from distributed.core import rpc
from distributed.deploy.spec import SpecCluster
from distributed.deploy.subprocess import SubprocessWorker
from distributed.worker_memory import parse_memory_limit

logger = logging.getLogger("patronus_tasks")
_PR_SET_PDEATHSIG = 1
# Looked up here, not in the forked child (where loading a library could deadlock).
_PRCTL = getattr(ctypes.CDLL(None), "prctl", None) if sys.platform == "linux" else None


class FreshWorker(SubprocessWorker):
    """A Nanny and its worker in a new interpreter; started once it has joined the scheduler."""

    async def _start(self) -> None:
        spec = json.dumps({"cls": "distributed.Nanny", "opts": {**self.worker_kwargs,
                                                                "name": self.name}})
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "dask", "spec", self.scheduler, "--spec", spec, env=_env(),
            preexec_fn=_die_with_parent)
        exited = asyncio.ensure_future(self.process.wait())
        async with rpc(self.scheduler) as scheduler:
            while not exited.done():
                if await self._joined(scheduler):
                    exited.cancel()
                    return
                await asyncio.wait([exited], timeout=0.1)
        raise RuntimeError(f"Dask worker {self.name} exited with code {exited.result()} before "
                           "joining the scheduler (its output is above).")

    async def _joined(self, scheduler: Any) -> bool:
        workers = (await scheduler.identity())["workers"].values()
        return any(w.get("name") == self.name for w in workers)


def _die_with_parent() -> None:
    """In the child: killed with the thread that started it (the cluster's), as a
    `LocalCluster` worker is, however this process ends (Linux; elsewhere a worker left
    alone closes once its running call ends)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _env() -> dict[str, str]:
    """This process's environment, its import path and Dask config added (what spawn gave)."""
    path = os.pathsep.join(p for p in sys.path if p)
    return {**os.environ, "PYTHONPATH": path,
            "DASK_INTERNAL_INHERIT_CONFIG": dask.config.serialize(dask.config.global_config)}


def local_cluster(n_workers: int = 2, threads_per_worker: int = 1) -> SpecCluster:
    """A scheduler here and ``n_workers`` `FreshWorker` processes on 127.0.0.1 (on Windows,
    where distributed starts no such workers, a `LocalCluster`: scripts there need the guard)."""
    if sys.platform == "win32":
        return LocalCluster(n_workers=n_workers, threads_per_worker=threads_per_worker,
                            processes=True, dashboard_address="127.0.0.1:0")
    options = {"host": "127.0.0.1", "nthreads": threads_per_worker, "silence_logs": logging.WARN,
               "memory_limit": parse_memory_limit("auto", 1, n_workers, logger=logger)}
    worker = {"cls": FreshWorker, "options": {"worker_kwargs": options}}
    # Its HTTP server (health, metrics) starts anyway: on a free port, not on 8787.
    scheduler = {"cls": Scheduler, "options": {"host": "127.0.0.1", "port": 0, "dashboard": False,
                                               "dashboard_address": "127.0.0.1:0"}}
    return SpecCluster(workers={i: worker for i in range(n_workers)}, scheduler=scheduler,
                       worker=worker, silence_logs=logging.WARN, name="patronus-tasks")
