"""A 10-row script's whole process, on Prefect against the same on `local`, a plain loop
and the Patronus SDK (issue 49).

    PREFECT_API_URL=http://127.0.0.1:4200/api python bench/whole_script.py [--rounds 5]
    python bench/bench.py --scenario whole [--server up] [--repeat 5]

Each round runs `fixed_cost.py MODE --whole` (the experiment, then `wait_recorded`, then
exit, as a script would) with ``local`` and with ``prefect`` against a server already
running, the same rows as a plain loop (`whole_plain.py`: the floor) and, when its venv
exists ($PATRONUS_SDK_PYTHON, default /tmp/patronus-venv/bin/python), with the Patronus
SDK's `run_experiment` reporting to a loopback stand-in of its API (`whole_patronus.py`),
timing each process from its start to its exit. Meanwhile this process (not the
measured one) asks the server every 20 ms how many of the run's 20 task runs are final,
then for its flow run's final state: so the figures tell apart what the server did
(``final``: every task run final; ``state``: the flow run's final state) from when
the script heard of it (``recorded``: `wait_recorded` returned) and when it ended
(``exit``), each in seconds after `run_experiment` returned.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
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


PATRONUS_PYTHON = os.environ.get("PATRONUS_SDK_PYTHON", "/tmp/patronus-venv/bin/python")


def _argv(mode: str, name: str, standin: str | None) -> list[str]:
    if mode == "plain":
        return [sys.executable, str(HERE / "whole_plain.py")]
    if mode == "patronus":
        return [PATRONUS_PYTHON, str(HERE / "whole_patronus.py"), str(standin)]
    return [sys.executable, str(HERE / "fixed_cost.py"), mode, "--whole", name]


def one(mode: str, api_url: str, standin: str | None = None) -> dict[str, float]:
    name = f"whole-{uuid.uuid4().hex[:8]}"  # a project of its own: its tag finds its runs
    env = {**os.environ, "PREFECT_API_URL": api_url, "PREFECT_LOGGING_LEVEL": "WARNING"}
    watch = Watch(api_url, name)
    if mode == "prefect":
        watch.start()
    began = time.time()
    out = subprocess.run(_argv(mode, name, standin), env=env, capture_output=True, text=True,
                         check=True, timeout=300)
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
    with _standin() as standin:
        _rounds(api_url, rounds, standin)


def _rounds(api_url: str, rounds: int, standin: str | None) -> None:
    modes = ["plain", "local", "prefect", *(["patronus"] if standin else [])]
    print(f"\n== a 10-row script's whole process, server already running ({rounds} rounds; "
          "seconds; final, state, recorded, exit: after run_experiment returned)")
    if not standin:
        print(f"(no Patronus SDK venv at {PATRONUS_PYTHON}: its row is left out; "
              "see patronus_sdk_workload.py)")
    print(f"{'round':6} {'mode':8} " + " ".join(f"{c:>8}" for c in COLUMNS)
          + f" {'rec-final':>10} {'exit-final':>10}", flush=True)
    found: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    for n in range(rounds):
        for mode in found:
            r = one(mode, api_url, standin)
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
    for other in [m for m in modes if m != "prefect"]:
        lag = [p["whole"] - o["whole"] for p, o in zip(found["prefect"], found[other], strict=True)]
        ratio = statistics.median(found["prefect"][i]["whole"] / found[other][i]["whole"]
                                  for i in range(rounds))
        print(f"prefect - {other}, whole process, per round: {' '.join(f'{x:.2f}' for x in lag)}; "
              f"median {statistics.median(lag):.2f} s (ratio {ratio:.2f})")


@contextlib.contextmanager
def _standin() -> Iterator[str | None]:
    """The loopback stand-in of the Patronus API the SDK reports to (None: no SDK venv)."""
    if not Path(PATRONUS_PYTHON).exists():
        yield None
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(HERE / "patronus_standin.py"), str(port)],
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{url}/_counts", timeout=2).raise_for_status()
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "the Patronus stand-in did not start"
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


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
