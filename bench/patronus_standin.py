"""A stand-in for the Patronus API and OTLP collector on 127.0.0.1, for benchmarking the real SDK offline.

    .venv/bin/python bench/patronus_standin.py PORT

Serves every endpoint that `patronus.experiments.run_experiment` (SDK 0.1.26) calls, with the
smallest bodies the SDK's pydantic models accept:

    POST /v1/projects            -> a Project (get-or-create of the experiment's project)
    POST /v1/experiments         -> {"experiment": ...}
    POST /v1/evaluations/batch   -> {"evaluations": []} (the SDK's background evaluation exporter)
    POST /v1/traces, /v1/logs    -> empty OTLP/HTTP protobuf response (spans and evaluation logs; the
                                    SDK has no switch to turn them off: point it here with
                                    otel_exporter_otlp_protocol="http/protobuf")

Anything else is logged to stderr as "unknown METHOD PATH" and answered 200 {}. GET /_counts returns
requests per "METHOD PATH" plus "evaluations": the number of evaluation records received. bench.py
starts it next to the latency server and passes its URL to bench/patronus_sdk_workload.py as --api-url.
"""

from __future__ import annotations

import sys
from collections import Counter

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

COUNTS: Counter[str] = Counter()


def _count(request: Request) -> None:
    COUNTS[f"{request.method} {request.url.path}"] += 1


async def projects(request: Request) -> JSONResponse:
    _count(request)
    body = await request.json()
    return JSONResponse({"id": "p-1", "name": body["name"]})


async def experiments(request: Request) -> JSONResponse:
    _count(request)
    body = await request.json()
    return JSONResponse({"experiment": {"project_id": body["project_id"], "id": "e-1", "name": body["name"],
                                        "tags": body.get("tags"), "metadata": body.get("metadata")}})


async def evaluations(request: Request) -> JSONResponse:
    _count(request)
    COUNTS["evaluations"] += len((await request.json())["evaluations"])
    return JSONResponse({"evaluations": []})


async def otlp(request: Request) -> Response:
    """OTLP/HTTP export: an empty protobuf body is a valid Export*ServiceResponse (full success)."""
    _count(request)
    await request.body()
    return Response(b"", media_type="application/x-protobuf")


async def counts(request: Request) -> JSONResponse:
    return JSONResponse(dict(COUNTS))


async def unknown(request: Request) -> JSONResponse:
    _count(request)
    print(f"unknown {request.method} {request.url.path}", file=sys.stderr, flush=True)
    return JSONResponse({})


ANY = ["GET", "POST", "PUT", "PATCH", "DELETE"]
app = Starlette(routes=[
    Route("/v1/projects", projects, methods=["POST"]),
    Route("/v1/experiments", experiments, methods=["POST"]),
    Route("/v1/evaluations/batch", evaluations, methods=["POST"]),
    Route("/v1/traces", otlp, methods=["POST"]),
    Route("/v1/logs", otlp, methods=["POST"]),
    Route("/_counts", counts, methods=["GET"]),
    Route("/{path:path}", unknown, methods=ANY),
])

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="error", backlog=4096)
