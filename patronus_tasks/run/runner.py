"""Running rows through a chain: the business logic, free of any orchestrator.

`RowRunner` walks one row through the chain's links and returns its records.
Each call of user code is an `Invocation`, executed by a `StepRunner`: the seam
between this logic and how calls are orchestrated. `LocalStepRunner` runs them in
plain asyncio (retries and timeouts done here); `RecordingStepRunner`
(`prefect/runs/calls.py`) also records each as a Prefect task run. The loop over
an experiment's rows is `loop.row_loop`.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from concurrent.futures import Executor
from typing import Any, Protocol

from patronus_tasks.define.chain import Link, Parent
from patronus_tasks.define.params import ROW_FIELDS, build_kwargs
from patronus_tasks.define.prices import PriceTable
from patronus_tasks.define.row import Sample
from patronus_tasks.define.step_results import (
    EvaluationResult,
    TaskResult,
    with_model_facts,
)
from patronus_tasks.define.steps import Evaluator, Step, Task
from patronus_tasks.define.variant import VariantValues
from patronus_tasks.exceptions import DatasetError
from patronus_tasks.record.cache import CallCache, Unkeyable, call_key
from patronus_tasks.record.records import (
    STATUS_OK,
    STATUS_SKIPPED,
    ErrorInfo,
    Record,
    error_fields,
    evaluation_fields,
    row_values,
    task_fields,
)
from patronus_tasks.record.resume import TASK, Replay, Replayed
from patronus_tasks.run.invocation import Invocation, call_name
from patronus_tasks.trace import capture as _capture
from patronus_tasks.trace.spans import (
    dump_spans,
    renewed,
)
from patronus_tasks.trace.tree import Trace

__all__ = ["Invocation", "LocalStepRunner", "RowRunner", "StepRunner", "Unit", "call_name",
           "run_rows", "units"]


class StepRunner(Protocol):
    """Executes invocations; ``upstream`` is the handle of the call this one depends on."""

    async def run(self, inv: Invocation, upstream: str | None) -> None: ...


class LocalStepRunner:
    """Runs invocations in plain asyncio, with the step's retries and timeout."""

    async def run(self, inv: Invocation, upstream: str | None) -> None:
        if inv.cached:
            return  # its answer is stored already: nothing to call
        step = inv.step
        for attempt in range(step.retries + 1):
            try:
                await asyncio.wait_for(inv.attempt(), step.timeout_seconds)
                inv.harvest()
                return
            except TimeoutError as exc:
                if exc is not inv.raised:  # ours; the code's own (a socket's) is kept as it is
                    inv.record_timeout(step.timeout_seconds)
            except Exception:
                pass  # recorded on the invocation by attempt()
            inv.raised = None  # its traceback holds the call's frames
            if attempt < step.retries:
                await asyncio.sleep(step.retry_delay_seconds)
        inv.harvest()


def _missing_field_error(step: Step, available: Mapping[str, Any], row: Sample
                         ) -> ErrorInfo | None:
    missing = sorted(n for n in step.signature.required if n in ROW_FIELDS and available[n] is None)
    if not missing:
        return None
    exc = DatasetError(
        f"row sid={row.sid}: field {missing[0]!r} is empty, but {step.kind} {step.name!r} "
        f"requires it. Fill it in the dataset, or give the parameter a default "
        f"(`{missing[0]}: str | None = None`) to accept empty values."
    )
    return ErrorInfo(type(exc).__name__, str(exc))


def _available(row: Sample, parent: Parent | None, tags: Mapping[str, str],
               task_result: TaskResult | None, trace: Trace | None = None,
               variant: VariantValues | None = None) -> dict[str, Any]:
    values: dict[str, Any] = {name: row.values.get(name) for name in ROW_FIELDS}
    if task_result is not None:
        # Evaluators judge what the task produced, not what the dataset held.
        values["evaluated_model_output"] = task_result.evaluated_model_output
        if task_result.evaluated_model_system_prompt is not None:
            values["evaluated_model_system_prompt"] = task_result.evaluated_model_system_prompt
        if task_result.evaluated_model_retrieved_context is not None:  # what a RAG task found
            values["evaluated_model_retrieved_context"] = task_result.evaluated_model_retrieved_context
    values.update(parent=parent, tags=dict(tags), task_result=task_result, trace=trace,
                  variant=variant if variant is not None else _NO_VARIANT)
    return values  # no "row": built only for the steps asking for it


_NO_VARIANT = VariantValues()  # outside a sweep: an empty mapping


class Unit:
    """One run of a row: the row, and which of its repeats (None without repeats)."""

    __slots__ = ("repeat", "row")

    def __init__(self, row: Sample, repeat: int | None) -> None:
        self.row, self.repeat = row, repeat


class RowRunner:
    """Walks rows through the chain's links, calling steps through a `StepRunner`."""

    def __init__(self, links: Iterable[Link], runner: StepRunner, *, tags: Mapping[str, str],
                 limit: int, pool: Executor | None, replay: Replay | None = None,
                 cache: CallCache | None = None, prices: PriceTable | None = None,
                 variant: VariantValues | None = None) -> None:
        self.replay = replay
        self.variant = variant  # a sweep's cell, for steps asking for ``variant``
        self.cache, self.prices = cache, prices or PriceTable()
        self.links = tuple(links)
        self.runner = runner
        self.tags = dict(tags)
        self.pool = pool
        self.host = socket.gethostname()  # made where the rows run: a worker's, on Dask
        _capture.install()  # the user's OpenTelemetry spans inside calls, when they record any
        self._slots = asyncio.Semaphore(limit)
        self.calls = 0  # invocations handed to the step runner
        self.cached = 0  # of them, answered from the cache

    async def _call(self, step: Step, idx: int, unit: Unit, available: dict[str, Any],
                    upstream: str | None, replayed: dict[tuple[int, str], Replayed]) -> Invocation:
        row = unit.row
        kwargs = build_kwargs(step.signature, available)
        if "row" in kwargs:
            kwargs["row"] = row.row
        inv = Invocation(step, kwargs, call_name(step.name, row.sid, idx, unit.repeat),
                         self.pool, row.sid)
        inv.prices = self.prices
        done = replayed.get((idx, TASK if isinstance(step, Task) else step.name))
        if done is not None:  # completed in an earlier run: never asked again
            inv.value, inv.attempts, inv.duration = done.value, done.attempts, done.duration or 0.0
            inv.cached, inv.cost, inv.spans = done.cached, done.cost, done.spans
            return inv
        inv.error = _missing_field_error(step, available, row)
        if inv.error is None:
            await self._invoke(inv, unit.repeat, upstream)
        return inv

    async def _invoke(self, inv: Invocation, repeat: int | None, upstream: str | None) -> None:
        """Have the call run (or the cache answer it), say what it cost, store a new answer."""
        step = inv.step
        cache = self.cache if self.cache is not None and self.cache.wants(step) else None
        key = None if cache is None else await self._lookup(cache, inv, repeat)
        async with self._slots:
            self.calls += 1
            self.cached += inv.cached
            await self.runner.run(inv, upstream)
        if inv.cached:  # the cache answered: nothing paid (a call made is priced as it ends)
            inv.cost = 0.0
        if cache is not None and key is not None and not inv.cached and inv.error is None:
            await cache.put(step, key, inv.value, inv.spans)

    async def _lookup(self, cache: CallCache, inv: Invocation, repeat: int | None) -> str | None:
        """The call's cache key, its answer put on ``inv`` when stored (then ``cached``)."""
        try:
            key = call_key(inv.step, inv.kwargs, repeat)
        except Unkeyable as exc:
            cache.unkeyable(inv.step, str(exc))
            return None
        hit = await cache.get(inv.step, key)
        if hit is not None:  # its spans as this call's: new ids, now
            inv.value, inv.cached = hit.value, True
            inv.spans = renewed(hit.spans, time.time()) if hit.spans else None
        return key

    async def run(self, row: Sample, repeat: int | None = None) -> list[Record]:
        """Run one row (its ``repeat``-th run, with repeats) through every link; return its
        records."""
        unit = Unit(row, repeat)
        base = {"sid": row.sid, "repeat": repeat, "host": self.host, "row": row_values(row)}
        records: list[Record] = []
        parent: Parent | None = None
        replayed = self.replay.steps(row.sid, repeat) if self.replay is not None else {}
        for idx, link in enumerate(self.links):
            parent, stop = await self._run_link(idx, link, unit, parent, base, records, replayed)
            if stop:
                break
        return records

    async def _run_link(self, idx: int, link: Link, unit: Unit, parent: Parent | None,
                        base: dict[str, Any], records: list[Record],
                        replayed: dict[tuple[int, str], Replayed]) -> tuple[Parent | None, bool]:
        row = unit.row
        head = {**base, "link_index": idx, "task_name": link.task.name if link.task else None}
        result: TaskResult | None = None
        upstream, trace = None, None
        if link.task is not None:
            inv = await self._call(link.task, idx, unit,
                                   _available(row, parent, self.tags, None, None, self.variant),
                                   None, replayed)
            if inv.value is not None:  # the dataset's meta_evaluated_model_* facts, if any
                inv.value = with_model_facts(inv.value, row.values)
            head.update(task_fields(inv.value, inv.duration if inv.attempts else None,
                                    inv.attempts or None, inv.paid()),
                        task_spans=dump_spans(inv.spans), task_started_at=inv.started)
            if inv.error is not None or inv.value is None:
                records.append(_task_only(head, inv))
                return parent, True  # a failed or skipped task ends this row's chain
            if not link.evaluators:
                records.append(_task_only(head, inv))
                return Parent(task=inv.value, parent=parent), False
            result, upstream = inv.value, inv.handle
            trace = inv.trace()
        available = _available(row, parent, self.tags, result, trace, self.variant)
        invs = await asyncio.gather(
            *(self._call(ev, idx, unit, available, upstream, replayed) for ev in link.evaluators)
        )
        records.extend(_evaluation_record(head, inv) for inv in invs)
        evals: dict[str, EvaluationResult | None] = {i.step.name: i.value for i in invs}
        return Parent(task=result, evals=evals, parent=parent), False


def _task_only(head: dict[str, Any], inv: Invocation) -> Record:
    status = STATUS_SKIPPED if inv.value is None else STATUS_OK
    return Record(**{**head, "status": status, **error_fields(inv.error, "task")})


def _evaluation_record(head: dict[str, Any], inv: Invocation) -> Record:
    ev = inv.step
    assert isinstance(ev, Evaluator)
    status = STATUS_SKIPPED if inv.value is None else STATUS_OK
    return Record(**{
        **head,
        "evaluator_name": ev.name,
        "criteria": ev.criteria,
        "weight": ev.weight,
        "status": status,
        "evaluation_attempts": inv.attempts or None,
        **evaluation_fields(inv.value, inv.duration if inv.attempts else None, inv.paid()),
        "evaluation_spans": dump_spans(inv.spans),
        "evaluation_started_at": inv.started,
        **error_fields(inv.error, "evaluator"),
    })


def units(rows: Iterable[Sample], repeats: int = 1,
          wanted: Callable[[str, int | None], bool] | None = None) -> Iterator[Unit]:
    """Every run of every row: each row ``repeats`` times (repeat 1 to N; None without
    repeats), those ``wanted`` says (a resume: what is not done yet)."""
    numbers: list[int | None] = list(range(1, repeats + 1)) if repeats > 1 else [None]
    for row in rows:
        for repeat in numbers:
            if wanted is None or wanted(row.sid, repeat):
                yield Unit(row, repeat)


async def run_rows(rows: Iterable[Sample | Unit], row_runner: RowRunner, workers: int,
                   on_records: Callable[[list[Record]], Awaitable[None] | None]) -> int:
    """Run every row (or `Unit`: one run of a row) with at most ``workers`` in flight;
    hand each one's records on.

    Rows are pulled lazily, so memory holds only the rows in flight. ``on_records`` may
    return an awaitable: that row's worker waits for it (a reporter's full queue).
    """
    iterator = iter(rows)
    done = 0

    async def worker() -> None:
        nonlocal done
        for item in iterator:
            unit = item if isinstance(item, Unit) else Unit(item, None)
            try:
                records = await row_runner.run(unit.row, unit.repeat)
            except Exception as exc:  # a bug of ours must cost one row, not the experiment
                records = [Record(sid=unit.row.sid, link_index=0, repeat=unit.repeat,
                                  **error_fields(ErrorInfo.from_exception(exc), "internal"))]
            pending = on_records(records)
            if pending is not None:
                await pending
            done += 1

    await asyncio.gather(*(worker() for _ in range(workers)))
    return done
