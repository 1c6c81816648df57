"""The task runs of rows a dead attempt of a batch wrote, sent by the attempt after it.

Dask runs a lost worker's batch again elsewhere; the new attempt keeps the rows the dead
one wrote (`taskrunner._after_earlier_attempts`) and does not run them again, so the task
runs of their calls that the dead attempt had not sent yet would be lost with it. They
are made again from the rows' records, with the ids the dead attempt gave them (a call's
task-run id derives from the flow run and its name: `events.task_run_id`), and only those
the server lacks in a final state are sent: a state it holds is never sent twice.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from patronus_tasks.prefect.events import Call, State, namespace_of, now, task_run_id
from patronus_tasks.prefect.recorder.backlog import held_task_runs
from patronus_tasks.prefect.ui.display import recorded_state
from patronus_tasks.record.records import Record
from patronus_tasks.run.invocation import call_name

if TYPE_CHECKING:
    from patronus_tasks.prefect.recorder.taskruns import TaskRunRecorder


#: A kept call: its task run, final state and run count (the attempts its record counts).
Kept = tuple[Call, State, int]


def kept_calls(records: list[Record], run_key: str) -> list[Kept]:
    """The calls one row's ``records`` stand for, each with its final state: a task per
    link, an evaluator per record."""
    namespace, calls = namespace_of(run_key), []
    tasks: dict[int | None, str] = {}
    for r in records:
        upstream = None
        if r.task_name is not None:
            name = call_name(r.task_name, r.sid, r.link_index, r.repeat)
            upstream = task_run_id(namespace, name)
            if r.link_index not in tasks:
                tasks[r.link_index] = upstream
                calls.append((_call(upstream, name, r, "task", r.task_name, None,
                                    r.task_duration_s), recorded_state(r, "task"),
                              r.task_attempts or 1))
        if r.evaluator_name is not None:
            name = call_name(r.evaluator_name, r.sid, r.link_index, r.repeat)
            calls.append((_call(task_run_id(namespace, name), name, r, "evaluator",
                                r.evaluator_name, upstream, r.evaluation_duration_s),
                          recorded_state(r, "evaluator"), r.evaluation_attempts or 1))
    return calls


def _call(run_id: str, name: str, record: Record, kind: str, step: str, upstream: str | None,
          seconds: float | None) -> Call:
    start = now() - dt.timedelta(seconds=seconds or 0.0)
    return Call(run_id, name, f"{kind}-{step}", upstream, start, 0, 0.0, {"sid": record.sid})


async def send_missing(recorder: TaskRunRecorder, calls: list[Kept]) -> None:
    """Send the calls whose task runs the server lacks in a final state."""
    from patronus_tasks.prefect.clients import get_client

    async with get_client() as client:
        final = await held_task_runs(client, [c.task_run_id for c, _, _ in calls])
    for call, state, run_count in calls:
        if call.task_run_id not in final:
            recorder.finished(call, state, run_count, now())
