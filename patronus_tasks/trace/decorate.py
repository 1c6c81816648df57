"""`traced`: a function's calls as spans (sync and async), as the Patronus SDK's ``@traced``.

A span is named as the SDK names it, after the function's qualified name (``Agent.plan``),
except a tool's: a ``kind="tool"`` span is named after the function itself (``__name__``),
the name a model calls the tool by and a dataset's expected tool calls say. A tool made in
a factory or a class (``build.<locals>.get_weather``) would otherwise never match them.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, overload

from patronus_tasks.trace.spans import Span, SpanData, current_collector, new_span_id, span

F = TypeVar("F", bound=Callable[..., Any])
#: The id of the tool span an agent opened around the tool call running here (`tool_call`).
_AGENT_CALL: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "patronus_tasks_tool_call", default=None)


@contextmanager
def tool_call(opened: Span) -> Iterator[Span]:
    """Mark ``opened`` (an agent's span of one tool call) as the span of the tool it runs:
    a ``@traced(kind="tool")`` function called right inside records into it, not a second
    tool span (a trajectory would count the call twice)."""
    token = _AGENT_CALL.set(opened.span_id)
    try:
        yield opened
    finally:
        _AGENT_CALL.reset(token)


class _InTheAgentsSpan(Span):
    """A traced tool's span recording nothing: the agent's span of the call records it.
    Inside, the mark is off: a tool the tool calls is a span of its own."""

    __slots__ = ("_mark",)

    def __enter__(self) -> Span:
        self._mark = _AGENT_CALL.set(None)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        _AGENT_CALL.reset(self._mark)


def _the_agents_call(attributes: dict[str, Any]) -> Span | None:
    """An `_InTheAgentsSpan` when an agent's tool span of this call is open right here
    (the traced tool's attributes go to that span); None otherwise."""
    here = current_collector()
    if here is None or here[1] is None or here[1] != _AGENT_CALL.get():
        return None
    outer = here[0].open.get(here[1])
    if outer is None:
        return None
    if attributes:
        Span(outer, None).set(**attributes)
    return _InTheAgentsSpan(SpanData(new_span_id(), None, outer.name, "tool", time.time()), None)


def default_name(fn: Callable[..., Any], kind: str) -> str:
    """A span's name when none is given: a tool's ``__name__``, others' ``__qualname__``."""
    own = getattr(fn, "__name__", None) or type(fn).__name__
    return own if kind == "tool" else getattr(fn, "__qualname__", own)


def _arguments(signature: inspect.Signature, args: Any, kwargs: Any) -> dict[str, Any]:
    try:
        binding = signature.bind(*args, **kwargs)
    except TypeError:
        return {"args": args, "kwargs": kwargs}
    # As given, defaults left out: as the Patronus SDK's @traced records them, and as an
    # agent's tool call says them (a trajectory compared with args="exact" against the
    # expected {"query": "alpha"} would fail on a default {"limit": 2} nobody passed).
    bound = binding.arguments
    bound.pop("self", None)
    bound.pop("cls", None)
    return dict(bound)


def _wrap(fn: Callable[..., Any], name: str, kind: str, log_args: bool, log_results: bool,
          attributes: dict[str, Any]) -> Any:
    signature = inspect.signature(fn)

    def opened(args: Any, kwargs: Any) -> Any:
        if kind == "tool":
            merged = _the_agents_call(attributes)
            if merged is not None:
                return merged
        made = span(name, kind, **attributes)
        if log_args:
            made.set(arguments=_arguments(signature, args, kwargs))
        return made

    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def run(*args: Any, **kwargs: Any) -> Any:
            with opened(args, kwargs) as s:
                result = await fn(*args, **kwargs)
                if log_results:
                    s.set(output=result)
                return result
        return run

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        with opened(args, kwargs) as s:
            result = fn(*args, **kwargs)
            if log_results:
                s.set(output=result)
            return result
    return call


@overload
def traced(fn: F, /) -> F: ...
@overload
def traced(*, name: str | None = None, kind: str = "custom", span_name: str | None = None,
           log_args: bool = True, log_results: bool = True, **attributes: Any) -> Callable[[F], F]: ...
def traced(fn: Callable[..., Any] | None = None, /, *, name: str | None = None, kind: str = "custom",
           span_name: str | None = None, log_args: bool = True, log_results: bool = True,
           **attributes: Any) -> Any:
    """Each call of the function a span (``@traced`` or ``@traced(name=..., kind=...)``):
    named after the function, its bound arguments as ``arguments``, its return value as
    ``output``, an exception as its error (re-raised). Named `default_name` unless
    ``name=`` is given. The SDK's ``span_name=``, ``log_args=`` and ``log_results=`` work
    too; other keywords are the span's attributes."""
    given = attributes.pop("attributes", None)  # the SDK's attributes={...}
    for sdk_only in ("log_exceptions", "disable_log"):
        attributes.pop(sdk_only, None)
    attributes = {**(given if isinstance(given, dict) else {}), **attributes}

    def wrap(f: Callable[..., Any]) -> Any:
        return _wrap(f, name or span_name or default_name(f, kind), kind, log_args, log_results, attributes)

    return wrap(fn) if fn is not None else wrap
