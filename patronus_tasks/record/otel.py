"""Every experiment, row, step and span as OpenTelemetry spans, for Phoenix, Langfuse,
Jaeger or Datadog: the `OtelExporter` reporter, on when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is.

The tree: ``experiment <project>/<name>`` > ``row <sid>`` > ``task <name>`` and
``evaluator <name>`` > the spans recorded inside each call (their own nesting kept). Each
row goes out as it ends (from its records: whatever backend ran it), with its real start
and end times; the experiment's span when the run ends. Model calls carry the GenAI
semantic conventions (``gen_ai.operation.name`` ``chat``, ``gen_ai.request.model``,
``gen_ai.usage.input_tokens``/``output_tokens``), tool calls ``execute_tool`` and
``gen_ai.tool.name``, agents ``invoke_agent``; each evaluation result is a
``gen_ai.evaluation.result`` event on the task span it judged. The OpenTelemetry SDK and
its OTLP/HTTP exporter do the wire: every standard variable applies (endpoint, headers,
``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``). Export problems are logged, never an
experiment's failure.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from patronus_tasks.record.records import STATUS_ERROR, Record
from patronus_tasks.trace.capture import export_wanted
from patronus_tasks.trace.spans import SpanData, load_spans

if TYPE_CHECKING:
    from patronus_tasks.record.manifest import Manifest
    from patronus_tasks.record.recorder import RunFacts

logger = logging.getLogger("patronus_tasks.otel")
_PROVIDER: Any = None
#: Spans the exporter delivered and those it gave up on (the SDK retries for up to its
#: timeout, OTEL_EXPORTER_OTLP_TIMEOUT, 10 s by default), for the run's report.
_SENT = {"exported": 0, "failed": 0}
_FLUSH_MS = 15_000
_OPERATIONS = {"llm": "chat", "tool": "execute_tool", "agent": "invoke_agent"}


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def _provider() -> Any:
    """The process's exporting provider (not the global one: the user's stays theirs)."""
    global _PROVIDER
    if _PROVIDER is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME")
                                    or "patronus-tasks"})
        _PROVIDER = TracerProvider(resource=resource)
        _PROVIDER.add_span_processor(BatchSpanProcessor(_counting(OTLPSpanExporter())))
    return _PROVIDER


def _counting(exporter: Any) -> Any:
    """``exporter``, counting what it delivered and what it gave up on (`_SENT`)."""
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class Counting(SpanExporter):
        def export(self, spans: Any) -> Any:
            result = exporter.export(spans)
            _SENT["exported" if result == SpanExportResult.SUCCESS else "failed"] += len(spans)
            return result

        def shutdown(self) -> None:
            exporter.shutdown()

        def force_flush(self, timeout_millis: int = 30_000) -> bool:
            return bool(exporter.force_flush(timeout_millis))

    return Counting()


def _plain(value: Any) -> Any:
    """An attribute value OpenTelemetry takes: str, bool, int, float (lists of one)."""
    if isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return list(value)
    import json

    return json.dumps(value, default=str)


def span_attributes(s: SpanData) -> dict[str, Any]:
    """A span's OpenTelemetry attributes: the GenAI conventions for its kind, then its own."""
    found: dict[str, Any] = {"patronus_tasks.span.kind": s.kind}
    operation = _OPERATIONS.get(s.kind)
    if operation and "gen_ai.operation.name" not in s.attributes:
        found["gen_ai.operation.name"] = operation
    if s.kind == "tool":
        found["gen_ai.tool.name"] = s.name
        found["gen_ai.tool.call.arguments"] = s.arguments
        found["gen_ai.tool.call.result"] = s.output
    elif s.kind == "agent":
        found["gen_ai.agent.name"] = s.name.removeprefix("invoke_agent ")
    if s.model:
        found["gen_ai.request.model"] = s.model
    for key, value in (("gen_ai.usage.input_tokens", s.input_tokens),
                       ("gen_ai.usage.output_tokens", s.output_tokens),
                       ("patronus_tasks.cost_usd", s.cost), ("input.value", s.arguments),
                       ("output.value", s.output), ("error.type", s.error)):
        found.setdefault(key, value)
    found.update((k, _plain(v)) for k, v in s.attributes.items())
    return {k: v for k, v in found.items() if v is not None}


class OtelExporter:
    """The reporter exporting an experiment to OpenTelemetry (see the module's note)."""

    name = "opentelemetry"

    def __init__(self) -> None:
        self._tracer: Any = None
        self._root: Any = None
        self.spans = 0

    def __getstate__(self) -> dict[str, Any]:
        return {"spans": 0, "_tracer": None, "_root": None}  # made again where it runs

    async def start(self, run: RunFacts) -> None:
        try:
            self._tracer = _provider().get_tracer("patronus_tasks")
            self._root = self._tracer.start_span(
                f"experiment {run.project_name}/{run.experiment_name}", attributes={
                    "patronus_tasks.project": run.project_name,
                    "patronus_tasks.experiment": run.experiment_name,
                    "patronus_tasks.experiment_id": run.experiment_id,
                    **{f"patronus_tasks.tag.{k}": v for k, v in run.tags.items()}})
        except Exception as exc:  # telemetry never fails an experiment
            logger.warning("OpenTelemetry export is off for this run: %s: %s", type(exc).__name__, exc)
            self._tracer = None

    def add(self, records: list[Record]) -> None:
        if self._tracer is None or not records:
            return
        try:
            self._row(records)
        except Exception as exc:
            logger.warning("OpenTelemetry: row %s not exported: %s: %s", records[0].sid,
                           type(exc).__name__, exc)

    def _context(self, parent: Any) -> Any:
        from opentelemetry import trace

        return trace.set_span_in_context(parent)

    def _row(self, records: list[Record]) -> None:
        first = records[0]
        steps = [(r.task_started_at, r.task_duration_s) for r in records] + [
            (r.evaluation_started_at, r.evaluation_duration_s) for r in records]
        known = [(s, s + (d or 0.0)) for s, d in steps if s is not None]
        start = min((s for s, _ in known), default=None)
        end = max((e for _, e in known), default=None)
        label = f"row {first.sid}" + (f" r{first.repeat}" if first.repeat is not None else "")
        row = self._tracer.start_span(label, context=self._context(self._root),
                                      start_time=_ns(start) if start else None, attributes={
                                          "patronus_tasks.sid": first.sid,
                                          **({"patronus_tasks.repeat": first.repeat}
                                             if first.repeat is not None else {})})
        for link in sorted({r.link_index or 0 for r in records}):
            self._link([r for r in records if (r.link_index or 0) == link], row)
        if any(r.status == STATUS_ERROR for r in records):
            self._failed(row, "a step of this row failed")
        row.end(end_time=_ns(end) if end else None)
        self.spans += 1

    def _link(self, records: list[Record], row: Any) -> None:
        first = records[0]
        evaluated = [r for r in records if r.evaluator_name is not None]
        if first.task_name is not None:
            self._step(f"task {first.task_name}", first.task_started_at, first.task_duration_s,
                       first.task_spans, row, first if first.error_stage == "task" else None,
                       {"gen_ai.request.model": first.task_model,
                        "gen_ai.usage.input_tokens": first.task_input_tokens,
                        "gen_ai.usage.output_tokens": first.task_output_tokens},
                       evaluated)
        for r in evaluated:
            self._step(f"evaluator {r.evaluator_name}", r.evaluation_started_at,
                       r.evaluation_duration_s, r.evaluation_spans, row,
                       r if r.error_stage == "evaluator" else None,
                       {"patronus_tasks.evaluator": r.evaluator_name, "patronus_tasks.pass": r.pass_,
                        "patronus_tasks.score": r.score}, [])

    def _step(self, name: str, started: float | None, duration: float | None, spans: str | None,
              row: Any, failed: Record | None, attributes: dict[str, Any],
              judged: list[Record]) -> None:
        start = _ns(started) if started is not None else None
        step = self._tracer.start_span(name, context=self._context(row), start_time=start,
                                       attributes={k: v for k, v in attributes.items() if v is not None})
        self._spans(load_spans(spans) or [], step)
        for r in judged:  # each verdict on the span it judged
            step.add_event("gen_ai.evaluation.result", attributes={k: v for k, v in {
                "gen_ai.evaluation.name": r.evaluator_name, "gen_ai.evaluation.score.value": r.score,
                "gen_ai.evaluation.score.label": None if r.pass_ is None else
                ("pass" if r.pass_ else "fail"),
                "gen_ai.evaluation.explanation": r.explanation, "error.type": r.error_type,
            }.items() if v is not None})
        if failed is not None:
            self._failed(step, f"{failed.error_type}: {failed.error_message}")
        end = start + int((duration or 0.0) * 1e9) if start is not None else None
        step.end(end_time=end)
        self.spans += 1

    def _spans(self, spans: list[SpanData], step: Any) -> None:
        made: dict[str, Any] = {}
        for s in spans:  # in start order: a parent before its children
            parent = made.get(s.parent_id or "", step)
            otel = self._tracer.start_span(s.name, context=self._context(parent),
                                           start_time=_ns(s.start), attributes=span_attributes(s))
            if s.error is not None:
                self._failed(otel, s.error)
            made[s.span_id] = otel
        for s in reversed(spans):
            made[s.span_id].end(end_time=_ns(s.end if s.end is not None else s.start))
        self.spans += len(spans)

    @staticmethod
    def _failed(span: Any, message: str) -> None:
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, message[:1000]))

    async def finish(self, manifest: Manifest) -> dict[str, Any] | None:
        if self._tracer is None:
            return None
        if manifest.flow_run_id:
            self._root.set_attribute("prefect.flow_run.id", manifest.flow_run_id)
        self._root.end()
        before = dict(_SENT)
        flushed = bool(_provider().force_flush(_FLUSH_MS))
        failed = _SENT["failed"] - before["failed"]
        if failed or not flushed:
            logger.warning("OpenTelemetry: %d spans of %s could not be exported (is the "
                           "OTEL_EXPORTER_OTLP_ENDPOINT receiver up?); the results are written",
                           failed, manifest.experiment_name)
        return {"spans": self.spans + 1, "flushed": flushed and not failed, "failed": failed}

    def cancel(self) -> None:
        if self._tracer is not None:
            self._failed(self._root, "interrupted")
            self._root.end()
            _provider().force_flush(5_000)  # interrupted: a short wait only


def reporters() -> list[OtelExporter]:
    """The OpenTelemetry exporter, when the environment asks for one."""
    return [OtelExporter()] if export_wanted() else []
