"""One benchmark run in its own process: a mode over N rows at concurrency C.

Prints one JSON line: seconds to results (until `run_experiment` returned), CPU seconds,
peak RSS, seconds until every call's task run was visible, flow run id, calls made.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import resource
import time
from typing import Any

from patronus_tasks import TaskResult, evaluator, run_experiment, span, task
from patronus_tasks.http import Endpoint
from patronus_tasks.openai import chat_completion


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["plain", "prefect", "local"])
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--url", required=True)
    p.add_argument("--taskless", action="store_true")
    # The task as an agent's step: N spans per row (an agent span, N-2 tool spans, the
    # model call's llm span); 0: a task opening none (the model call without its span).
    p.add_argument("--spans", type=int, default=None)
    p.add_argument("--results-dir", default="/tmp/bench-results")
    return p.parse_args()


def _endpoint(args: argparse.Namespace) -> Endpoint:
    return Endpoint(args.url, max_in_flight=args.concurrency * 2, timeout=60, max_attempts=1)


def _rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    return [{"evaluated_model_input": f"question {i}", "evaluated_model_output": f"answer {i}"}
            for i in range(args.rows)]


async def _plain(args: argparse.Namespace) -> int:
    """The limit: the same calls in a bare asyncio loop with a semaphore."""
    endpoint, sem = _endpoint(args), asyncio.Semaphore(args.concurrency)

    async def one(row: dict[str, Any]) -> None:
        async with sem:
            if not args.taskless:
                messages = [{"role": "user", "content": row["evaluated_model_input"]}]
                out = await chat_completion(endpoint, messages, model="m")
                _ = bool(out.evaluated_model_output)
                await endpoint.request("POST", "/chat/completions", json={
                    "model": "judge", "messages": [{"role": "user", "content": out.evaluated_model_output}]})
            else:
                _ = len(row["evaluated_model_output"]) > 3, row["evaluated_model_output"].startswith("a")

    await asyncio.gather(*(one(r) for r in _rows(args)))
    await endpoint.aclose()
    return 0


def _experiment(args: argparse.Namespace) -> tuple[Any, int, float]:
    endpoint = _endpoint(args)

    @task
    async def call_model(evaluated_model_input: str) -> TaskResult:
        messages = [{"role": "user", "content": evaluated_model_input}]
        if args.spans == 0:  # the same call, no span
            body, _ = await endpoint.request("POST", "/chat/completions",
                                             json={"model": "m", "messages": messages})
            return TaskResult(evaluated_model_output=body["choices"][0]["message"]["content"])
        if not args.spans:
            return await chat_completion(endpoint, messages, model="m")
        with span("agent", kind="agent"):
            for i in range(args.spans - 2):
                with span(f"tool{i}", kind="tool", arguments={"i": i}) as s:
                    s.set(output=i)
            return await chat_completion(endpoint, messages, model="m")

    @evaluator
    def nonempty(evaluated_model_output: str) -> bool:
        return bool(evaluated_model_output)

    @evaluator
    async def judge(evaluated_model_output: str) -> bool:
        body, _ = await endpoint.request("POST", "/chat/completions", json={
            "model": "judge", "messages": [{"role": "user", "content": evaluated_model_output}]})
        return bool(body["choices"][0]["message"]["content"])

    @evaluator
    def long_enough(evaluated_model_output: str) -> bool:
        return len(evaluated_model_output) > 3

    evaluators = [nonempty, long_enough] if args.taskless else [nonempty, judge]
    exp = run_experiment("bench", data=_rows(args), task=None if args.taskless else call_model,
                         evaluators=evaluators, max_concurrency=args.concurrency,
                         backend=args.mode, results_dir=args.results_dir,
                         print_summary=False)
    returned = time.time()  # results first: the records may still be on their way
    calls = args.rows * (len(evaluators) + (0 if args.taskless else 1 + (1 if args.spans is None
                                                                       else args.spans)))
    return exp, calls, returned


def _flow_run_of(exp: Any) -> str | None:
    """The experiment's flow run, once the recorder process has made it."""
    while exp.manifest.flow_run_id is None and not exp.wait_recorded(0.05):
        pass
    return exp.manifest.flow_run_id


def _pin_children(cpus: set[int]) -> None:
    """`bench.py --recorder-apart`: move the recorder process (and every thread of it) to
    ``cpus`` as soon as it shows, as if it had a core of its own beside the rows'."""
    import threading

    import psutil

    def pin() -> None:
        while True:
            for child in psutil.Process().children(recursive=True):
                try:
                    for thread in child.threads():
                        if os.sched_getaffinity(thread.id) != cpus:
                            os.sched_setaffinity(thread.id, cpus)
                except (psutil.NoSuchProcess, ProcessLookupError):
                    pass
            time.sleep(0.2)

    threading.Thread(target=pin, daemon=True).start()


def _children_cpu() -> float:
    """CPU seconds of this process's children so far (the recorder process)."""
    import psutil

    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


async def _until_visible(flow_run_id: str, calls: int, stall: float = 120) -> int:
    """Wait until every call's task run is visible; return how many never were (none
    appeared for ``stall`` seconds)."""
    from patronus_tasks.prefect.runs.flow import count_task_runs

    seen, progress_at = 0, time.monotonic()
    while seen < calls and time.monotonic() - progress_at < stall:
        asked = time.monotonic()
        now = await count_task_runs(flow_run_id)
        took = time.monotonic() - asked
        progress_at = time.monotonic() if now > seen else progress_at
        seen = now
        # Counting grows with the flow run: asked back to back, it slows the recording.
        await asyncio.sleep(max(0.5, 10 * took) if seen < calls else 0)
    return calls - seen


async def _rows_visible_at(flow_run_id: str, name: str) -> float | None:
    """When the last of the rows' own task runs (``name``'s) was recorded: the server's
    ``created`` of each, read once every record is in (polling during the run would take
    the server's CPU from the rows being measured)."""
    from prefect.client.orchestration import get_client

    created: list[float] = []
    async with get_client() as client:
        while True:
            response = await client._client.post("/task_runs/filter", json={
                "flow_runs": {"id": {"any_": [flow_run_id]}},
                "task_runs": {"name": {"like_": f"{name}-"}}, "limit": 200,
                "offset": len(created)})
            response.raise_for_status()
            if not response.json():
                return max(created, default=None)
            created += [dt.datetime.fromisoformat(r["created"]).timestamp()
                        for r in response.json()]


def main() -> None:
    args = _args()
    if os.environ.get("BENCH_RECORDER_CPUS"):
        _pin_children({int(c) for c in os.environ["BENCH_RECORDER_CPUS"].split(",")})
    cpu0, t0 = time.process_time(), time.time()
    flow_run_id = None
    if args.mode == "plain":
        asyncio.run(_plain(args))
        calls, rows_done = 0, time.time()
    else:
        exp, calls, rows_done = _experiment(args)
        flow_run_id = _flow_run_of(exp) if args.mode == "prefect" else None
    cpu = time.process_time() - cpu0  # the rows' process, until the results
    missing = 0
    if flow_run_id:
        # Counted through the API while the recorder process catches up (this process
        # imports Prefect for it: after the rows, not counted).
        missing = asyncio.run(_until_visible(flow_run_id, calls))
        exp.wait_recorded(120)  # its final state: the recorder process's work is all done
    cpu += _children_cpu()  # the recorder process's CPU
    visible = time.time() - (120 if missing else 0)
    rows_at = None
    if flow_run_id and not args.taskless:
        rows_at = asyncio.run(_rows_visible_at(flow_run_id, "call_model"))
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"mode": args.mode, "started": t0, "wall": rows_done - t0, "cpu": cpu,
                      "rss_mb": rss_mb,
                      "visible_after": visible - rows_done if flow_run_id else None,
                      "rows_visible_after": None if rows_at is None else rows_at - rows_done,
                      "flow_run_id": flow_run_id, "calls": calls, "missing": missing}))


if __name__ == "__main__":
    main()
