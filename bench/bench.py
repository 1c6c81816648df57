"""Throughput, CPU, memory and record-visibility benchmark: run by hand, not by the tests.

    .venv/bin/python bench/bench.py                 # every scenario (several minutes)
    .venv/bin/python bench/bench.py --scenario c16  # c16, c64, c256, taskless, record, startup
    .venv/bin/python bench/bench.py --scenario whole --server up   # a 10-row script's exit
    .venv/bin/python bench/bench.py --scenario record --server builtin --server production2

Starts a Prefect server on 127.0.0.1 (tuned as `patronus-tasks server up` does; `--server`
chooses which, servers.py: one SQLite server, `server up`'s, or the production stack
with 1 or 2 API processes, each in turn) and, per
scenario, a model stand-in (OpenAI-compatible, answering after L), then runs each mode in
its own process over the same rows: `plain` (a bare asyncio loop making the same calls:
the limit), `prefect` (this project's default: calls in asyncio, each recorded as its own
Prefect task run) and `local` (no Prefect). Prints each figure with its ratio to the
plain loop measured in the same run. The real Patronus SDK's runner (`patronus` mode) is
measured too when its venv exists ($PATRONUS_SDK_PYTHON, default
/tmp/patronus-venv/bin/python; set-up in patronus_sdk_workload.py), reporting to a loopback
stand-in of the Patronus API and OTLP collector (patronus_standin.py).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import recording  # noqa: E402
import whole_script  # noqa: E402
from servers import SERVERS, Server, settle, start, tree_cpu, wait  # noqa: E402

#: The real Patronus SDK's runner runs in its own venv (see patronus_sdk_workload.py):
#: measured when this Python exists.
PATRONUS_PYTHON = Path(os.environ.get("PATRONUS_SDK_PYTHON", "/tmp/patronus-venv/bin/python"))
MODES = ["plain", "local", "prefect", "patronus"]
#: `--split-cores`: the CPUs the measured process (and the recorder process it starts)
#: runs on; the bench and the services it starts (servers, model and API stand-ins) keep
#: the rest. None: every process may run on every CPU.
CLIENT_CPUS: set[int] | None = None
SCENARIOS = {
    "c16": {"rows": 2000, "concurrency": 16, "latency": 0.05, "modes": MODES},
    "c64": {"rows": 2000, "concurrency": 64, "latency": 0.5, "modes": MODES},
    "c256": {"rows": 20000, "concurrency": 256, "latency": 0.05, "modes": MODES},
    "taskless": {"rows": 100_000, "concurrency": 64, "latency": 0.0,
                 "modes": ["plain", "local", "prefect"], "taskless": True},
    # Recording throughput: 2 processes at once, each 1,000 taskless rows of 2 evaluators
    # (4,000 task runs), rows fast: the server's pace is the measure (recording.py).
    "record": {"rows": 1000, "processes": 2, "concurrency": 64, "latency": 0.0,
               "modes": ["prefect"], "taskless": True},
    # Spans (issue 36): the c16 run with a task opening no span, and with 10 spans per row
    # (each a task run nested under the row's; the SDK's exported over OTLP): the ratio to
    # plain of each, this project's and the Patronus SDK's, in one run.
    "spans16": {"rows": 2000, "concurrency": 16, "latency": 0.05,
                "modes": ["plain", "prefect-spans0", "prefect-spans10", "patronus-spans0",
                          "patronus-spans10"]},
}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_standin() -> tuple[str, subprocess.Popen[bytes]]:
    """The loopback stand-in of the Patronus API and OTLP collector the SDK reports to."""
    port = _port()
    proc = subprocess.Popen([sys.executable, str(HERE / "patronus_standin.py"), str(port)],
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait(f"{url}/_counts", proc)
    return url, proc


def start_model_server(latency: float) -> tuple[str, subprocess.Popen[bytes]]:
    """The OpenAI-compatible stand-in of a model answering after ``latency`` seconds."""
    port = _port()
    proc = subprocess.Popen([sys.executable, str(HERE / "latency_server.py"), str(port),
                             str(latency)])
    wait(f"http://127.0.0.1:{port}/", proc)
    return f"http://127.0.0.1:{port}/v1", proc


def _patronus_args(scenario: dict[str, Any], url: str, standin: str, spans: str) -> list[str]:
    return [str(PATRONUS_PYTHON), str(HERE / "patronus_sdk_workload.py"), "--rows",
            str(scenario["rows"]), "--concurrency", str(scenario["concurrency"]), "--url", url,
            "--api-url", standin, *(["--spans", spans] if spans else [])]


def run_mode(mode: str, scenario: dict[str, Any], url: str, api_url: str,
             procs: list[list[int]]) -> dict[str, Any]:
    base, _, variant = mode.partition("-spans")  # "prefect-spans10": 10 spans a row
    if base == "patronus":  # its API stand-in takes the Prefect server's column
        standin, proc = start_standin()
        try:
            return {**_measure(mode, _patronus_args(scenario, url, standin, variant), {},
                               [procs[0], [proc.pid]]), "mode": mode}
        finally:
            proc.terminate()
            proc.wait(20)
    args = [sys.executable, str(HERE / "workload.py"), base, "--rows", str(scenario["rows"]),
            "--concurrency", str(scenario["concurrency"]), "--url", url]
    if variant:
        args += ["--spans", variant]
    if scenario.get("taskless"):
        args.append("--taskless")
    env = {"PREFECT_API_URL": api_url, "PREFECT_LOGGING_LEVEL": "WARNING",
           "PREFECT_LOGGING_TO_API_ENABLED": "false"}
    return {**_measure(mode, args, env, procs), "mode": mode}


def _measure(mode: str, args: list[str], env: dict[str, str],
             procs: list[list[int]]) -> dict[str, Any]:
    env = {**os.environ, **env}
    before = [tree_cpu(p) for p in procs]
    out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=3600,
                         preexec_fn=_on_client_cpus if CLIENT_CPUS else None)
    if out.returncode != 0:
        return {"mode": mode, "error": out.stderr[-1500:]}
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    # What the model server and the Prefect server spent meanwhile. The Prefect server
    # goes on after the records are visible (event persister, triggers): counted until
    # it is idle, which also keeps that tail out of the next mode's figures.
    settle(procs[-1])
    result["lat_cpu"], result["api_cpu"] = (tree_cpu(p) - b for p, b in zip(procs, before, strict=True))
    return result


def _on_client_cpus() -> None:
    assert CLIENT_CPUS
    os.sched_setaffinity(0, CLIENT_CPUS)  # inherited by the recorder process it starts


def split_cores(recorder_apart: bool = False) -> None:
    """The experiment's machine on the first CPU, the services on the others: as if the
    Prefect server, the model and the Patronus API ran on hosts of their own. Set before
    any service starts, so they and all their threads inherit it."""
    global CLIENT_CPUS
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--split-cores needs 2 CPUs or more")
    CLIENT_CPUS = {cpus[0]}
    os.sched_setaffinity(0, set(cpus[1:]))
    if recorder_apart:  # read by workload.py, which pins its recorder process there
        os.environ["BENCH_RECORDER_CPUS"] = ",".join(map(str, cpus[1:]))
    what = "the measured process" + ("" if recorder_apart else " and its recorder")
    print(f"split cores: {what} on CPU {cpus[0]}, "
          f"the services on {cpus[1:]}")


def report(name: str, scenario: dict[str, Any], results: list[dict[str, Any]]) -> None:
    rows, c = scenario["rows"], scenario["concurrency"]
    calls_per_row, latency = 0 if scenario.get("taskless") else 2, scenario["latency"]
    limit = c / (calls_per_row * latency) if calls_per_row else None
    plain = next(r for r in results if r["mode"] == "plain")
    print(f"\n== {name}: {rows} rows, C={c}, L={latency * 1000:.0f} ms, "
          f"{calls_per_row} model calls per row"
          + (f", C/L limit {limit:.0f} rows/s" if limit else ""))
    print(f"{'mode':15} {'rows/s':>8} {'%C/L':>6} {'x plain':>8} {'cpu ms/row':>10} "
          f"{'framework':>9} {'rss MB':>7} {'rows vis s':>10} {'visible s':>9} {'model srv':>9} "
          f"{'prefect srv':>11} {'rec/s':>6}")
    for r in results:
        if "error" in r:
            print(f"{r['mode']:15} failed: {r['error']}")
            continue
        rate = rows / r["wall"]
        pct = f"{100 * rate / limit:5.1f}" if limit else "    -"
        cpu_row = 1000 * r["cpu"] / rows
        framework = cpu_row - 1000 * plain["cpu"] / rows
        visible = "-" if r.get("visible_after") is None else f"{r['visible_after']:.1f}"
        rows_visible = "-" if r.get("rows_visible_after") is None \
            else f"{max(0.0, r['rows_visible_after']):.1f}"
        if r.get("missing"):
            visible = f"{r['missing']} lost"
        print(f"{r['mode']:15} {rate:8.0f} {pct:>6} {rate / (rows / plain['wall']):8.2f} "
              f"{cpu_row:10.3f} {framework:9.3f} {r['rss_mb']:7.0f} {rows_visible:>10} {visible:>9} "
              f"{1000 * r['lat_cpu'] / rows:9.3f} {1000 * r['api_cpu'] / rows:11.3f} "
              f"{recorded_per_second(r):>6}")


def recorded_per_second(r: dict[str, Any]) -> str:
    """Task runs recorded per second: every call's, from the start until all were visible."""
    if not r.get("calls") or r.get("visible_after") is None:
        return "-"
    return f"{(r['calls'] - r.get('missing', 0)) / (r['wall'] + r['visible_after']):.0f}"


def startup(api_home: Path) -> None:
    """A 10-row experiment on the built-in server vs a bare Prefect flow with ten tasks."""
    bare = ("from prefect import flow, task\n@task\ndef t(i): return i\n"
            "@flow\ndef f():\n    return [t(i) for i in range(10)]\nf()\n")
    ours = ("from patronus_tasks import evaluator, run_experiment\n@evaluator\n"
            "def ok(row) -> bool: return True\n"
            "run_experiment('startup', data=[{'x': i} for i in range(10)], evaluators=[ok],"
            " results_dir='/tmp/bench-startup', print_summary=False)\n")
    times = {}
    for name, code in (("bare flow, 10 tasks", bare), ("experiment, 10 rows", ours)):
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
        env["PREFECT_HOME"] = str(api_home / name.replace(" ", "_").replace(",", ""))
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
        times[name] = time.perf_counter() - t0
    base = times["bare flow, 10 tasks"]
    print("\n== start-up on the built-in server (fresh process and database each)")
    for name, secs in times.items():
        print(f"{name:22} {secs:6.1f} s   x bare {secs / base:4.2f}")


def fixed_cost(api_url: str, repeats: int = 3) -> None:
    """A 10-row experiment, first of a fresh process, against the running server: the
    `run_experiment` call with ``local`` and ``prefect``, and for ``prefect`` how long until
    its task runs (and its final state) are visible after the return."""
    env = {**os.environ, "PREFECT_API_URL": api_url, "PREFECT_LOGGING_LEVEL": "WARNING"}
    found: dict[str, list[dict[str, float]]] = {"local": [], "prefect": []}
    for _ in range(repeats):
        for mode in found:
            out = subprocess.run([sys.executable, str(HERE / "fixed_cost.py"), mode], env=env,
                                 capture_output=True, text=True, check=True, timeout=300)
            found[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"\n== fixed cost: 10 rows, first experiment of a fresh process ({repeats} runs, "
          "median)")
    for mode, runs in found.items():
        line = f"{mode:8} call {_median(runs, 'call'):6.3f} s"
        if mode == "prefect":
            line += (f"   task runs visible {_median(runs, 'visible'):5.2f} s after the return, "
                     f"final state {_median(runs, 'final_state'):5.2f} s")
        print(line)


def _median(runs: list[dict[str, float]], key: str) -> float:
    values = sorted(r[key] for r in runs)
    return values[len(values) // 2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenario", choices=[*SCENARIOS, "startup", "fixed", "whole"],
                        action="append")
    parser.add_argument("--modes", help="comma-separated modes to run (plain always runs)")
    parser.add_argument("--server", choices=SERVERS, action="append",
                        help="the Prefect server to record to (servers.py; several: each in "
                        "turn, every scenario on each; default builtin)")
    parser.add_argument("--home", help="where the Prefect servers keep their state, a folder "
                        "per server (default: fresh temporary directories: a database grown "
                        "by earlier runs slows it down)")
    parser.add_argument("--rows", type=int, help="rows per run (per process for `record`) "
                        "instead of the scenario's")
    parser.add_argument("--repeat", type=int, default=1, help="run the modes this many times "
                        "in turn and report each mode's median ratio to its round's plain loop")
    parser.add_argument("--split-cores", action="store_true", help="the measured process "
                        "(and its recorder process) on one CPU, the services on the others: "
                        "servers and model on hosts of their own, on one machine")
    parser.add_argument("--recorder-apart", action="store_true", help="with --split-cores: "
                        "the recorder process on the services' CPUs, not the rows' (a "
                        "machine with a core to spare for it)")
    args = parser.parse_args()
    if args.split_cores:
        split_cores(args.recorder_apart)
    if args.rows:
        for scenario in SCENARIOS.values():
            scenario["rows"] = args.rows
    chosen = args.scenario or ["fixed", "whole", *SCENARIOS, "startup"]
    print(f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}")
    if "startup" in chosen:
        startup(Path(tempfile.mkdtemp(prefix="bench-startup-")))
    for kind in args.server or ["builtin"]:
        home = Path(args.home) / kind if args.home else Path(tempfile.mkdtemp(prefix=f"bench-{kind}-"))
        home.mkdir(parents=True, exist_ok=True)
        print(f"\n#### server: {kind} (its state and logs in {home})")
        server = start(kind, home)
        try:
            for name in (n for n in chosen if n != "startup"):
                if name == "fixed":
                    fixed_cost(server.api_url)
                    continue
                if name == "whole":
                    whole_script.run(server.api_url, max(args.repeat, 5))
                    continue
                run_scenario(name, SCENARIOS[name], server, args.modes, args.repeat)
        finally:
            server.stop()


def run_scenario(name: str, scenario: dict[str, Any], server: Server, wanted: str | None,
                 repeat: int = 1) -> None:
    settle(server.pids)  # a server still busy with an earlier scenario would slow this one
    if scenario.get("processes"):
        recording.run(f"{name} on {server.kind}", scenario, server)
        return
    modes = [m for m in scenario["modes"]
             if (not wanted or m == "plain" or m in wanted.split(","))
             and (not m.startswith("patronus") or PATRONUS_PYTHON.exists())]
    url, model = start_model_server(scenario["latency"])
    rounds: list[list[dict[str, Any]]] = []
    try:
        for _ in range(repeat):  # the modes in turn, each round: a noisy machine's drift
            rounds.append([run_mode(m, scenario, url, server.api_url, [[model.pid], server.pids])
                           for m in modes])  # touches every mode of a round alike
            report(f"{name} on {server.kind}", scenario, rounds[-1])
    finally:
        model.terminate()
        model.wait(20)
    if repeat > 1:
        report_rounds(rounds)


def report_rounds(rounds: list[list[dict[str, Any]]]) -> None:
    """Each mode's ratio to the plain loop of its own round: every round's, and the median."""
    print(f"\n== x plain, {len(rounds)} rounds (each against its own round's plain loop)")
    for mode in (r["mode"] for r in rounds[0]):
        ratios = sorted(x for x in (_ratio(round_, mode) for round_ in rounds) if x == x)
        failed = len(rounds) - len(ratios)  # NaN: the mode failed that round
        median = f"{ratios[len(ratios) // 2]:5.2f}" if ratios else "    -"
        print(f"{mode:15} median {median}   rounds " + " ".join(f"{x:.2f}" for x in ratios)
              + (f"   ({failed} failed)" if failed else ""))


def _ratio(round_: list[dict[str, Any]], mode: str) -> float:
    wall: dict[str, float] = {r["mode"]: r["wall"] for r in round_ if "wall" in r}
    return wall["plain"] / wall[mode] if mode in wall and "plain" in wall else float("nan")


if __name__ == "__main__":
    main()
