"""A real OTLP/HTTP trace receiver on 127.0.0.1 (`servers.serve`): decodes each ``POST
/v1/traces`` body as the protobuf ``ExportTraceServiceRequest`` (gzip or not) and keeps its
spans, flattened."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from .servers import Recorded, Reply, serve


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def _attrs(items: Any) -> dict[str, Any]:
    return {a.key: _value(a.value) for a in items}


@dataclass
class Received:
    url: str = ""
    spans: list[dict[str, Any]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, body: bytes) -> None:
        self.take_request(ExportTraceServiceRequest.FromString(body))

    def take_request(self, request: ExportTraceServiceRequest) -> None:
        for rs in request.resource_spans:
            resource = _attrs(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    with self.lock:
                        self.spans.append({
                            "name": s.name, "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
                            "parent_id": s.parent_span_id.hex() or None, "attributes": _attrs(s.attributes),
                            "events": [(e.name, _attrs(e.attributes)) for e in s.events],
                            "kind": s.kind,  # 1 INTERNAL, 3 CLIENT
                            "status": s.status.code, "status_message": s.status.message,
                            "start": s.start_time_unix_nano, "end": s.end_time_unix_nano,
                            "resource": resource})


@contextmanager
def otlp_receiver() -> Iterator[Received]:
    got = Received()

    def handle(req: Recorded) -> Reply:
        body = req.body
        if req.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        got.paths.append(req.path)
        got.take(body)
        return 200, {}, ExportTraceServiceResponse().SerializeToString()

    with serve(handle) as server:
        got.url = server.url
        yield got
