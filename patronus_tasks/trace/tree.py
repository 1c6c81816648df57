"""A call's spans as evaluators read them: `Trace` (the task's spans, tool calls, totals)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from patronus_tasks.trace.spans import SpanData


def json_or_text(value: Any) -> Any:
    """A text's JSON value, or the text itself when it is none (cut at `MAX_VALUE_CHARS`,
    a model's malformed arguments); anything but a text as it is."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


@dataclass(frozen=True)
class ToolCall:
    """One tool call of a trajectory: the tool's name, its arguments, what it returned or
    the error it raised."""

    name: str
    arguments: Any = None
    output: Any = None
    error: str | None = None

    @classmethod
    def of(cls, data: SpanData) -> ToolCall:
        """The call a ``tool`` span recorded; its tool's name is the span's, or the one its
        attributes say when an instrumentor's span is named otherwise (the GenAI
        conventions' ``execute_tool get_weather``, OpenInference's ``tool.name``)."""
        named = data.attributes.get("gen_ai.tool.name") or data.attributes.get("tool.name")
        return cls(str(named or data.name), json_or_text(data.arguments),
                   json_or_text(data.output), data.error)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments, "output": self.output,
                "error": self.error}


class Trace:
    """The spans one call of the task recorded (an agent's model and tool calls), in start
    order, and what they add up to; ``duration`` is the call's wall time."""

    def __init__(self, spans: Iterable[SpanData] | None, duration: float | None = None,
                 cost: float | None = None) -> None:
        self.spans: list[SpanData] = sorted(spans or (), key=lambda s: s.start)
        self.duration, self._cost = duration, cost

    def cache_key(self) -> list[Any]:
        """What the spans recorded, for a cache key (an evaluator reading ``trace`` answered
        from the cache when the task did the same): no ids, no times."""
        return [[s.name, s.kind, s.arguments, s.output, s.error, s.model, s.input_tokens,
                 s.output_tokens] for s in self.spans]

    def __iter__(self) -> Iterator[SpanData]:
        return iter(self.spans)

    def __len__(self) -> int:
        return len(self.spans)

    def of_kind(self, kind: str) -> list[SpanData]:
        return [s for s in self.spans if s.kind == kind]

    def tool_calls(self) -> list[ToolCall]:
        """The tool calls, in the order they were made."""
        return [ToolCall.of(s) for s in self.of_kind("tool")]

    def llm_calls(self) -> list[SpanData]:
        return self.of_kind("llm")

    def find(self, name: str | None = None, kind: str | None = None,
             attributes: Mapping[str, Any] | None = None) -> list[SpanData]:
        """The spans with this name, kind and these attribute values (each given one)."""
        return [s for s in self.spans if (name is None or s.name == name)
                and (kind is None or s.kind == kind)
                and all(s.attributes.get(k) == v for k, v in (attributes or {}).items())]

    def children(self, parent_id: str | None) -> list[SpanData]:
        return [s for s in self.spans if s.parent_id == parent_id]

    @property
    def input_tokens(self) -> int:
        return sum(s.input_tokens or 0 for s in self.llm_calls())

    @property
    def output_tokens(self) -> int:
        return sum(s.output_tokens or 0 for s in self.llm_calls())

    @property
    def cost(self) -> float | None:
        """What the call cost: its result's usage priced, else its model calls' costs
        summed (None when none is known)."""
        if self._cost is not None:
            return self._cost
        known = [s.cost for s in self.llm_calls() if s.cost is not None]
        return sum(known) if known else None
