"""A sweep against one experiment of as many rows (issue 51): 8 variants x 250 rows at
C=64 against 2,000 rows at C=64, each row a model call answered after L = 0.5 s and one
local evaluator; a plain asyncio loop making the same 2,000 calls alongside.

    .venv/bin/python bench/sweep.py [--repeat 3] [--latency 0.5] [--variants 8] [--rows 250]

A Prefect server (``prefect server start`` on SQLite with the built-in server's settings,
niced, a fresh home: `servers.py`) and the model stand-in (`latency_server.py`) run
apart; each mode runs in a process of its own. Per run: seconds until the call returned
(`sweep` / `run_experiment`: its results written), its ratio to the experiment's of the
same round (the target: the sweep within 1.1x), and seconds from the return until every
task run of it (each variant's) was visible through the Prefect API (the target: 60 s).
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
sys.path.insert(0, str(HERE))
from servers import port, start  # noqa: E402
from servers import wait as wait_up  # noqa: E402

MODES = ("plain", "experiment", "sweep")


def _task(url: str) -> Any:
    from patronus_tasks import task
    from patronus_tasks.openai import as_messages, chat_completion, openai_endpoint

    endpoint = openai_endpoint(base_url=url, api_key="bench", max_in_flight=1024)

    @task
    async def answer(evaluated_model_input: str, variant: Any) -> Any:
        return await chat_completion(endpoint, as_messages(evaluated_model_input),
                                     model=variant.get("model", "m0"))

    return answer, endpoint


def _nonempty() -> Any:
    from patronus_tasks import evaluator

    @evaluator
    def nonempty(evaluated_model_output: str) -> bool:
        return bool(evaluated_model_output)

    return nonempty


async def _plain(url: str, rows: int, concurrency: int) -> None:
    from patronus_tasks.openai import as_messages, chat_completion

    _, endpoint = _task(url)
    todo = iter(range(rows))

    async def worker() -> None:
        for i in todo:
            await chat_completion(endpoint, as_messages(f"question {i}"), model="m0")

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def _visible(flow_runs: list[str], expected: int, timeout: float = 600) -> float | None:
    """Seconds until the flow runs hold ``expected`` task runs in a final state."""
    from patronus_tasks.prefect.runs.flow import count_task_runs

    start = time.monotonic()
    if "None" in flow_runs:  # a flow run never made: its task runs are never visible
        return None
    while time.monotonic() - start < timeout:
        seen = sum(asyncio.run(count_task_runs(f)) for f in flow_runs)
        if seen >= expected:
            return time.monotonic() - start
        time.sleep(0.5)
    return None


def worker(mode: str, url: str, variants: int, rows: int, concurrency: int) -> dict[str, Any]:
    """One mode's run, in this process: seconds to return, then to every task run visible."""
    from patronus_tasks import run_experiment, sweep

    total = variants * rows
    data = [{"sid": f"s{i}", "evaluated_model_input": f"question {i}"} for i in range(rows)]
    results = tempfile.mkdtemp(prefix="bench-sweep-")
    started = time.monotonic()
    if mode == "plain":
        asyncio.run(_plain(url, total, concurrency))
        return {"mode": mode, "wall": time.monotonic() - started, "visible_after": None}
    answer, _ = _task(url)
    options: dict[str, Any] = {"task": answer, "evaluators": [_nonempty()], "results_dir": results,
                               "max_concurrency": concurrency, "print_summary": False,
                               "html_report": False}
    if mode == "experiment":
        many = [{"sid": f"s{i}", "evaluated_model_input": f"question {i}"} for i in range(total)]
        e = run_experiment("bench-sweep", data=many, experiment_name="one", **options)
        wall = time.monotonic() - started
        e.wait_recorded(0)
        flow_runs = [_flow_run(e)]
    else:
        s = sweep("bench-sweep", data=data, grid={"model": [f"m{i}" for i in range(variants)]},
                  sweep_name="eight", **options)
        wall = time.monotonic() - started
        flow_runs = [_flow_run(e) for e in s.experiments.values()]
    # Per row: the task's call, its model span (nested), the evaluator's call.
    visible = _visible(flow_runs, 3 * total)
    return {"mode": mode, "wall": wall, "visible_after": visible}


def _flow_run(e: Any, timeout: float = 600) -> str:
    deadline = time.monotonic() + timeout
    while e.manifest.flow_run_id is None and time.monotonic() < deadline:
        time.sleep(0.1)
    return str(e.manifest.flow_run_id)


def _run_mode(mode: str, args: argparse.Namespace, api_url: str, model_url: str) -> dict[str, Any]:
    env = {**os.environ, "PREFECT_API_URL": api_url, "PREFECT_LOGGING_LEVEL": "WARNING",
           "PREFECT_LOGGING_TO_API_ENABLED": "false"}
    out = subprocess.run([sys.executable, __file__, "--worker", mode, "--url", model_url,
                          "--variants", str(args.variants), "--rows", str(args.rows),
                          "--concurrency", str(args.concurrency)],
                         env=env, capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise SystemExit(f"{mode} failed: {out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--latency", type=float, default=0.5)
    p.add_argument("--variants", type=int, default=8)
    p.add_argument("--rows", type=int, default=250)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--worker", choices=MODES)
    p.add_argument("--url")
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.url, args.variants, args.rows, args.concurrency)))
        return
    model_port = port()
    model = subprocess.Popen([sys.executable, str(HERE / "latency_server.py"), str(model_port),
                              str(args.latency)])
    server = start("builtin", Path(tempfile.mkdtemp(prefix="bench-sweep-home-")))
    try:
        wait_up(f"http://127.0.0.1:{model_port}/v1/chat/completions", model)
        _rounds(args, server.api_url, f"http://127.0.0.1:{model_port}/v1")
    finally:
        server.stop()
        model.terminate()
        model.wait(10)


def _rounds(args: argparse.Namespace, api_url: str, model_url: str) -> None:
    total = args.variants * args.rows
    print(f"{args.variants} variants x {args.rows} rows against one experiment of {total} rows; "
          f"C={args.concurrency}, L={args.latency * 1000:.0f} ms, a model call and a local "
          "evaluator per row")
    print(f"{'round':<6} {'mode':<11} {'returned s':>10} {'x experiment':>12} {'visible s':>10}")
    for i in range(args.repeat):
        order = MODES if i % 2 == 0 else ("plain", "sweep", "experiment")
        found = {mode: _run_mode(mode, args, api_url, model_url) for mode in order}
        for mode in MODES:
            r = found[mode]
            ratio = r["wall"] / found["experiment"]["wall"]
            seen = "-" if r["visible_after"] is None and mode == "plain" else (
                "never" if r["visible_after"] is None else f"{r['visible_after']:.1f}")
            print(f"{i + 1:<6} {mode:<11} {r['wall']:>10.2f} {ratio:>12.2f} {seen:>10}")


if __name__ == "__main__":
    main()
