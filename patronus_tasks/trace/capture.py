"""Spans the user's own OpenTelemetry instrumentation opens inside a call, captured as ours.

An OpenInference or OpenLLMetry instrumentor (or the user's own tracer) records spans on
the global OpenTelemetry `TracerProvider`. `install` adds a span processor to it which,
when such a span ends inside a step's call (our context variable says which), turns it into
a `SpanData` of that call: its ``gen_ai.*`` (GenAI semantic conventions) or OpenInference
attributes read as its kind, model, tokens, arguments and output, the rest kept as its
attributes. Spans ended outside any call are left alone (one context-variable read).

`install` runs where rows run (each process's first `RowRunner`): when the global provider
is an SDK one (the user configured OpenTelemetry, as ``phoenix.otel.register()`` or their
own set-up does), the processor is added to it. None is ever set here: the global
provider can be set once per process, and a user setting theirs later must not be
refused. Without one, instrumentors record nothing, and nothing is imported.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from patronus_tasks.trace.spans import SpanData, current_collector, cut, plain

_INSTALLED: set[int] = set()
_LOCK = threading.Lock()
#: OpenInference span kinds, and GenAI operation names, as our kinds.
_KINDS = {"LLM": "llm", "TOOL": "tool", "RETRIEVER": "retrieval", "AGENT": "agent",
          "EMBEDDING": "llm", "chat": "llm", "text_completion": "llm", "generate_content": "llm",
          "embeddings": "llm", "execute_tool": "tool", "invoke_agent": "agent",
          "create_agent": "agent"}
_FIRST = {  # our typed field: the attributes it is read from, first found wins
    "model": ("gen_ai.request.model", "gen_ai.response.model", "llm.model_name"),
    "input_tokens": ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens",
                     "llm.token_count.prompt"),
    "output_tokens": ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens",
                      "llm.token_count.completion"),
    "arguments": ("input.value", "gen_ai.tool.call.arguments"),
    "output": ("output.value", "gen_ai.tool.call.result"),
}


def export_wanted() -> bool:
    """Whether the standard OpenTelemetry variables ask for traces to be exported."""
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    if os.environ.get("OTEL_TRACES_EXPORTER", "otlp").lower() in ("none", ""):
        return False
    return bool(os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def _hex(span_id: int) -> str:
    return format(span_id, "016x")


def _kind(attributes: dict[str, Any]) -> str:
    kind = attributes.get("openinference.span.kind") or attributes.get("gen_ai.operation.name")
    return _KINDS.get(str(kind), "custom") if kind else "custom"


def span_data(span: Any, fallback_parent: str | None) -> SpanData:
    """An ended OpenTelemetry span as a `SpanData` (its parent: its OpenTelemetry parent,
    resolved at harvest to ``fallback_parent`` when that one is not of this call)."""
    attributes = dict(span.attributes or {})
    typed = {name: next((attributes[k] for k in keys if k in attributes), None)
             for name, keys in _FIRST.items()}
    error = None
    if span.status is not None and span.status.status_code.name == "ERROR":
        error = span.status.description or "error"
    parent = span.parent
    data = SpanData(_hex(span.context.span_id),
                    _hex(parent.span_id) if parent is not None else fallback_parent,
                    span.name, _kind(attributes), span.start_time / 1e9,
                    (span.end_time or span.start_time) / 1e9, error=error,
                    model=typed["model"], input_tokens=typed["input_tokens"],
                    output_tokens=typed["output_tokens"], attributes=attributes)
    for name in ("arguments", "output"):
        if typed[name] is not None:
            setattr(data, name, cut(str(typed[name])))
    data.attributes = {k: plain(v) for k, v in attributes.items()}  # texts cut, as ours
    return data


def capture(span: Any) -> None:
    """An ended span, to the collector of the call it ended in (if any)."""
    here = current_collector()
    if here is None or here[0].closed:
        return
    collector, innermost = here
    data = span_data(span, innermost)
    collector.foreign[data.span_id] = innermost
    collector.spans.append(data)


def _processor() -> Any:
    """A span processor of the SDK's kind (it is the SDK's base class that the provider
    calls into: its hooks change between releases) calling `capture`."""
    from opentelemetry.sdk.trace import SpanProcessor

    class CaptureProcessor(SpanProcessor):
        def on_end(self, span: Any) -> None:
            capture(span)

    return CaptureProcessor()


def install() -> bool:
    """Capture the user's OpenTelemetry spans inside calls (see the module's note); True
    when a provider captures them."""
    if "opentelemetry.sdk.trace" not in sys.modules:
        return False  # no SDK in use: nothing records such spans
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    with _LOCK:
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            return False
        if id(provider) not in _INSTALLED:
            _INSTALLED.add(id(provider))
            provider.add_span_processor(_processor())
    return True
