"""What the SQL sandbox costs, and what 16 hostile queries in flight take: run by hand.

    .venv/bin/python bench/sql_sandbox.py                   # both parts
    .venv/bin/python bench/sql_sandbox.py --part cost --rounds 5 --only sqlite
    .venv/bin/python bench/sql_sandbox.py --part hostile

- ``cost``: 2,000 ordinary queries (the bundled text-to-SQL dataset's, in turn) through
  `run_query` and through `sql_result_match` (the gold query's rows kept, as in a run),
  this tree against today's main (``git archive main patronus_tasks``), each round in a
  fresh process with that tree first on its path, on the flow's schema script (SQLite),
  a SQLite file and a DuckDB file; rounds alternate, figures are medians (wall and CPU
  ms per query, CPU counting every thread of the process and its DuckDB workers) and
  the ratio this / main.
- ``hostile``: per engine, 16 threads each running a hostile query at once (a huge value,
  a huge row, an endless recursive CTE, a huge sort, 200 million rows, ...), each in a
  fresh process; what each query got, the seconds, and the process's peak RSS
  (``getrusage``) against its RSS before.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if not os.environ.get("PYTHONPATH"):  # a cost round's child: the tree its PYTHONPATH names
    sys.path.insert(0, str(ROOT))
SCHEMA = ROOT / "datasets" / "text_to_sql" / "shop.sql"
N = 2000


def main_tree() -> Path:
    """Today's main (`git archive main patronus_tasks`), put first on a child's path."""
    folder = Path(tempfile.mkdtemp(prefix="sql-bench-main-"))
    archive = subprocess.run(["git", "archive", "main", "patronus_tasks"], cwd=ROOT,
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


def pairs() -> list[tuple[str, str]]:
    rows = [json.loads(line) for line in (ROOT / "datasets" / "text_to_sql.jsonl").read_text().splitlines()]
    return [(r["query"], r["evaluated_model_gold_answer"]) for r in rows if r["language"] == "sql"]


def databases(folder: Path) -> dict[str, Any]:
    script = SCHEMA.read_text()
    file = folder / "shop.db"
    with sqlite3.connect(file) as conn:
        conn.executescript(script)
    conn.close()
    found = {"script (sqlite)": SCHEMA, "sqlite file": file}
    try:
        import duckdb
    except ImportError:
        return found
    ddb = folder / "shop.duckdb"
    dconn = duckdb.connect(str(ddb))
    dconn.execute(script)
    dconn.close()
    return found | {"duckdb file": ddb}


def timed(run: Callable[[str, str], Any], work: list[tuple[str, str]]) -> tuple[float, float]:
    """Wall and CPU ms per query (CPU: every thread of the process and its SQL workers)."""
    start, cpu = time.perf_counter(), _cpu()
    for query, gold in work:
        with contextlib.suppress(Exception):  # a wrong query of the dataset (the flow's task error)
            run(query, gold)
    return ((time.perf_counter() - start) * 1000 / len(work), (_cpu() - cpu) * 1000 / len(work))


def _cpu() -> float:
    """This process's CPU seconds and its living children's (the DuckDB workers)."""
    total, tick = time.process_time(), os.sysconf("SC_CLK_TCK")
    for pid in _children():
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def cost_child(name: str, source: str, what: str) -> None:
    """One round in this process: the code on its path (this tree's or main's)."""
    from patronus_tasks.evaluators import sql

    engine = "duckdb" if "duckdb" in name else "sqlite"
    source_of = Path(source) if source.endswith(".sql") else source
    work = (pairs() * N)[:N]
    db, check = sql.Database(source_of, engine), sql.sql_result_match(source_of, engine=engine)
    runs = {"run_query": lambda q, g: sql.run_query(db, q, 10.0),
            "sql_result_match": lambda q, g: check.evaluate(evaluated_model_gold_answer=g,
                                                            evaluated_model_output=q)}
    timed(runs[what], work[:20])  # warm: imports, the copy, a worker, the gold rows
    print(json.dumps([*timed(runs[what], work), sql.__file__]))


def cost(rounds: int, only: str) -> None:
    """Rounds alternate: main's code, then this tree's, each in a fresh process."""
    trees = {"main": main_tree(), "this": ROOT}
    with tempfile.TemporaryDirectory() as folder:
        for name, source in databases(Path(folder)).items():
            for what in ("run_query", "sql_result_match"):
                if only not in name:
                    continue
                figures: dict[str, list[tuple[float, float]]] = {"main": [], "this": []}
                for _ in range(rounds):
                    for label, tree in trees.items():
                        out = subprocess.run(
                            [sys.executable, __file__, "--cost-child", name, str(source), what],
                            env=os.environ | {"PYTHONPATH": str(tree)}, capture_output=True,
                            text=True, check=True).stdout
                        wall, cpu, file = json.loads(out.splitlines()[-1])
                        assert file.startswith(str(tree)), (file, tree)
                        figures[label].append((wall, cpu))
                print(f"{name:16} {what:16} {_line(figures)}")


def _line(figures: dict[str, list[tuple[float, float]]]) -> str:
    (wall_a, cpu_a), (wall_b, cpu_b) = (
        (statistics.median(w for w, _ in figures[k]), statistics.median(c for _, c in figures[k]))
        for k in ("main", "this"))
    return (f"main {wall_a:7.3f} ms wall {cpu_a:7.3f} ms CPU | this {wall_b:7.3f} ms wall "
            f"{cpu_b:7.3f} ms CPU | x{wall_b / wall_a:5.2f} wall x{cpu_b / cpu_a:5.2f} CPU "
            f"(wall per round: main {_r(figures['main'])}; this {_r(figures['this'])})")


def _r(values: list[tuple[float, float]]) -> str:
    return " ".join(f"{w:.3f}" for w, _ in values)


ENDLESS = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
HOSTILE = {
    "sqlite": [
        "SELECT zeroblob(900000000)",
        "SELECT " + ", ".join(["randomblob(30000000)"] * 200),  # one row of 6 GB
        ENDLESS + "SELECT x FROM c",
        ENDLESS + "SELECT x, hex(randomblob(500)) FROM c ORDER BY 2",  # a sort that never ends
        ENDLESS + "SELECT group_concat(hex(randomblob(1000))) FROM c",
        ENDLESS + "SELECT randomblob(30000000) FROM c",
        ENDLESS + "SELECT count(*) FROM c a, c b",
        "SELECT printf('%.*c', 2000000000, 'x')",
    ],
    "duckdb": [
        "SELECT * FROM range(200000000)",
        ENDLESS + "SELECT x FROM c",
        "SELECT list(range) FROM range(300000000)",
        "SELECT range, md5(range::VARCHAR) FROM range(100000000) ORDER BY 2",
        "SELECT string_agg(md5(range::VARCHAR), '') FROM range(100000000)",
        # Built inside one call, outside DuckDB's memory_limit: ~4 GB in-process before
        # issue 48.1; in a worker, an allocation failure past its address space.
        "SELECT repeat('x', 2000000000)",
        "SELECT repeat('x', 900000000) FROM range(4)",
        "SELECT length(list_sort(range(30000000))::VARCHAR)",  # ~10 s inside one call
    ],
}


def hostile_child(engine: str) -> None:
    from patronus_tasks.evaluators.sql import Database, run_query

    source = "CREATE TABLE t (x INT);"
    db = Database(source, engine)
    run_query(db, "SELECT 1")  # the copy made and DuckDB loaded before the baseline
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    queries = (HOSTILE[engine] * 2)[:16]

    def one(query: str) -> str:
        start = time.perf_counter()
        try:
            rows = run_query(db, query)
            said = f"{len(rows)} rows"
        except Exception as exc:
            said = f"{type(exc).__name__}: {str(exc).splitlines()[0][:90]}"
        return f"{time.perf_counter() - start:6.1f} s  {query[:60]:60}  {said}"

    sampler = _Sampler()
    start = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        outcomes = list(pool.map(one, queries))
    answered = time.perf_counter() - start
    settled = _settled()  # a query past its timeout inside one C call ends on its own
    if (workers := db.local().workers) is not None:
        workers.close()  # reaped: their peak is in RUSAGE_CHILDREN
    sampler.stop()
    peak, worker = (resource.getrusage(w).ru_maxrss // 1024
                    for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    print(f"{engine}: 16 hostile queries in flight, every row answered in {answered:.1f} s, their "
          f"threads done {settled:.1f} s later; peak RSS {peak} MB (before them: {before} MB), "
          f"largest worker's {worker} MB, process and workers together {sampler.peak >> 20} MB "
          "(sampled every 20 ms)")
    for line in outcomes:
        print("  " + line)


class _Sampler:
    """The RSS of this process and its children together, its peak."""

    def __init__(self) -> None:
        self.peak, self.done = 0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(0.02):
            self.peak = max(self.peak, _rss(os.getpid()) + sum(map(_rss, _children())))

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


def _children() -> list[int]:
    pids = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that just ended
            pids += [int(pid) for pid in (task / "children").read_text().split()]
    return pids


def _rss(pid: int) -> int:
    with contextlib.suppress(OSError):
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return 0


def _settled() -> float:
    from patronus_tasks.evaluators import sql_bounds

    start = time.perf_counter()
    runners = sql_bounds._RUNNERS
    while time.perf_counter() - start < 300:
        busy = sum(t.name == "patronus-sql" for t in threading.enumerate()) - runners._idle
        if busy <= 0:
            break
        time.sleep(0.2)
    return time.perf_counter() - start


def hostile(only: str) -> None:
    for engine in ("sqlite", "duckdb"):
        if only not in engine or (engine == "duckdb" and importlib.util.find_spec("duckdb") is None):
            continue
        subprocess.run([sys.executable, __file__, "--child", engine], check=False)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", choices=["cost", "hostile", "both"], default="both")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="", help="the databases whose name has this ('sqlite', 'duckdb')")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--cost-child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cost_child:
        return cost_child(*args.cost_child)
    if args.child:
        return hostile_child(args.child)
    if args.part in ("cost", "both"):
        cost(args.rounds, args.only)
    if args.part in ("hostile", "both"):
        hostile(args.only)


if __name__ == "__main__":
    main()
