"""Each call of a step as its own Prefect task run: what the rows' side does per call.

Nothing here imports Prefect: the calls are handed to a `CallSink` (the recorder process,
or a `TaskRunRecorder` in this process) that turns them into task-run events.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
from typing import Any, Protocol

from patronus_tasks.prefect.events import (
    RUNNING_AFTER,
    Call,
    State,
    namespace_of,
    now,
    task_run_id,
)
from patronus_tasks.prefect.protocol import RecordMode
from patronus_tasks.prefect.runs import steplogs as _steplogs
from patronus_tasks.prefect.ui.display import (
    call_inputs,
    call_log,
    call_state,
    not_passed,
    span_inputs,
    span_log,
    span_state,
)
from patronus_tasks.run.loop import InProcess, RecordStream, Rows
from patronus_tasks.run.runner import Invocation, LocalStepRunner


class CallSink(Protocol):
    """Where calls go to become task runs; ``run_key`` names the experiment run their
    task-run ids derive from (`events.task_run_id`)."""

    run_key: str

    def running(self, call: Call, run_count: int) -> None: ...

    def finished(self, call: Call, state: State, run_count: int, end: dt.datetime) -> None: ...

    def log(self, record: dict[str, Any]) -> None: ...

    async def backpressure(self) -> None: ...


def worth_recording(state: State, record: RecordMode) -> bool:
    """Whether a call in ``state`` becomes a task run: every one (``"all"``, ``"calls"``),
    or (``"failures"``) only errors and verdicts that did not pass."""
    return record != "failures" or state.type == "FAILED" or not_passed(state)


class RecordingStepRunner(LocalStepRunner):
    """Runs calls in plain asyncio (retries and timeouts as `LocalStepRunner`) and records
    each as its own Prefect task run through a `CallSink`: named ``<step>-<sid>``, the
    spans inside it (``record="all"``) task runs nested under it,
    waiting on its row's task (the flow-run graph shows each row's task feeding its
    evaluators), Running in the UI once it runs `RUNNING_AFTER` seconds, its log records
    attached to it. With ``record="failures"`` only errors and failed verdicts are sent
    (an evaluator whose task was not recorded shows no upstream), with no Running state
    and no log records of user code (not known yet to belong to a task run that will
    exist)."""

    def __init__(self, sink: CallSink, record: RecordMode = "all") -> None:
        self.sink, self.record = sink, record
        self.namespace = namespace_of(sink.run_key)

    async def run(self, inv: Invocation, upstream: str | None) -> None:
        step = inv.step
        call = Call(task_run_id(self.namespace, inv.run_name), inv.run_name,
                    f"{step.kind}-{step.name}", upstream, now(), step.retries,
                    step.retry_delay_seconds, call_inputs(inv))
        shown = None if self.record == "failures" or inv.cached else asyncio.get_running_loop().call_later(
            RUNNING_AFTER, lambda: self.sink.running(call, max(inv.attempts, 1)))
        token = None if shown is None else _steplogs.CURRENT.set((self.sink, call.task_run_id))
        try:
            await super().run(inv, upstream)
        finally:
            if shown is not None and token is not None:
                shown.cancel()
                _steplogs.CURRENT.reset(token)
        _explain_missing_context(inv)
        state = call_state(inv)
        if worth_recording(state, self.record):
            self.sink.finished(call, state, max(inv.attempts, 1), now())
            self._log(inv, call, state)
            inv.handle = call.task_run_id
            if inv.spans and self.record == "all":
                self._spans(inv, call.task_run_id)
        await self.sink.backpressure()

    def _spans(self, inv: Invocation, call_id: str) -> None:
        """Each span of the call a task run nested under it (or under its parent span),
        named ``<span>-<sid>``; their final states only (one event each)."""
        ids: dict[str, str] = {}
        for s in inv.spans or ():  # in start order: a parent before its children
            key = f"{inv.run_name}#{s.span_id}"
            ids[s.span_id] = task_run_id(self.namespace, key)
            start = dt.datetime.fromtimestamp(s.start, dt.UTC)
            end = dt.datetime.fromtimestamp(s.end if s.end is not None else s.start, dt.UTC)
            self.sink.finished(Call(ids[s.span_id], f"{s.name}-{inv.sid}", f"span-{s.kind}",
                                    None, start, 0, 0.0, span_inputs(s),
                                    parent=ids.get(s.parent_id or "", call_id), key=key),
                               span_state(s), 1, end)
            line = span_log(s)  # its error, or its model's use: the page opens on its logs
            if line is not None:
                self.sink.log({"name": "patronus_tasks", "level": line[0], "message": line[1],
                               "timestamp": end.isoformat(), "task_run_id": ids[s.span_id]})

    def _log(self, inv: Invocation, call: Call, state: State) -> None:
        line = call_log(inv, state)
        if line is not None:
            self.sink.log({"name": "patronus_tasks", "level": line[0], "message": line[1],
                           "timestamp": now().isoformat(), "task_run_id": call.task_run_id})


class Recorded(InProcess):
    """The backend of ``"prefect"`` (and of each batch on a task runner's worker): rows
    run here, each call recorded as its own task run through ``sink`` (the recorder
    process, or a batch's `TaskRunRecorder`), the log records of user code attached to
    their call's task run."""

    def __init__(self, sink: CallSink, record: RecordMode = "all") -> None:
        super().__init__(RecordingStepRunner(sink, record))

    async def run(self, rows: Rows, stream: RecordStream) -> None:
        with _steplogs.capture():
            await super().run(rows, stream)


def _explain_missing_context(inv: Invocation) -> None:
    """A step that asked for Prefect's run context (``get_run_logger()``) outside a flow
    run: its calls run in the experiment's own process, not in a Prefect run; say the fix."""
    if inv.error is not None and inv.error.type == "MissingContextError":
        inv.error = dataclasses.replace(inv.error, message=(
            f"{inv.error.message} {inv.step.kind} {inv.step.name!r} asked for Prefect's run "
            "context (get_run_logger()?), which calls do not run in: log with "
            "logging.getLogger(__name__) instead (its records are attached to the call's task "
            "run), or run the experiment inside your own @flow."))
