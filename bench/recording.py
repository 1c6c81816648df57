"""Recording throughput (``bench.py --scenario record``): several experiment processes at
once against one Prefect server, each of fast taskless rows (two local evaluators), so
that the server's pace is what is measured.

Reports the task runs recorded per second, from the start of the first process's run
until every task run of every process was visible through the API, and the server's CPU
(all its processes: PostgreSQL, Valkey, API, services) per recorded task run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from servers import Server, settle, tree_cpu

HERE = Path(__file__).resolve().parent


def run(name: str, scenario: dict[str, Any], server: Server) -> None:
    rows, processes = scenario["rows"], scenario["processes"]
    env = {**os.environ, "PREFECT_API_URL": server.api_url, "PREFECT_LOGGING_LEVEL": "WARNING",
           "PREFECT_LOGGING_TO_API_ENABLED": "false"}
    logs = Path(tempfile.mkdtemp(prefix="bench-record-logs-"))
    before = {role: tree_cpu(pids) for role, pids in server.roles.items()}
    procs = [subprocess.Popen(_args(scenario), env=env, stdout=subprocess.PIPE,
                              stderr=(logs / f"{i}.log").open("w"), text=True)
             for i in range(processes)]
    outs = [(p.communicate(timeout=3600)[0], (logs / f"{i}.log").read_text())
            for i, p in enumerate(procs)]
    settle(server.pids)  # the server's tail (event persister) counts too
    cpu = {role: tree_cpu(pids) - before[role] for role, pids in server.roles.items()}
    print(f"\n== {name}: {processes} processes x {rows} taskless rows, 2 local evaluators "
          f"(their logs: {logs})")
    failed = [err for p, (_, err) in zip(procs, outs, strict=True) if p.returncode != 0]
    if failed:
        print(f"failed: {failed[0][-1500:]}")
        return
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    report(results, cpu)


def _args(scenario: dict[str, Any]) -> list[str]:
    return [sys.executable, str(HERE / "workload.py"), "prefect", "--taskless",
            "--rows", str(scenario["rows"]), "--concurrency", str(scenario["concurrency"]),
            "--url", "http://127.0.0.1:9/v1",  # taskless: no model is called
            "--results-dir", tempfile.mkdtemp(prefix="bench-record-")]


def report(results: list[dict[str, Any]], cpu: dict[str, float]) -> None:
    calls = sum(r["calls"] for r in results)
    missing = sum(r["missing"] for r in results)
    start = min(r["started"] for r in results)
    rows_done = max(r["started"] + r["wall"] for r in results) - start
    visible = max(r["started"] + r["wall"] + r["visible_after"] for r in results) - start
    print(f"{'task runs':>9} {'rows done s':>11} {'all visible s':>13} {'recorded/s':>10} "
          f"{'lost':>5} {'server cpu ms/task run':>22}")
    per_run = 1000 / max(1, calls - missing)
    print(f"{calls:9d} {rows_done:11.1f} {visible:13.1f} {(calls - missing) / visible:10.0f} "
          f"{missing:5d} {per_run * sum(cpu.values()):22.2f}")
    print("server cpu ms/task run by process: "
          + ", ".join(f"{role} {per_run * secs:.2f}" for role, secs in cpu.items())
          + f"; the experiments' own: {per_run * sum(r['cpu'] for r in results):.2f}")
