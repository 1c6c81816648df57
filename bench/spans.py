"""What tracing costs the rows, in-process: run by hand, not by the tests.

    .venv/bin/python bench/spans.py [--rows 2000] [--spans 10]

Runs the same local experiment (no Prefect, no I/O: the cost is ours alone) twice: a task
opening ``--spans`` nested spans per row (an agent span, tool spans with arguments and
outputs), and the same task opening none; prints the extra wall time per span, and, apart,
a span's own cost in a tight loop inside a call's collector. The issue 36 goal: under
0.5 ms of the row's time per span.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from patronus_tasks import run_experiment, span, task
from patronus_tasks.trace import Collector, collecting


def _task(spans: int) -> object:
    @task(name="step")
    def step(evaluated_model_input: str) -> str:
        if not spans:
            return evaluated_model_input.upper()
        with span("agent", kind="agent", goal=evaluated_model_input) as top:
            for i in range(spans - 1):
                with span(f"tool{i}", kind="tool", arguments={"q": evaluated_model_input, "i": i}) as s:
                    s.set(output=[evaluated_model_input, i])
            top.set(output=evaluated_model_input.upper())
        return evaluated_model_input.upper()
    return step


def _run(rows: int, spans: int) -> float:
    data = [{"evaluated_model_input": f"question {i}"} for i in range(rows)]
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        run_experiment("bench-spans", data=data, task=_task(spans), backend="local",
                       results_dir=out, print_summary=False, html_report=False, max_concurrency=16)
        return time.perf_counter() - start


def _tight(n: int) -> float:
    collector = Collector()
    with collecting(collector):
        start = time.perf_counter()
        for i in range(n):
            with span("tool", kind="tool", arguments={"i": i}) as s:
                s.set(output=i)
        took = time.perf_counter() - start
    collector.harvest()
    return took / n


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--spans", type=int, default=10)
    args = p.parse_args()
    _run(50, args.spans)  # warm: imports, first files
    without = min(_run(args.rows, 0) for _ in range(3))
    with_spans = min(_run(args.rows, args.spans) for _ in range(3))
    per_span = (with_spans - without) / (args.rows * args.spans)
    print(f"{args.rows} rows, local backend, best of 3: {without:.2f} s without spans, "
          f"{with_spans:.2f} s with {args.spans} spans a row")
    print(f"row time per span: {per_span * 1e6:.1f} us (goal < 500 us); "
          f"a span alone (tight loop): {_tight(100_000) * 1e6:.1f} us")


if __name__ == "__main__":
    main()
