"""An experiment whose task-run records a test holds back (a slow Prefect server, played
by a `prefect_gate.Gate` in front of a real one).

Run as a script by test_results_first.py: ``held_records.py RESULTS_DIR [SECONDS_PER_ROW]``
against ``PREFECT_API_URL`` (the gate). It prints ``rows done`` once ``run_experiment``
is back and ``flow run <id>`` once the recorder process has made the flow run.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from patronus_tasks import Experiment, Row, evaluator, run_experiment

ROWS = 60


@evaluator
def short(row: Row, evaluated_model_output: str) -> bool:
    time.sleep(row.pause)  # slow rows, for a test that kills the process mid-run
    return len(evaluated_model_output) < 3


@evaluator
def digits(evaluated_model_output: str) -> bool:
    return evaluated_model_output.isdigit()


def run(results_dir: Path, pause: float = 0.0, **options: Any) -> Experiment:
    """The experiment, each row's first evaluator taking ``pause`` seconds."""
    data = [{"evaluated_model_output": str(i), "pause": pause} for i in range(ROWS)]
    return run_experiment("held", data=data,
                          evaluators=[short, digits], results_dir=results_dir,
                          experiment_name="held", print_summary=False, max_concurrency=4,
                          **options)


def flow_run_of(exp: Experiment, timeout: float = 60) -> str:
    """The experiment's flow run id, once the recorder process has made the flow run."""
    deadline = time.monotonic() + timeout
    while not (flow_run_id := exp.manifest.flow_run_id):
        if time.monotonic() > deadline:
            raise TimeoutError("the recorder process made no flow run")
        time.sleep(0.05)
    return flow_run_id


if __name__ == "__main__":
    exp = run(Path(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 0.0)
    print("rows done", flush=True)
    print("flow run", flow_run_of(exp), flush=True)
