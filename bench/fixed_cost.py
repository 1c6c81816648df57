"""The fixed cost of one experiment: 10 rows, the first experiment of a fresh process.

    python bench/fixed_cost.py MODE       # prints one JSON line

Times the `run_experiment` call alone (the imports of this script come before it, as
in any script), then, for ``prefect``, how long after its return until every call's task
run is visible through the API (``PREFECT_API_URL``), and until the flow run has its
final state.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from patronus_tasks import evaluator, run_experiment, task

ROWS = 10


@task
def upper(evaluated_model_input: str) -> str:
    return evaluated_model_input.upper()


@evaluator
def long_enough(evaluated_model_output: str) -> bool:
    return len(evaluated_model_output) > 2


async def _count(flow_run_id: str) -> int:
    from patronus_tasks.integrations.prefect.runs import count_task_runs

    return await count_task_runs(flow_run_id)


def main() -> None:
    mode = sys.argv[1]
    start = time.perf_counter()
    exp = run_experiment("fixed-cost", data=[{"evaluated_model_input": f"q{i}"} for i in range(ROWS)],
                         task=upper, evaluators=[long_enough], backend=mode,
                         results_dir="/tmp/bench-fixed", print_summary=False)
    returned = time.perf_counter()
    out = {"mode": mode, "call": returned - start}
    if mode == "prefect":
        while not (flow_run := exp.manifest.flow_run_id):
            time.sleep(0.01)
        while asyncio.run(_count(flow_run)) < 2 * ROWS:
            time.sleep(0.05)
        out["visible"] = time.perf_counter() - returned
        exp.wait_recorded(60)
        out["final_state"] = time.perf_counter() - returned
    print(json.dumps(out))


if __name__ == "__main__":
    main()
