"""A sweep's flow run, kept by the recorder process: made first, its variants' experiments
made as its subflows, ended last with what the sweep's process made of them.

The variants' openings name the sweep's by its key (`ParentRun.key`): their flow runs are
made once the sweep's exists, each through a task run in it as any subflow. The sweep's
own end waits for theirs, then posts its artifacts (the matrix, the chart) and its state.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import Mapping
from typing import Any, Protocol

from patronus_tasks.prefect import clients, flowruns
from patronus_tasks.prefect.protocol import UI_PREFIX, Closing, Opening, SweepEnd
from patronus_tasks.prefect.states import RunState, cancelled, completed, failed
from patronus_tasks.prefect.ui import made

_CHILDREN_EVERY = 0.25  # seconds between looks at the variants' flow runs


class Session(Protocol):
    """What a sweep needs of the recorder's `main.Session` (a protocol: main imports this
    module, and no import circle is kept in the recorder, type hints counted)."""

    flow_run_id: str | None
    finished: threading.Event
    parent_task_run: Any
    service: Any

    async def opened(self) -> None: ...


async def with_parent(sessions: Mapping[str, Session], opening: Opening) -> Opening:
    """``opening`` with its parent's flow run id, when its parent is a sweep of this
    process (no parent when the sweep's flow run could not be made)."""
    parent = opening.parent
    if parent is None or parent.key is None:
        return opening
    session = sessions.get(parent.key)
    if session is not None:
        await session.opened()
    if session is None or session.flow_run_id is None:
        return dataclasses.replace(opening, parent=None)
    return dataclasses.replace(opening, parent=dataclasses.replace(
        parent, flow_run_id=session.flow_run_id))


async def _children_done(sessions: Mapping[str, Session], keys: tuple[str, ...]) -> None:
    while any(not sessions[k].finished.is_set() for k in keys if k in sessions):
        await asyncio.sleep(_CHILDREN_EVERY)


async def end(session: Session, closing: Closing) -> None:
    """The sweep's end: its variants' flow runs first, then its artifacts, tags and state."""
    assert session.flow_run_id is not None
    flow_run_id = session.flow_run_id
    done = closing.sweep or SweepEnd()
    await _children_done(session.service.sessions, done.children)
    state: RunState
    if closing.status == "interrupted":
        state = cancelled(f"interrupted: {closing.why}")
    else:
        state = (failed if done.failed else completed)(done.message)
    async with clients.get_client() as client:
        for key, markdown, description in done.artifacts:
            await made.create(client, "markdown", markdown.replace(UI_PREFIX, clients.ui_path()),
                              flow_run_id, key=key, description=description)
        await flowruns.add_tags(client, flow_run_id, list(done.tags))
        level = logging.INFO if state.is_completed() else logging.ERROR
        await flowruns.log(client, flow_run_id, [(level, state.message or ""),
                                                 (level, f"Finished in state {state}")])
        await flowruns.finish(client, flow_run_id, state, session.parent_task_run)
