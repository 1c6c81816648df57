"""Spans: the steps inside a task or an evaluator call (model calls, tool calls, retrieval).

`span(name, kind=...)` (a context manager) and `traced` (a decorator) mark them; spans nest
through a context variable, so ``asyncio.gather`` children and threads started with a copied
context keep their parent. Each call of a step collects its spans in a `Collector` the
runner opens around it (`collecting`); a span outside any call records nothing.

Costs (measured, 2 cores, bench/spans.py): a span with small arguments is ~40 us of the
row's time (one ``orjson`` dump each of arguments and output, two context-variable sets);
nothing else runs until the call ends.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson

#: How much of a span's arguments and of its output is kept: their JSON text cut at this
#: many characters (with ``"..."`` after), so one huge document cannot swell the results.
MAX_VALUE_CHARS = 4000
#: Span kinds this package gives meaning to; any other string is the user's own kind.
KINDS = ("llm", "tool", "retrieval", "agent", "custom")
#: Attributes that are typed fields of a span, not free attributes.
TYPED = frozenset({"model", "input_tokens", "output_tokens", "cost", "output", "arguments", "error"})
LEFT_OPEN = "left open: the call ended (it raised, timed out or crashed) before this span closed"
#: The attribute marking the spans of an attempt that failed and was retried: kept (what
#: it did is part of the run), out of the `Trace` evaluators read (the last attempt's).
FAILED_ATTEMPT = "failed_attempt"


def _dump(value: Any) -> str:
    try:
        text = orjson.dumps(value, default=str, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:  # a value orjson cannot walk (circular, an int past 64 bits)
        text = orjson.dumps(repr(value)).decode()
    return cut(text)


def cut(text: str) -> str:
    """``text`` cut at `MAX_VALUE_CHARS` (then ``...`` after)."""
    return text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS] + "..."


def plain(value: Any) -> Any:
    """An attribute's value as JSON holds it: scalars as they are (texts cut), anything
    else through its JSON form (dict keys as text; what JSON cannot hold, its ``str``)."""
    if value is None or isinstance(value, bool | float):
        return value
    if isinstance(value, int):
        return value if -2**63 <= value < 2**63 else str(value)
    if isinstance(value, str):
        return cut(value)
    text = _dump(value)
    return orjson.loads(text) if len(text) <= MAX_VALUE_CHARS else text


def _typed(key: str, value: Any) -> Any:
    """A typed field's value, or raise ValueError (then it is kept as an attribute)."""
    if value is None:
        return None
    if key == "model" or key == "error":
        return str(value)
    if key in ("input_tokens", "output_tokens"):
        count = int(value)
        if (count != value and not isinstance(value, str)) or count < 0:
            raise ValueError(value)
        return count
    price = float(value)  # cost
    if price < 0:
        raise ValueError(value)
    return price


def new_span_id() -> str:
    """A span id as OpenTelemetry writes one: 16 hex digits."""
    return os.urandom(8).hex()


@dataclass(slots=True)
class SpanData:
    """One span as recorded: what the results' ``spans.parquet`` holds a row of."""

    span_id: str
    parent_id: str | None
    name: str
    kind: str
    start: float  # seconds since the epoch
    end: float | None = None
    arguments: str | None = None  # JSON text, cut at MAX_VALUE_CHARS
    output: str | None = None  # JSON text, cut at MAX_VALUE_CHARS
    error: str | None = None  # "<Type>: <message>" when it raised
    model: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost: float | None = None
    attributes: dict[str, Any] = field(default_factory=dict)

    @property
    def duration(self) -> float | None:
        return None if self.end is None else self.end - self.start

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _FIELDS}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpanData:
        return cls(**{k: v for k, v in data.items() if k in _FIELDS})


_FIELDS = tuple(SpanData.__dataclass_fields__)


class Collector:
    """The spans of one call of a step, in the order they ended (children first)."""

    __slots__ = ("closed", "foreign", "open", "spans")

    def __init__(self) -> None:
        self.spans: list[SpanData] = []
        self.open: dict[str, SpanData] = {}
        self.closed = False  # harvested: a thread still running adds nothing more
        #: Spans of the user's OpenTelemetry instrumentation (`capture`): the span of ours
        #: open when each ended, their parent when their own is not of this call.
        self.foreign: dict[str, str | None] = {}

    def harvest(self) -> list[SpanData] | None:
        """The call's spans, those left open closed as failed; None when there are none."""
        self.closed = True
        now = time.time()
        for data in list(self.open.values()):
            data.end, data.error = now, data.error or LEFT_OPEN
            self.spans.append(data)
        self.open.clear()
        if self.foreign:
            ids = {s.span_id for s in self.spans}
            for s in self.spans:
                if s.span_id in self.foreign and s.parent_id not in ids:
                    s.parent_id = self.foreign[s.span_id]
        return sorted(self.spans, key=lambda s: s.start) if self.spans else None


#: The collector of the call running here, and the innermost open span's id.
_CURRENT: contextvars.ContextVar[tuple[Collector, str | None] | None] = contextvars.ContextVar(
    "patronus_tasks_span", default=None)


@contextmanager
def collecting(collector: Collector) -> Iterator[Collector]:
    """Make ``collector`` receive the spans opened inside (the runner, around one call)."""
    token = _CURRENT.set((collector, None))
    try:
        yield collector
    finally:
        _CURRENT.reset(token)


def current_collector() -> tuple[Collector, str | None] | None:
    """The call's collector and the innermost open span's id here (None outside a call)."""
    return _CURRENT.get()


class Span:
    """An open span, as ``with span(...) as s`` gives it: ``s.set(output=..., **attributes)``."""

    __slots__ = ("_token", "data", "sink")

    def __init__(self, data: SpanData, sink: Collector | None) -> None:
        self.data, self.sink = data, sink
        self._token: contextvars.Token[Any] | None = None

    @property
    def span_id(self) -> str:
        return self.data.span_id

    def set(self, **values: Any) -> Span:
        """Set the output (``output=``), arguments, model, tokens, cost or any attribute."""
        data = self.data
        for key, value in values.items():
            if key in ("output", "arguments"):
                setattr(data, key, None if value is None else _dump(value))
                continue
            if key in TYPED:
                try:
                    setattr(data, key, _typed(key, value))
                    continue
                except (TypeError, ValueError):  # not a count, a price: kept, as an attribute
                    pass
            data.attributes[key] = plain(value)
        return self

    def __enter__(self) -> Span:
        if self.sink is not None:
            self.sink.open[self.data.span_id] = self.data
            self._token = _CURRENT.set((self.sink, self.data.span_id))
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        self.close(exc)

    def close(self, exc: BaseException | None = None) -> None:
        """End the span (failed when ``exc`` is given); what ``with`` does on leaving."""
        data = self.data
        data.end = time.time()
        if exc is not None:
            data.error = f"{type(exc).__name__}: {exc}"
        if self._token is not None:
            # Closed in another context than it opened in (a generator): keep going.
            with contextlib.suppress(ValueError):
                _CURRENT.reset(self._token)
            self._token = None
        sink = self.sink
        if sink is not None and sink.open.pop(data.span_id, None) is not None and not sink.closed:
            sink.spans.append(data)


def span(name: str, kind: str = "custom", **attributes: Any) -> Span:
    """A span named ``name`` of ``kind`` (``llm``, ``tool``, ``retrieval``, ``agent`` or
    your own), with ``attributes``: ``with span("search", kind="retrieval", query=q) as s:
    s.set(output=hits)``. Inside a step's call it is recorded with the call's results; the
    typed ones (``arguments``, ``output``, ``model``, ``input_tokens``, ``output_tokens``,
    ``cost``) may be given here or by ``set``."""
    here = _CURRENT.get()
    sink, parent = (here[0], here[1]) if here is not None else (None, None)
    made = Span(SpanData(new_span_id(), parent, name, kind, time.time()), sink)
    if attributes:
        made.set(**attributes)
    return made


def dump_spans(spans: list[SpanData] | None) -> str | None:
    """A call's spans as the JSON text of the results' ``*_spans`` columns and cache entries."""
    if not spans:
        return None
    return orjson.dumps([s.to_dict() for s in spans], default=str,
                        option=orjson.OPT_NON_STR_KEYS).decode()


def renewed(spans: list[SpanData], start: float) -> list[SpanData]:
    """Copies of a cached call's spans as this call's: new ids (parents following), their
    times moved to start at ``start``; what they recorded kept."""
    ids = {s.span_id: new_span_id() for s in spans}
    shift = start - min(s.start for s in spans)
    return [SpanData(ids[s.span_id], ids.get(s.parent_id or "", s.parent_id), s.name, s.kind,
                     s.start + shift, None if s.end is None else s.end + shift, s.arguments,
                     s.output, s.error, s.model, s.input_tokens, s.output_tokens, s.cost,
                     {**s.attributes, "cached": True}) for s in spans]


def load_spans(text: str | bytes | None) -> list[SpanData] | None:
    """The spans `dump_spans` wrote (None: none)."""
    if not text:
        return None
    return [SpanData.from_dict(d) for d in orjson.loads(text)]
