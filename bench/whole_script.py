"""A 10-row script's whole process, on Prefect against the same on `local` (issue 49).

    PREFECT_API_URL=http://127.0.0.1:4200/api python bench/whole_script.py [--rounds 5]
    python bench/bench.py --scenario whole [--server up] [--repeat 5]

Each round runs `fixed_cost.py MODE --whole` (the experiment, then `wait_recorded`, then
exit, as a script would) with ``local`` and with ``prefect`` against a server already
running, timing each process from its start to its exit. Meanwhile this process (not the
measured one) asks the server every 20 ms how many of the run's 20 task runs are final,
then for its flow run's final state: so the figures tell apart what the server did
(``final``: every task run final; ``state``: the flow run's final state) from when
the script heard of it (``recorded``: `wait_recorded` returned) and when it ended
(``exit``), each in seconds after `run_experiment` returned.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
FINAL = ["COMPLETED", "FAILED", "CANCELLED", "CRASHED"]
CALLS = 20  # 10 rows: a task and an evaluator each


class Watch(threading.Thread):
    """When the server holds every task run of project ``name`` final, then its flow
    run's final state (``time.time()``)."""

    def __init__(self, api_url: str, name: str) -> None:
        super().__init__(daemon=True)
        self.api, self.tags = httpx.Client(base_url=api_url, timeout=30), [f"project:{name}"]
        self.final: float | None = None
        self.state: float | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        runs = {"task_runs": {"tags": {"all_": self.tags}, "state": {"type": {"any_": FINAL}}}}
        flows = {"flow_runs": {"tags": {"all_": self.tags}, "state": {"type": {"any_": FINAL}}}}
        while not self.stop.is_set() and self.state is None:
            try:
                if self.final is None and self._count("/task_runs/count", runs) >= CALLS:
                    self.final = time.time()
                if self.final is not None and self._count("/flow_runs/count", flows):
                    self.state = time.time()
            except httpx.HTTPError:  # a loaded server: ask again
                pass
            time.sleep(0.02)

    def _count(self, path: str, body: dict[str, Any]) -> int:
        return int(self.api.post(path, json=body).json())


def one(mode: str, api_url: str) -> dict[str, float]:
    name = f"whole-{uuid.uuid4().hex[:8]}"  # a project of its own: its tag finds its runs
    env = {**os.environ, "PREFECT_API_URL": api_url, "PREFECT_LOGGING_LEVEL": "WARNING"}
    watch = Watch(api_url, name)
    if mode == "prefect":
        watch.start()
    began = time.time()
    out = subprocess.run([sys.executable, str(HERE / "fixed_cost.py"), mode, "--whole", name],
                         env=env, capture_output=True, text=True, check=True, timeout=300)
    ended = time.time()
    said = json.loads(out.stdout.strip().splitlines()[-1])
    if watch.is_alive():
        watch.join(30)
    watch.stop.set()
    found = {"whole": ended - began, "exit": ended - said["returned"],
             "recorded": said["recorded"] - said["returned"]}
    for key in ("final", "state"):
        at = getattr(watch, key)
        if mode == "prefect" and at is not None:
            found[key] = at - said["returned"]
    return found


COLUMNS = ["whole", "final", "state", "recorded", "exit"]


def run(api_url: str, rounds: int) -> None:
    print(f"\n== a 10-row script's whole process, server already running ({rounds} rounds; "
          "seconds; final, state, recorded, exit: after run_experiment returned)")
    print(f"{'round':6} {'mode':8} " + " ".join(f"{c:>8}" for c in COLUMNS)
          + f" {'rec-final':>10} {'exit-final':>10}", flush=True)
    found: dict[str, list[dict[str, float]]] = {"local": [], "prefect": []}
    for n in range(rounds):
        for mode in found:
            r = one(mode, api_url)
            found[mode].append(r)
            print(f"{n + 1:<6} {mode:8} " + " ".join(_cell(r, c) for c in COLUMNS) + _gaps(r),
                  flush=True)
    print("median")
    for mode, runs in found.items():
        med = {c: statistics.median(r[c] for r in runs) for c in COLUMNS if all(c in r for r in runs)}
        gaps = [_gaps(r, raw=True) for r in runs if "final" in r]
        line = f"{'':6} {mode:8} " + " ".join(_cell(med, c) for c in COLUMNS)
        if gaps:
            line += "".join(f" {statistics.median(g[i] for g in gaps):10.2f}" for i in range(2))
        print(line)
    lag = [p["whole"] - loc["whole"] for p, loc in zip(found["prefect"], found["local"], strict=True)]
    print(f"prefect - local, whole process, per round: {' '.join(f'{x:.2f}' for x in lag)}; "
          f"median {statistics.median(lag):.2f} s")


def _cell(r: dict[str, float], column: str) -> str:
    return f"{r[column]:8.2f}" if column in r else f"{'-':>8}"


def _gaps(r: dict[str, Any], raw: bool = False) -> Any:
    """`wait_recorded` and the exit, after the server held every task run final."""
    if "final" not in r:
        return [] if raw else ""
    gaps = [r["recorded"] - r["final"], r["exit"] - r["final"]]
    return gaps if raw else "".join(f" {g:10.2f}" for g in gaps)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    run(os.environ["PREFECT_API_URL"], args.rounds)


if __name__ == "__main__":
    main()
