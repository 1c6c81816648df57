"""A 2,000-row agent run on Prefect: how long until every span is a visible task run.

    .venv/bin/python bench/agent_visible.py [--rows 2000] [--latency 0.05] [--server builtin]

Starts a Prefect server (servers.py), then, in its own process, an experiment of an
`AgentTask` (a model stand-in answering after ``--latency`` seconds, in-process, with one
tool call then an answer: 4 spans a row: the agent, two model calls, the tool) and two
evaluators; prints the run's wall time, its span count, and the seconds from the
experiment returning until every task run (calls and spans) was visible through the API.
The issue 36 goal: within 60 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def child(rows: int, latency: float, concurrency: int) -> None:
    import httpx

    from patronus_tasks import run_experiment
    from patronus_tasks.agents import AgentTask
    from patronus_tasks.agents.local import answer
    from patronus_tasks.evaluators import no_loops, tool_calls_match
    from patronus_tasks.http import Endpoint
    from patronus_tasks.prefect.runs.flow import count_task_runs

    def policy(messages: list[dict[str, Any]], tools: list[str]) -> Any:
        done = any(m["role"] == "tool" for m in messages)
        return "It is sunny." if done else [("weather", {"city": "Paris"})]

    async def handle(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(latency)
        return httpx.Response(200, json=answer(json.loads(request.content), policy, "m"))

    def weather(city: str) -> str:
        """The weather in a city."""
        return "sunny"

    endpoint = Endpoint("http://model/v1", transport=httpx.MockTransport(handle),
                        max_in_flight=concurrency * 2)
    agent = AgentTask([weather], model="m", endpoint=endpoint)
    data = [{"evaluated_model_input": f"weather {i}",
             "expected_tool_calls": [{"name": "weather", "arguments": {"city": "Paris"}}]}
            for i in range(rows)]
    start = time.time()
    ex = run_experiment("bench-agent", data=data, task=agent,
                        evaluators=[tool_calls_match(), no_loops()], max_concurrency=concurrency,
                        results_dir=tempfile.mkdtemp(prefix="bench-agent-"), print_summary=False,
                        html_report=False)
    returned = time.time()
    spans = len(ex.spans())
    expected = rows * 3 + spans
    while ex.manifest.flow_run_id is None and not ex.wait_recorded(0.05):
        pass
    flow_run_id = ex.manifest.flow_run_id
    seen = 0
    while seen < expected and time.time() - returned < 600:
        seen = asyncio.run(count_task_runs(flow_run_id))
        time.sleep(0.5)
    print(json.dumps({"rows": rows, "wall": returned - start, "spans": spans,
                      "task_runs": expected, "seen": seen,
                      "visible_after": time.time() - returned}))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--latency", type=float, default=0.05)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--server", default="builtin")
    p.add_argument("--child", action="store_true")
    args = p.parse_args()
    if args.child:
        child(args.rows, args.latency, args.concurrency)
        return
    sys.path.insert(0, str(HERE))
    from servers import start

    server = start(args.server, Path(tempfile.mkdtemp(prefix="bench-agent-home-")))
    try:
        env = {**os.environ, "PREFECT_API_URL": server.api_url,
               "PREFECT_LOGGING_LEVEL": "WARNING", "PREFECT_LOGGING_TO_API_ENABLED": "false"}
        out = subprocess.run([sys.executable, __file__, "--child", "--rows", str(args.rows),
                              "--latency", str(args.latency),
                              "--concurrency", str(args.concurrency)],
                             env=env, capture_output=True, text=True, timeout=1800)
        if out.returncode:
            raise SystemExit(out.stderr[-3000:])
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{r['rows']} agent rows on {args.server}, C={args.concurrency}, "
              f"model {args.latency * 1000:.0f} ms: "
              f"ran {r['wall']:.1f} s; {r['spans']} spans, {r['task_runs']} task runs, "
              f"{r['seen']} visible {r['visible_after']:.1f} s after it returned (goal 60 s)")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
