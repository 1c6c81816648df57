"""The `patronus` mode of the benchmark: the real Patronus SDK's experiment runner over the same rows.

Runs in its own venv, which has the `patronus` package (never install it into the project's .venv):

    python3 -m venv /tmp/patronus-venv && /tmp/patronus-venv/bin/pip install patronus pandas httpx
    /tmp/patronus-venv/bin/python bench/patronus_sdk_workload.py --rows N --concurrency C \\
        --url http://127.0.0.1:LATPORT/v1 --api-url http://127.0.0.1:STANDINPORT

--url is the latency server (bench/latency_server.py); --api-url is bench/patronus_standin.py, which
stands in for the Patronus API and the OTLP collector: the SDK is pointed at it for every URL (API,
OTLP over http/protobuf, UI) with a dummy API key, so nothing leaves the machine.

The workload is bench/workload.py's experiment: a task calling model "m" with the row's input, a
local evaluator (`bool(output)`) and a judge evaluator calling model "judge" with the output, at the
SDK's `max_concurrency` = C. Prints one JSON line last on stdout with workload.py's keys; everything
the SDK prints itself (request URLs, progress bar, summary) goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import resource
import sys
import time
from typing import Any

import httpx
from patronus import evaluator
from patronus.datasets import Row
from patronus.experiments import Experiment, FuncEvaluatorAdapter, TaskResult

#: What httpx, tqdm and the OTLP/HTTP exporters import on first use: imported before the timed span.
LAZY_IMPORTS = ("anyio._backends._asyncio", "charset_normalizer", "h11", "httpcore",
                "multiprocessing.synchronize", "netrc", "requests")


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--url", required=True, help="OpenAI-compatible base URL, e.g. http://127.0.0.1:P/v1")
    p.add_argument("--api-url", required=True, help="bench/patronus_standin.py, e.g. http://127.0.0.1:P")
    # As workload.py's: N spans a row (an agent span, N-2 @traced tool calls, the model
    # call's span), exported by the SDK to the stand-in's OTLP endpoint; 0: none.
    p.add_argument("--spans", type=int, default=0)
    return p.parse_args()


def _sdk_target(api_url: str) -> dict[str, Any]:
    """Every URL the SDK reads pointed at the stand-in (as arguments and in its PATRONUS_* env)."""
    target = {"api_key": "bench-dummy-key", "api_url": api_url, "otel_endpoint": api_url,
              "otel_exporter_otlp_protocol": "http/protobuf", "ui_url": api_url}
    for key, value in target.items():
        os.environ[f"PATRONUS_{key.upper()}"] = value
    return target


class _TimedExperiment(Experiment):
    """Records when the last row is done, before run() flushes the exporters."""

    rows_done: tuple[float, float] = (0.0, 0.0)

    async def _run(self) -> None:
        await super()._run()
        self.rows_done = (time.time(), time.process_time())


class _Model:
    """The model calls of the workload, counted, over pools of POOL_SHARD connections.

    As in patronus_tasks.http: httpcore scans every connection of a pool per request, so one
    pool of 2*C connections costs more CPU than the SDK itself (C=256: 43 rows/s instead of ~180).
    """

    POOL_SHARD = 8

    def __init__(self, url: str, concurrency: int) -> None:
        limits = httpx.Limits(max_connections=self.POOL_SHARD, max_keepalive_connections=self.POOL_SHARD,
                              keepalive_expiry=4.0)
        shards, tls = -(-2 * concurrency // self.POOL_SHARD), httpx.create_ssl_context()  # one CA load
        self.clients = [httpx.AsyncClient(base_url=url, limits=limits, timeout=60, verify=tls)
                        for _ in range(shards)]
        self.calls = 0

    async def chat(self, model: str, content: str) -> str:
        self.calls += 1
        client = self.clients[self.calls % len(self.clients)]
        resp = await client.post("/chat/completions", json={
            "model": model, "messages": [{"role": "user", "content": content}]})
        resp.raise_for_status()
        return str(resp.json()["choices"][0]["message"]["content"])

    async def aclose(self) -> None:
        await asyncio.gather(*(c.aclose() for c in self.clients))


def _workload(model: _Model, spans: int) -> tuple[Any, list[FuncEvaluatorAdapter]]:
    from patronus import traced
    from patronus.tracing import start_span

    @traced(span_name="tool")
    def tool(query: str, i: int) -> list[Any]:
        return [query, i]

    async def call_model(row: Row, **kwargs: Any) -> str:
        if not spans:
            return await model.chat("m", row.task_input)
        with start_span("agent"):
            for i in range(spans - 2):
                tool(row.task_input, i)
            with start_span("chat m"):
                return await model.chat("m", row.task_input)

    @evaluator()
    def nonempty(row: Row, task_result: TaskResult, **kwargs: Any) -> bool:
        return bool(task_result.output)

    @evaluator()
    async def judge(row: Row, task_result: TaskResult, **kwargs: Any) -> bool:
        return bool(await model.chat("judge", task_result.output))

    return call_model, [FuncEvaluatorAdapter(nonempty), FuncEvaluatorAdapter(judge)]


async def _experiment(args: argparse.Namespace, t0: float, cpu0: float) -> dict[str, Any]:
    model = _Model(args.url, args.concurrency)
    task, evaluators = _workload(model, args.spans)
    rows = [{"task_input": f"question {i}", "task_output": f"answer {i}"} for i in range(args.rows)]
    ex = await _TimedExperiment.create(rows, task=task, evaluators=evaluators, project_name="bench",
                                       experiment_name="bench", max_concurrency=args.concurrency,
                                       **_sdk_target(args.api_url))
    await ex.run()
    await model.aclose()
    evaluated = len(ex.to_dataframe())
    if evaluated != 2 * args.rows:
        raise SystemExit(f"only {evaluated} of {2 * args.rows} evaluations succeeded")
    done, cpu = ex.rows_done
    return {"mode": "patronus", "wall": done - t0, "cpu": cpu - cpu0, "calls": model.calls}


def main() -> None:
    args = _args()
    for name in LAZY_IMPORTS:
        importlib.import_module(name)
    out, sys.stdout = sys.stdout, sys.stderr  # the SDK prints each request URL and a summary
    cpu0, t0 = time.process_time(), time.time()
    result = asyncio.run(_experiment(args, t0, cpu0))
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result.update(rss_mb=rss_mb, visible_after=None, flow_run_id=None)
    print(json.dumps({k: result[k] for k in ("mode", "wall", "cpu", "rss_mb", "visible_after",
                                             "flow_run_id", "calls")}), file=out, flush=True)


if __name__ == "__main__":
    main()
