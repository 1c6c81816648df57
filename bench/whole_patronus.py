"""The `patronus` row of `whole_script.py`: the same 10 rows run by the Patronus SDK's
`run_experiment` (0.1.x), reporting to the loopback stand-in of its API and OTLP collector
(`patronus_standin.py`), in the SDK's own venv (see `patronus_sdk_workload.py`):

    /tmp/patronus-venv/bin/python bench/whole_patronus.py STANDIN_URL
    # prints {"returned": t, "recorded": t}: the SDK's run returns once its exporters flushed

Everything the SDK prints goes to stderr.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

ROWS = 10


def main() -> None:
    url = sys.argv[1]
    for key, value in {"api_key": "bench-dummy-key", "api_url": url, "otel_endpoint": url,
                       "otel_exporter_otlp_protocol": "http/protobuf", "ui_url": url}.items():
        os.environ[f"PATRONUS_{key.upper()}"] = value
    from patronus import evaluator
    from patronus.experiments import FuncEvaluatorAdapter, TaskResult, run_experiment

    def upper(row: Any, **kwargs: Any) -> str:
        return str(row.task_input).upper()

    @evaluator()
    def long_enough(row: Any, task_result: TaskResult, **kwargs: Any) -> bool:
        return len(task_result.output or "") > 2

    out, sys.stdout = sys.stdout, sys.stderr  # the SDK prints its requests and a summary
    rows = [{"task_input": f"q{i}"} for i in range(ROWS)]
    run_experiment(dataset=rows, task=upper, evaluators=[FuncEvaluatorAdapter(long_enough)],
                   project_name="whole", experiment_name="whole")
    returned = time.time()
    print(json.dumps({"returned": returned, "recorded": returned}), file=out, flush=True)


if __name__ == "__main__":
    main()
