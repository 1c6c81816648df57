"""What a sweep's variants share as their rows run: one limit on calls, and task outputs.

Every call of every variant goes through `SweepSteps`, which holds one of the sweep's
``max_concurrency`` slots while the call runs: the variants' rows wait in one queue
(first come, first served), so they interleave instead of running one after another.

A task that several variants run on the same row, with the same inputs, is called once:
the first variant to ask runs it, and each other one waits for its output and judges the
same text (`SharedCalls`). Inputs are the same when the task does not ask for ``tags``
nor ``parent`` (which differ from variant to variant) and the variants' values agree on
every key of ``variant`` the call read (a task that reads only ``variant["model"]`` is
shared by the variants of one model, whatever their rubric). A variant that takes an
output records it as its own: the same value, spans, tokens and cost (what it would have
cost alone), its Prefect task run ``Cached`` (no call was made). A call that failed is
not shared: each variant then makes its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from patronus_tasks.define.steps import Step, Task
from patronus_tasks.define.variant import VariantValues
from patronus_tasks.run.runner import Invocation, StepRunner

_MISSING = object()
#: A task reading any of these is not shared: they differ between variants.
_UNSHARED_INPUTS = frozenset({"tags", "parent"})


def shareable(task: Task) -> bool:
    """Whether ``task``'s inputs can be the same in two variants."""
    return not (_UNSHARED_INPUTS & set(task.signature.names))


def _same(a: Any, b: Any) -> bool:
    try:
        return a is b or bool(a == b)
    except Exception:  # an == that answers no bool (an array): not the same
        return False


def _differ(a: Mapping[str, Any], b: Mapping[str, Any], keys: Iterable[str] | None) -> bool:
    """Whether two variants' values differ on ``keys`` (None: on any key)."""
    keys = set(a) | set(b) if keys is None else keys
    return any(not _same(a.get(k, _MISSING), b.get(k, _MISSING)) for k in keys)


@dataclass
class _Entry:
    """One call of a task on one row, made by one variant (its values)."""

    values: Mapping[str, Any]
    done: asyncio.Event = field(default_factory=asyncio.Event)
    read: set[str] | None = None  # the keys of ``variant`` it read (None: not known yet)
    outcome: Invocation | None = None  # the call, when it succeeded


class SharedCalls:
    """Task calls of a sweep's variants, by task and call name (a row, link and repeat),
    until every variant running the task has passed that call."""

    def __init__(self, members: Mapping[int, int]) -> None:
        self.members = dict(members)  # id(task) -> variants that run it
        self.entries: dict[tuple[int, str], list[_Entry]] = {}
        self.passed: dict[tuple[int, str], int] = {}
        self.learned: dict[int, set[str]] = {}  # keys the task's calls read so far
        self.shared = 0  # calls answered by another variant's output

    def shares(self, step: Step) -> bool:
        return self.members.get(id(step), 0) > 1

    async def find(self, step: Step, name: str, values: Mapping[str, Any]) -> Invocation | None:
        """Another variant's successful call with the same inputs, waited for if running."""
        entries, i = self.entries.get((id(step), name), []), 0
        while i < len(entries):  # calls claimed while this one waited are looked at too
            entry, i = entries[i], i + 1
            if not entry.done.is_set():
                learned = self.learned.get(id(step))
                if learned is not None and _differ(values, entry.values, learned):
                    continue  # its call will not be ours: no need to wait for it
                await entry.done.wait()
            if entry.outcome is not None and not _differ(values, entry.values, entry.read):
                self.shared += 1
                return entry.outcome
        return None

    def claim(self, step: Step, name: str, values: Mapping[str, Any]) -> _Entry:
        entry = _Entry(values)
        self.entries.setdefault((id(step), name), []).append(entry)
        return entry

    def settle(self, step: Step, entry: _Entry, inv: Invocation, read: set[str] | None) -> None:
        entry.read = read
        if inv.error is None and read is not None:
            entry.outcome = inv
            known = self.learned.setdefault(id(step), set())
            known |= read
        entry.done.set()

    def passed_by(self, step: Step, name: str) -> None:
        """One variant is past this call: once all are, it is forgotten."""
        key = (id(step), name)
        self.passed[key] = self.passed.get(key, 0) + 1
        if self.passed[key] >= self.members.get(id(step), 0):
            self.entries.pop(key, None)
            self.passed.pop(key, None)


class SweepSteps:
    """A variant's step runner in a sweep: its calls under the sweep's one limit, its task
    outputs shared with the other variants (`SharedCalls`)."""

    def __init__(self, inner: StepRunner, slots: asyncio.Semaphore,
                 shared: SharedCalls | None, values: Mapping[str, Any]) -> None:
        self.inner, self.slots, self.shared, self.values = inner, slots, shared, values

    async def run(self, inv: Invocation, upstream: str | None) -> None:
        shared = self.shared
        if inv.cached or shared is None or not shared.shares(inv.step):
            await self._call(inv, upstream)
            return
        try:
            found = await shared.find(inv.step, inv.run_name, self.values)
            if found is not None:
                await self._take(found, inv, upstream)
                return
            entry = shared.claim(inv.step, inv.run_name, self.values)
            view = inv.kwargs.get("variant")
            noted = view.noting() if isinstance(view, VariantValues) else None
            if noted is not None:
                inv.kwargs["variant"] = noted
            try:
                await self._call(inv, upstream)
            finally:
                shared.settle(inv.step, entry, inv, noted.read if noted is not None else set())
        finally:
            shared.passed_by(inv.step, inv.run_name)

    async def _call(self, inv: Invocation, upstream: str | None) -> None:
        if inv.cached:  # the cache answers: no call, no slot
            await self.inner.run(inv, upstream)
            return
        async with self.slots:
            await self.inner.run(inv, upstream)

    async def _take(self, found: Invocation, inv: Invocation, upstream: str | None) -> None:
        """Another variant's output as this call's: recorded (a ``Cached`` task run on
        Prefect), no call made, its cost kept (what this variant would have paid)."""
        inv.value, inv.attempts, inv.duration = found.value, found.attempts, found.duration
        inv.spans, inv.started, inv.spent = found.spans, found.started, found.spent
        inv.cached = True
        try:
            await self.inner.run(inv, upstream)
        finally:
            inv.cached = False
        inv.cost = found.cost
