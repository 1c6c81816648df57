"""A real OTLP/gRPC trace receiver on 127.0.0.1: OpenTelemetry's generated
``TraceService`` servicer on a grpcio server (both come with the ``otlp-grpc`` extra's
exporter), keeping each ``Export`` request's spans as `otlp_receiver.Received` does."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from .otlp_receiver import Received


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, got: Received) -> None:
        self.got = got

    def Export(self, request: ExportTraceServiceRequest, context: Any) -> ExportTraceServiceResponse:
        self.got.paths.append("TraceService/Export")
        self.got.take_request(request)
        return ExportTraceServiceResponse()


@contextmanager
def otlp_grpc_receiver() -> Iterator[Received]:
    """The receiver, listening; ``url`` is what OTEL_EXPORTER_OTLP_ENDPOINT takes
    (``http://``: plain text, as a local collector's 4317)."""
    got = Received()
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(got), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    got.url = f"http://127.0.0.1:{port}"
    try:
        yield got
    finally:
        server.stop(grace=None)
