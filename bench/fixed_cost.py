"""The fixed cost of one experiment: 10 rows, the first experiment of a fresh process.

    python bench/fixed_cost.py MODE                # prints one JSON line
    python bench/fixed_cost.py MODE --whole NAME   # a user's script (whole_script.py)

Times the `run_experiment` call alone (the imports of this script come before it, as
in any script), then, for ``prefect``, how long after its return until every call's task
run is visible through the API (``PREFECT_API_URL``), and until the flow run has its
final state. It asks the API over plain HTTP (httpx): importing Prefect's client here
would put that import's ~1.5 s in the figures, and for the recorder process's path it
is not in the experiment's process at all.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Literal

import httpx

from patronus_tasks import evaluator, run_experiment, task

ROWS = 10


@task
def upper(evaluated_model_input: str) -> str:
    return evaluated_model_input.upper()


@evaluator
def long_enough(evaluated_model_output: str) -> bool:
    return len(evaluated_model_output) > 2


def _until(check: Callable[[], object], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("the server did not show the experiment in time")
        time.sleep(0.02)


def _api() -> httpx.Client:
    """The API over plain HTTP; for `server up`'s servers with the auth string they ask for
    (PREFECT_API_AUTH_STRING) and the CSRF token every POST needs (made before the clock
    starts)."""
    import base64
    import uuid

    api = httpx.Client(base_url=os.environ["PREFECT_API_URL"], timeout=30)
    if secret := os.environ.get("PREFECT_API_AUTH_STRING"):
        api.headers["Authorization"] = f"Basic {base64.b64encode(secret.encode()).decode()}"
        client = str(uuid.uuid4())
        token = api.get("/csrf-token", params={"client": client}).json()["token"]
        api.headers.update({"Prefect-Csrf-Token": token, "Prefect-Csrf-Client": client})
    return api


def whole(mode: Literal["local", "prefect"], name: str) -> None:
    """As a user's script: the experiment, then `wait_recorded`; prints when each
    returned (``time.time()``: the measuring process compares them with its own)."""
    exp = run_experiment(name, data=[{"evaluated_model_input": f"q{i}"} for i in range(ROWS)],
                         task=upper, evaluators=[long_enough], backend=mode,
                         results_dir="/tmp/bench-whole", print_summary=False)
    returned = time.time()
    exp.wait_recorded()
    print(json.dumps({"returned": returned, "recorded": time.time()}), flush=True)


def main() -> None:
    mode: Literal["local", "prefect"] = "prefect" if sys.argv[1] == "prefect" else "local"
    if sys.argv[2:3] == ["--whole"]:
        whole(mode, sys.argv[3])
        return
    api = _api() if mode == "prefect" else None
    start = time.perf_counter()
    exp = run_experiment("fixed-cost", data=[{"evaluated_model_input": f"q{i}"} for i in range(ROWS)],
                         task=upper, evaluators=[long_enough], backend=mode,
                         results_dir="/tmp/bench-fixed", print_summary=False)
    returned = time.perf_counter()
    out = {"mode": mode, "call": returned - start}
    if api is not None:
        _until(lambda: exp.manifest.flow_run_id)
        flow_run = exp.manifest.flow_run_id or ""
        count = {"flow_runs": {"id": {"any_": [flow_run]}}}
        _until(lambda: api.post("/task_runs/count", json=count).json() >= 2 * ROWS)
        out["visible"] = time.perf_counter() - returned
        _until(lambda: api.get(f"/flow_runs/{flow_run}").json()["state"]["type"] == "COMPLETED")
        out["final_state"] = time.perf_counter() - returned
    print(json.dumps(out))


if __name__ == "__main__":
    main()
