"""One experiment against the Prefect API in PREFECT_API_URL, in a process of its own
(tests/test_stack.py runs two at once): ROWS rows of a trivial task and two evaluators,
so that the server has three task runs per row to record while the rows go fast.

Touches RESULTS_DIR/NAME.returned once `run_experiment` has returned, then prints one
JSON line: flow run id, results folder, seconds until it returned and until Prefect had
every task run, and whether it had.

    python tests/stack_experiment.py RESULTS_DIR NAME ROWS [TIMEOUT]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from patronus_tasks import evaluator, run_experiment, task


@task
def echo(evaluated_model_input: str) -> str:
    return evaluated_model_input.upper()


@evaluator
def nonempty(evaluated_model_output: str) -> bool:
    return bool(evaluated_model_output)


@evaluator
def short(evaluated_model_output: str) -> bool:
    return len(evaluated_model_output) < 10


def main(results_dir: str, name: str, rows: int, timeout: float) -> None:
    start = time.monotonic()
    exp = run_experiment("stack", data=[{"evaluated_model_input": f"q{i}"} for i in range(rows)],
                         task=echo, evaluators=[nonempty, short], experiment_name=name,
                         results_dir=results_dir, max_concurrency=16, print_summary=False)
    returned = time.monotonic() - start
    (Path(results_dir) / f"{name}.returned").touch()
    recorded = exp.wait_recorded(timeout)
    print(json.dumps({"flow_run_id": exp.manifest["flow_run_id"], "path": str(exp.path),
                      "returned_s": returned, "recorded_s": time.monotonic() - start,
                      "recorded": recorded}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]),
         float(sys.argv[4]) if len(sys.argv) > 4 else 240.0)
