"""What a call's task run shows in the Prefect UI: its state (the verdict) and its inputs."""

from __future__ import annotations

import logging
from itertools import islice

from patronus_tasks.define.params import ROW_FIELDS
from patronus_tasks.define.step_results import EvaluationResult, TaskResult
from patronus_tasks.prefect.events import NOT_PASSED_TAG, State
from patronus_tasks.record.records import STATUS_ERROR, STATUS_SKIPPED, Record
from patronus_tasks.run.invocation import Invocation
from patronus_tasks.trace.spans import SpanData

#: Characters of one input value or explanation shown; the Parquet keeps them whole.
SHOWN_CHARS = 160
#: Row columns shown for a step taking the whole row (the first ones, besides the sid).
SHOWN_COLUMNS = 12
#: The tag of a verdict that did not pass (`events.NOT_PASSED_TAG`). Prefect's UI colours a
#: task run by its state's type and its state filters offer only Prefect's own state
#: names, so a finding (of the completed type: not an error) is told apart and listed by
#: this tag, which the UI shows on the run and its tag filters offer, and marked in its
#: name (`events.NOT_PASSED_MARK`), which the run graph writes.
#: The state of a call the cache answered: Prefect's own name for a cache hit.
CACHED = "Cached"


def not_passed(state: State) -> bool:
    """Whether ``state`` is a verdict that did not pass (cached or not): a finding."""
    return NOT_PASSED_TAG in state.tags


def short(value: object, width: int = SHOWN_CHARS) -> str:
    """``value`` on one line, cut with an ellipsis past ``width`` characters."""
    raw = str(value)
    # Only its head is read: an input can be a whole document, and this runs per call.
    text = " ".join(raw[: width * 8].split())
    if len(text) <= width and len(raw) <= width * 8:
        return text
    return text[: width - 1] + "…"


def call_state(inv: Invocation) -> State:
    """The final state of a call's task run, from what came of it.

    An evaluator's verdict is its state's name (``Passed`` / ``Not passed``, both of the
    completed type: a failed verdict is a finding, not an error; a ``Not passed`` run is
    tagged `NOT_PASSED_TAG`) and its score and the start of its explanation the state's
    message. Errors are Failed (``TimedOut``). A call the cache answered is ``Cached``
    (completed, as Prefect's engine names a cache hit), what it answered in its message
    (and tags: a cached verdict that did not pass is still a finding).
    """
    if inv.cached:
        return _cached(_outcome(inv))
    return _outcome(inv)


def recorded_state(record: Record, stage: str) -> State:
    """The final state of a call as its ``stage`` (``"task"`` or ``"evaluator"``) stands in
    a record of the results: what `call_state` gave when the call ended (for a row written
    by an attempt that died before it sent the call's task run)."""
    if record.status == STATUS_ERROR and record.error_stage == stage:
        state = _failed(record.error_type or "", record.error_message or "")
    elif stage == "task":
        skipped = record.status == STATUS_SKIPPED and record.evaluator_name is None
        state = _skipped("task") if skipped else State("COMPLETED", "Completed")
    elif record.status == STATUS_SKIPPED:
        state = _skipped("evaluator")
    else:
        state = _verdict(EvaluationResult(pass_=record.pass_, score_raw=record.score,
                                          text_output=record.text_output,
                                          explanation=record.explanation))
    cached = record.task_cached if stage == "task" else record.evaluation_cached
    return _cached(state) if cached else state


def _outcome(inv: Invocation) -> State:
    if inv.error is not None:
        return _failed(inv.error.type, inv.error.message)
    if isinstance(inv.value, EvaluationResult):
        return _verdict(inv.value)
    if inv.value is None:  # a task's None ends the row; an evaluator's None is no verdict
        return _skipped(inv.step.kind)
    return State("COMPLETED", "Completed")


def _failed(error_type: str, message: str) -> State:
    # A judge stopped by its timeout_seconds is a JudgeError (unscored), still a timeout.
    timed_out = error_type in ("TimeoutError", "JudgeError") and "timed out after" in message
    return State("FAILED", "TimedOut" if timed_out else "Failed", f"{error_type}: {message}")


def _skipped(kind: str) -> State:
    return State("COMPLETED", "Skipped", f"{kind} returned None")


def _cached(answer: State) -> State:
    said = answer.name if answer.name != "Completed" else None
    parts = [p for p in ("from the cache", said, answer.message) if p]
    return State("COMPLETED", CACHED, " · ".join(parts), answer.tags)


def _verdict(result: EvaluationResult) -> State:
    name = {True: "Passed", False: "Not passed"}.get(result.pass_)  # type: ignore[arg-type]
    if name is None:
        name = "Completed" if result.score_raw is None else "Scored"
    parts = [] if result.score_raw is None else [f"score {result.score_raw:g}"]
    parts += [short(t) for t in (result.text_output, result.explanation) if t]
    tags = (NOT_PASSED_TAG,) if result.pass_ is False else ()
    return State("COMPLETED", name, " · ".join(parts) or None, tags)


def call_inputs(inv: Invocation) -> dict[str, str]:
    """The sample id and the row's fields this call received, each cut to one line.

    Prefect keeps a task input as its kind and a ``type`` text only (no value), so these
    travel as constants whose ``type`` is the value shown: what the Task Inputs tab lists.
    """
    shown = {"sid": inv.sid}
    for name, value in inv.kwargs.items():
        if name == "row" and value is not None:
            columns = ((str(k), v) for k, v in value.items() if k != "sid")
            shown.update((k, short(v)) for k, v in islice(columns, SHOWN_COLUMNS))
        elif name == "task_result" and isinstance(value, TaskResult):
            shown["evaluated_model_output"] = short(value.evaluated_model_output)
        elif name in ROW_FIELDS:
            shown[name] = short(value)
    return shown


#: Characters of a traceback logged on a call's task run: its end, where the error is
#: (the results keep it whole: ``error_traceback``).
TRACEBACK_CHARS = 4000


def _tail(trace: str) -> str:
    trace = trace.rstrip()
    if len(trace) <= TRACEBACK_CHARS:
        return trace
    return f"… ({len(trace) - TRACEBACK_CHARS} characters before)\n" + trace[-TRACEBACK_CHARS:]


def call_log(inv: Invocation, state: State) -> tuple[int, str] | None:
    """The log line (level, message) a call's task run gets when it needs a look: a
    failed verdict with its whole explanation, an error. Others get none (a failed
    verdict without an explanation has nothing its state does not say): a log record
    costs the server about what the call's own record does.

    An error is a WARNING: the flow run's log shows it too, and one row's error is
    recorded data, not the experiment failing (that run ends Completed)."""
    if state.type == "FAILED":
        what = "timed out" if state.name == "TimedOut" else "failed"
        said = (f"{inv.step.kind} {what} on this row: {state.message} (recorded as the row's "
                "error; the experiment goes on)")
        trace = inv.error.traceback if inv.error is not None else ""
        return logging.WARNING, said + (f"\n{_tail(trace)}" if trace else "")
    result = inv.value
    if not not_passed(state) or not isinstance(result, EvaluationResult) \
            or not result.explanation:
        return None
    score = "" if result.score_raw is None else f" (score {result.score_raw:g})"
    return logging.WARNING, f"Not passed{score}: {result.explanation}"


def span_state(s: SpanData) -> State:
    """A span's task-run state: Failed with its error, else Completed; its message what
    it used (model, tokens, cost) or gave; tagged ``span:<kind>`` for the UI's filters."""
    tags = (f"span:{s.kind}",)
    if s.error is not None:
        return State("FAILED", "Failed", short(s.error), tags)
    used = [s.model or "", f"{s.input_tokens} in / {s.output_tokens} out tokens"
            if s.input_tokens is not None else "", f"${s.cost:.6f}" if s.cost is not None else ""]
    said = " · ".join(u for u in used if u) or (short(s.output) if s.output else None)
    return State("COMPLETED", "Completed", said, tags)


def span_used(s: SpanData) -> str | None:
    """What a span's model call used, said once: ``model gpt-4o-mini · 812 in / 64 out
    tokens · $0.000160`` (None: no model, no tokens)."""
    if s.model is None and s.input_tokens is None:
        return None
    used = [f"model {s.model}" if s.model else "",
            f"{s.input_tokens} in / {s.output_tokens} out tokens" if s.input_tokens is not None else "",
            f"${s.cost:.6f}" if s.cost is not None else "cost unknown (no price for its model)"]
    return " · ".join(u for u in used if u)


def span_log(s: SpanData) -> tuple[int, str] | None:
    """The log line a span's task run gets: a model call's model, tokens and cost (its
    page opens on its logs, which showed "This run didn't generate Logs"; the state
    message holding them is not on it); a failed span's error."""
    if s.error is not None:
        return logging.WARNING, f"{s.kind} span {s.name!r} failed: {s.error}"
    used = span_used(s)
    return None if used is None else (logging.INFO, f"{s.kind} span {s.name!r}: {used}")


def span_inputs(s: SpanData) -> dict[str, str] | None:
    """A span's arguments and attributes as the Task Inputs tab shows them."""
    shown = {"arguments": short(s.arguments)} if s.arguments else {}
    shown.update((k, short(v)) for k, v in islice(s.attributes.items(), SHOWN_COLUMNS))
    return shown or None
