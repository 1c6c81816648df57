"""Every experiment, row, step and span as OpenTelemetry spans, for Phoenix, Langfuse,
Jaeger or Datadog: the `OtelExporter` reporter, on when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is.

The tree: ``experiment <project>/<name>`` > ``row <sid>`` > ``task <name>`` and
``evaluator <name>`` > the spans recorded inside each call (their own nesting kept). Each
row's spans are made as it ends (from its records: whatever backend ran it), with their
real start and end times, and sent in requests of `BATCH` spans; the rest and the
experiment's span when the run ends. Model calls carry the GenAI
semantic conventions (``gen_ai.operation.name`` ``chat``, ``gen_ai.request.model``,
``gen_ai.usage.input_tokens``/``output_tokens``), tool calls ``execute_tool`` and
``gen_ai.tool.name``, agents ``invoke_agent``; each evaluation result is a
``gen_ai.evaluation.result`` event on the task span it judged. The OpenTelemetry SDK and
its OTLP exporter do the wire: OTLP/HTTP, or gRPC when ``OTEL_EXPORTER_OTLP_PROTOCOL`` (or
``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``) says ``grpc`` (the ``otlp-grpc`` extra: grpcio is
19 MB installed, which HTTP export never needs); every standard variable applies
(endpoint, headers, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``). A protocol that cannot be had is a
`ConfigError` before the run starts; export problems once it runs are logged, never an
experiment's failure.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import threading
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from patronus_tasks.exceptions import ConfigError
from patronus_tasks.record.records import STATUS_ERROR, Record
from patronus_tasks.trace.capture import export_wanted
from patronus_tasks.trace.spans import SpanData, load_spans

if TYPE_CHECKING:
    from patronus_tasks.record.manifest import Manifest
    from patronus_tasks.record.recorder import RunFacts

logger = logging.getLogger("patronus_tasks.otel")
_PROVIDER: Any = None
_EXPORTER: Any = None
_OPERATIONS = {"llm": "chat", "tool": "execute_tool", "agent": "invoke_agent"}
#: Spans sent in one request: a row's spans wait until this many are ended, then the row
#: that filled the batch waits for it to go (so a slow receiver slows the rows, never
#: drops spans, as a full queue of the SDK's batch processor would, silently).
BATCH = 512


#: OTLP's protocols, as OTEL_EXPORTER_OTLP_PROTOCOL names them: the module of each one's
#: span exporter, its package, and the extra bringing it (none: a dependency).
PROTOCOLS = {"http/protobuf": ("opentelemetry.exporter.otlp.proto.http.trace_exporter",
                               "opentelemetry-exporter-otlp-proto-http", None),
             "grpc": ("opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
                      "opentelemetry-exporter-otlp-proto-grpc", "otlp-grpc")}
_PROTOCOL_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")


def protocol() -> tuple[str, str | None]:
    """The OTLP protocol asked for and the variable that asked (the traces' own first;
    None: ``http/protobuf``, the default of OpenTelemetry's Python SDK); one there is no
    exporter for is a `ConfigError`."""
    for variable in _PROTOCOL_VARIABLES:
        given = os.environ.get(variable, "").strip()
        if given:
            break
    else:
        return "http/protobuf", None
    if given.lower() not in PROTOCOLS:
        raise ConfigError(f"{variable}={given!r} is not an OTLP protocol spans can be exported "
                          f"with here: use {' or '.join(map(repr, PROTOCOLS))}.")
    return given.lower(), variable


def exporter_class() -> Any:
    """The OTLP span exporter of the protocol asked for; its package missing is a
    `ConfigError` naming the extra to install (said as the run is set up, not at its first
    span)."""
    name, variable = protocol()
    module, package, extra = PROTOCOLS[name]
    try:
        return importlib.import_module(module).OTLPSpanExporter
    except ImportError as exc:
        fix = (f"pip install 'patronus-tasks[{extra}]' (it brings {package}), or unset "
               f"{variable} to export over OTLP/HTTP" if extra else f"pip install {package}")
        raise ConfigError(f"exporting spans over OTLP {name}"
                          + (f" ({variable})" if variable else "")
                          + f" needs {package}, which is not installed ({exc}): {fix}.") from None


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


class _Pending:
    """Ended spans waiting to be sent (the provider's span processor)."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self._lock = threading.Lock()

    def take(self) -> list[Any]:
        with self._lock:
            taken, self.spans = self.spans, []
        return taken

    def add(self, span: Any) -> None:
        with self._lock:
            self.spans.append(span)


_PENDING = _Pending()


def _provider() -> Any:
    """The process's exporting provider (never the global one: the user's stays theirs);
    its ended spans wait in `_PENDING` until a reporter sends them."""
    global _PROVIDER, _EXPORTER
    if _PROVIDER is None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

        class Processor(SpanProcessor):
            def on_end(self, span: Any) -> None:
                _PENDING.add(span)

        resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME")
                                    or "patronus-tasks"})
        _PROVIDER = TracerProvider(resource=resource)
        _PROVIDER.add_span_processor(Processor())
        _EXPORTER = exporter_class()()
    return _PROVIDER


def _plain(value: Any) -> Any:
    """An attribute value OpenTelemetry takes: str, bool, int, float (lists of one)."""
    if isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return list(value)
    import json

    return json.dumps(value, default=str)


def _kind(s: SpanData) -> Any:
    """The GenAI conventions' span kind: a model call goes to a model server (CLIENT);
    tools and this package's agents run in the process (INTERNAL)."""
    from opentelemetry.trace import SpanKind

    return SpanKind.CLIENT if s.kind == "llm" else SpanKind.INTERNAL


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
                       ("output.value", s.output),
                       # the conventions' low-cardinality type ("ToolError"); the message
                       # is the span's status description
                       ("error.type", s.error.split(":", 1)[0] if s.error else None)):
        found.setdefault(key, value)
    found.update((k, _plain(v)) for k, v in s.attributes.items())
    return {k: v for k, v in found.items() if v is not None}


class OtelExporter:
    """The reporter exporting an experiment to OpenTelemetry (see the module's note)."""

    name = "opentelemetry"

    def __init__(self) -> None:
        self._tracer: Any = None
        self._root: Any = None
        self.spans = self.exported = self.failed = 0
        self.down: str | None = None  # why the receiver took no more (then none is sent)

    def __getstate__(self) -> dict[str, Any]:
        return {**OtelExporter().__dict__}  # made again where it runs

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

    def add(self, records: list[Record]) -> Awaitable[None] | None:
        if self._tracer is None or not records:
            return None
        try:
            self._row(records)
        except Exception as exc:
            logger.warning("OpenTelemetry: row %s not exported: %s: %s", records[0].sid,
                           type(exc).__name__, exc)
        if len(_PENDING.spans) >= BATCH:
            return asyncio.to_thread(self._send, _PENDING.take())
        return None

    def _send(self, batch: list[Any]) -> None:
        """One request; after a failure, nothing more is sent this run (counted failed):
        a receiver that is down costs the rows one exporter timeout, not one per batch."""
        if not batch:
            return
        if self.down is None:
            from opentelemetry.sdk.trace.export import SpanExportResult

            try:
                ok = _EXPORTER.export(batch) == SpanExportResult.SUCCESS
            except Exception as exc:  # the exporter's own retries are behind it
                ok, self.down = False, f"{type(exc).__name__}: {exc}"
            if ok:
                self.exported += len(batch)
                return
            self.down = self.down or "the receiver refused or did not answer"
        self.failed += len(batch)

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
                                           kind=_kind(s), start_time=_ns(s.start),
                                           attributes=span_attributes(s))
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
        await asyncio.to_thread(self._send, _PENDING.take())
        if self.failed:
            logger.warning("OpenTelemetry: %d of %d spans of %s not exported (%s; is the "
                           "OTEL_EXPORTER_OTLP_ENDPOINT receiver up?); the results are written",
                           self.failed, self.spans + 1, manifest.experiment_name, self.down)
        return {"spans": self.spans + 1, "exported": self.exported, "failed": self.failed}

    def cancel(self) -> None:
        if self._tracer is not None:  # interrupted: what ended goes out, the run's span failed
            self._failed(self._root, "interrupted")
            self._root.end()
            self._send(_PENDING.take())


def reporters() -> list[OtelExporter]:
    """The OpenTelemetry exporter, when the environment asks for one (its protocol's
    exporter checked here, as the run is set up: a missing one stops it before any row)."""
    if not export_wanted():
        return []
    exporter_class()
    return [OtelExporter()]
