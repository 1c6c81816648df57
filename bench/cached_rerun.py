"""A cached re-run: rows/s and model calls made, a first run against a second one.

    .venv/bin/python bench/cached_rerun.py [--rows 2000] [--concurrency 16] [--latency 0.05]

Each row: a `ChatTask` answering from the model stand-in (`latency_server.py`, answering
after L) and a local evaluator. The first run calls the model for every row and fills
the cache (``cache=True``: ``.cache`` in the results directory); the second, the same
experiment, should make no call. Both backends: ``local`` (no Prefect) and ``prefect``
(the default; on Prefect's built-in server unless ``PREFECT_API_URL`` is set; a tiny run
first starts it, so its start is not in the figures). Prints a line per run: rows/s to
results (until `run_experiment` returned), step calls made (the task's model call and the
evaluator's), calls the cache answered.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError("the model stand-in did not start")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--latency", type=float, default=0.05)
    args = p.parse_args()
    port = _free_port()
    model = subprocess.Popen([sys.executable, str(HERE / "latency_server.py"), str(port),
                              str(args.latency)])
    try:
        _wait_listening(port)
        _runs(args, f"http://127.0.0.1:{port}/v1")
    finally:
        model.terminate()
        model.wait(10)


def _runs(args: argparse.Namespace, url: str) -> None:
    from patronus_tasks import evaluator, run_experiment
    from patronus_tasks.openai import ChatTask, openai_endpoint

    @evaluator
    def nonempty(evaluated_model_output: str) -> bool:
        return bool(evaluated_model_output)

    data = [{"evaluated_model_input": f"question {i}"} for i in range(args.rows)]
    print(f"{args.rows} rows, C={args.concurrency}, L={args.latency * 1000:.0f} ms, "
          "1 model call per row")
    print(f"{'backend':<8} {'run':<6} {'rows/s':>8} {'calls made':>11} {'cached':>7}")
    for backend in ("local", "prefect"):
        with tempfile.TemporaryDirectory() as results:
            if backend == "prefect":  # start the built-in server before the clock
                run_experiment("warm-up", data=[{"evaluated_model_output": "x"}],
                               evaluators=[nonempty], results_dir=results,
                               print_summary=False, html_report=False)
            for label in ("first", "second"):
                chat = ChatTask("gpt-4o-mini", endpoint=openai_endpoint(
                    url, max_in_flight=args.concurrency * 2, max_attempts=1))
                start = time.perf_counter()
                exp = run_experiment("cached-rerun", data=data, task=chat, evaluators=[nonempty],
                                     experiment_name="rerun", backend=backend, cache=True,
                                     max_concurrency=args.concurrency, results_dir=results,
                                     print_summary=False, html_report=False)
                took = time.perf_counter() - start
                m = exp.manifest
                print(f"{backend:<8} {label:<6} {args.rows / took:8.0f} {m.calls:>11} "
                      f"{m.cached_calls:>7}", flush=True)
                exp.wait_recorded(300)


if __name__ == "__main__":
    main()
