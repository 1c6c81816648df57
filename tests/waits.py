"""Waiting for an event, not for time: a condition polled until it holds, or a clear failure."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def until(check: Callable[[], T], what: str, timeout: float = 60) -> T:
    """``check()`` once it is truthy; an AssertionError naming ``what`` past ``timeout``."""
    deadline, pause = time.monotonic() + timeout, 0.05
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(pause)
        # Backing off to 0.5 s: many checks ask a server, each request costs it ms of CPU,
        # and 20 a second from every waiting test slowed the shared server they waited on.
        pause = min(0.5, pause * 1.5)
    return found


def sids_written(out_dir: Path | str, *subfolders: str) -> list[str]:
    """The row ids of the records an experiment in ``out_dir`` (a folder or an object
    storage URL, then ``subfolders``) has written so far, one per record: its journals
    and parts, as a crash would leave them."""
    from patronus_tasks.record.location import Location
    from patronus_tasks.record.parquet import unfinished_tables

    where = Location.of(out_dir)
    for name in subfolders:
        where = where / name
    try:
        tables = unfinished_tables(where)
    except OSError:  # no parts yet, or a journal became a part while listed
        return []
    return [sid for table in tables for sid in table.column("sid").to_pylist()]


async def task_runs_with_states(client: Any, flow_run_id: str, timeout: float = 30) -> list[Any]:
    """A flow run's task runs once each has its state: Prefect's task-run recorder writes a
    run's state a little after the run (seen read as None right after the run was final,
    on a loaded machine)."""
    import asyncio

    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    deadline = time.monotonic() + timeout
    while True:
        runs = await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
        if all(r.state is not None for r in runs) or time.monotonic() > deadline:
            return list(runs)
        await asyncio.sleep(0.3)
