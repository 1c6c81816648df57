"""One call of user code for one row (`Invocation`): its attempts, its result or error,
its spans, what it cost. Its own module: the row runner (`runner`) and what records a
call (Prefect's `prefect/runs/calls.py`, `prefect/ui/display.py`) read it."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import Any

from patronus_tasks.define.prices import PriceTable
from patronus_tasks.define.step_results import (
    Usage,
    to_evaluation_result,
    to_task_result,
)
from patronus_tasks.define.steps import Step, Task
from patronus_tasks.record.records import (
    ErrorInfo,
    Paid,
    spent_by,
)
from patronus_tasks.trace.spans import (
    FAILED_ATTEMPT,
    Collector,
    SpanData,
    collecting,
)
from patronus_tasks.trace.tree import Trace


def call_name(step: str, sid: str, link_index: int | None, repeat: int | None = None) -> str:
    """A call's task-run name, unique in its experiment run: ``<step>-<sid>``, later links
    ``-link<N>``, repeats ``-r<k>``."""
    return (f"{step}-{sid}" + (f"-link{link_index}" if link_index else "")
            + (f"-r{repeat}" if repeat is not None else ""))


class Invocation:
    """One call of a step (task or evaluator) for one row, and what came of it."""

    __slots__ = (
        "attempts",
        "cached",
        "collector",
        "cost",
        "duration",
        "error",
        "handle",
        "kwargs",
        "pool",
        "prices",
        "raised",
        "run_name",
        "sid",
        "spans",
        "spent",
        "started",
        "step",
        "value",
    )

    def __init__(self, step: Step, kwargs: dict[str, Any], run_name: str,
                 pool: Executor | None, sid: str = "") -> None:
        self.step, self.kwargs, self.run_name, self.pool = step, kwargs, run_name, pool
        self.sid = sid
        self.value: Any = None
        self.error: ErrorInfo | None = None
        self.raised: BaseException | None = None  # what the step's own code raised last
        self.attempts = 0
        self.duration = 0.0
        self.cached = False  # answered from the cache: no call is made
        self.cost: float | None = None  # what the call cost in USD, when known
        self.spent: Usage | None = None  # its model spans' usage when its result has none
        self.prices: PriceTable | None = None  # what its cost is reckoned at, once it ended
        self.handle: str | None = None  # the orchestrator's id of the call, for downstream links
        self.collector: Collector | None = None  # made at the first attempt
        self.spans: list[SpanData] | None = None  # what the call's spans recorded, once it ended
        self.started: float | None = None  # when its first attempt started (epoch seconds)

    def paid(self) -> Paid | None:
        """What the call cost and whether the cache answered it; None when none was made."""
        return Paid(self.cost, self.cached, self.spent) if self.attempts or self.cached else None

    async def attempt(self) -> None:
        """Call the step once; store the converted result, or the error and re-raise it."""
        self.attempts += 1
        start = time.perf_counter()
        collector = self._new_collector()
        try:
            with collecting(collector):  # the spans user code opens land here
                raw = await self._call()
            self.value = self._convert(raw)
            self.error = None
        except Exception as exc:
            self.error, self.raised = ErrorInfo.from_exception(exc), exc
            raise
        finally:
            self.duration += time.perf_counter() - start

    def _call(self) -> Awaitable[Any]:
        fn = self.step.fn
        if self.step.is_async:
            return fn(**self.kwargs)  # type: ignore[no-any-return,unused-ignore]
        policy = self.step.inline_policy
        if policy.inline:  # cheap sync code: a thread hand-off would cost more than the call
            return _settled(policy.call, fn, self.kwargs)
        # Sync user code runs in a thread so one slow call never blocks the others;
        # the copied context keeps Prefect's run context (and its logger) visible.
        call = functools.partial(contextvars.copy_context().run, _carrying, policy.call, fn,
                                 self.kwargs)
        return _uncarried(asyncio.get_running_loop().run_in_executor(self.pool, call))

    def _convert(self, raw: Any) -> Any:
        if isinstance(self.step, Task):
            return to_task_result(raw)
        return to_evaluation_result(raw)

    def record_timeout(self, seconds: float | None) -> None:
        what = f"{self.step.kind} {self.step.name!r} timed out after {seconds} s"
        if self.step.is_judge:  # no verdict: unscored, as when its endpoint timed out
            self.error = ErrorInfo("JudgeError", f"{what} (timeout_seconds): no verdict")
        else:
            self.error = ErrorInfo("TimeoutError", what)

    def _new_collector(self) -> Collector:
        """A collector for this attempt; an earlier attempt's spans kept, marked failed."""
        if self.collector is None:
            self.started = time.time()
        else:
            earlier = self.collector.harvest() or []
            for span in earlier:
                span.attributes[FAILED_ATTEMPT] = self.attempts - 1
            self.spans = [*(self.spans or ()), *earlier] or None
        self.collector = Collector()
        return self.collector

    def harvest(self) -> None:
        """Take the call's spans (those still open closed as failed: a crash, a timeout),
        the earlier attempts' first."""
        if self.collector is not None:
            spans = [*(self.spans or ()), *(self.collector.harvest() or ())]
            self.spans = spans or None
            self.collector = None
        if self.prices is not None and not self.cached:
            self._settle(self.prices)

    def _settle(self, prices: PriceTable) -> None:
        """What the call cost, its spans' model calls priced: here, as it ends, so that
        what records it (its Prefect task run's message, its spans') says the cost."""
        usage = getattr(self.value, "usage", None)
        if self.spans:
            _price(self.spans, prices)
            if usage is None:  # its model calls were paid, whether it answered or not
                usage = self.spent = spent_by(self.spans)
        self.cost = None if usage is None else prices.cost(usage)

    def trace(self) -> Trace:
        """What evaluators read of the call: its last attempt's spans, its wall time (a
        cached call's: its spans' extent), what it cost (a cached one: what its spans did)."""
        spans = [s for s in self.spans or () if FAILED_ATTEMPT not in s.attributes]
        duration: float | None = self.duration if self.attempts else None
        ends = [s.end for s in spans if s.end is not None]
        if duration is None and spans and ends:
            duration = max(ends) - min(s.start for s in spans)
        return Trace(spans, duration, None if self.cached else self.cost)


def _price(spans: list[SpanData], prices: PriceTable) -> None:
    """Model calls' costs, from their tokens at the experiment's prices (``prices=``)."""
    for s in spans:
        if s.cost is None and s.model and s.input_tokens is not None:
            try:
                s.cost = prices.cost(Usage(model=s.model, input_tokens=s.input_tokens,
                                           output_tokens=s.output_tokens or 0))
            except ValueError:  # tokens a user's span gave that no price reads: unknown
                s.cost = None


class _Carried(Exception):
    """A TimeoutError on its way out of a thread. asyncio makes a new one of any
    TimeoutError crossing from a thread's future (`futures._convert_future_exc`), with the
    message only: the user's traceback (which call timed out where) was lost."""

    def __init__(self, error: TimeoutError) -> None:
        self.error = error


def _carrying(call: Callable[..., Any], *args: Any) -> Any:
    try:
        return call(*args)
    except TimeoutError as exc:
        raise _Carried(exc) from None


async def _uncarried(future: Awaitable[Any]) -> Any:
    try:
        return await future
    except _Carried as carried:
        error, context = carried.error, carried.error.__context__
        try:
            raise error  # its own cause kept (`raise ... from e` in the user's code)
        finally:
            error.__context__ = context  # not the carrier


def _settled(call: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
    """``call(*args)`` run now, as an awaitable holding its result or exception."""
    future = asyncio.get_running_loop().create_future()
    try:
        future.set_result(call(*args))
    except Exception as exc:
        future.set_exception(exc)
    return future
