"""Spans: what happens inside a task or an evaluator call, recorded with its results.

`span` and `traced` mark steps (``patronus_tasks.span`` / ``patronus_tasks.traced``); each
call of a step collects its spans (`spans.Collector`), which go with its results into the
results' ``task_spans``/``evaluation_spans`` columns, the experiment's ``spans.parquet``,
Prefect (a nested task run each) and OpenTelemetry (`otel`). Evaluators read a task's
spans as a `Trace` (``trace`` parameter).

May import: the standard library, orjson and ``exceptions`` (a bottom layer: the model
clients, the runner and the evaluators all use it); `otel` imports the OpenTelemetry SDK,
only when used.
"""

from patronus_tasks.trace.decorate import traced
from patronus_tasks.trace.spans import (
    MAX_VALUE_CHARS,
    Collector,
    Span,
    SpanData,
    collecting,
    dump_spans,
    load_spans,
    span,
)
from patronus_tasks.trace.tree import ToolCall, Trace

__all__ = ["MAX_VALUE_CHARS", "Collector", "Span", "SpanData", "ToolCall", "Trace", "collecting",
           "dump_spans", "load_spans", "span", "traced"]
__all__.sort()
