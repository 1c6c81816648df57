"""What the SQL sandbox costs, and what 16 hostile queries in flight take: run by hand.

    .venv/bin/python bench/sql_sandbox.py                   # both parts
    .venv/bin/python bench/sql_sandbox.py --part cost --rounds 5 --only sqlite
    .venv/bin/python bench/sql_sandbox.py --part hostile

- ``cost``: 2,000 ordinary queries (the bundled text-to-SQL dataset's, in turn) through
  `run_query` and through `sql_result_match` (the gold query's rows kept, as in a run),
  the sandbox on (this tree) against the landed module (``git show
  main:patronus_tasks/evaluators/sql.py``, loaded beside it), on the flow's schema script
  (SQLite), a SQLite file and a DuckDB file; rounds alternate, figures are medians (wall
  and CPU ms per query, CPU counting every thread of the process) and the ratio sandbox /
  landed.
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
sys.path.insert(0, str(ROOT))
SCHEMA = ROOT / "datasets" / "text_to_sql" / "shop.sql"
N = 2000


def landed() -> Any:
    """The module as it is on main, loaded under another name."""
    source = subprocess.run(["git", "show", "main:patronus_tasks/evaluators/sql.py"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / "landed_sql.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("landed_sql", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    conn = duckdb.connect(str(ddb))
    conn.execute(script)
    conn.close()
    return found | {"duckdb file": ddb}


def timed(run: Callable[[str, str], Any], work: list[tuple[str, str]]) -> tuple[float, float]:
    """Wall and CPU ms per query (the process's CPU: the query's own thread included)."""
    start, cpu = time.perf_counter(), time.process_time()
    for query, gold in work:
        with contextlib.suppress(Exception):  # a wrong query of the dataset (the flow's task error)
            run(query, gold)
    return ((time.perf_counter() - start) * 1000 / len(work), (time.process_time() - cpu) * 1000 / len(work))


def cost(rounds: int, only: str) -> None:
    from patronus_tasks.evaluators import sql as sandboxed

    old = landed()
    work = (pairs() * N)[:N]
    with tempfile.TemporaryDirectory() as folder:
        for name, source in databases(Path(folder)).items():
            if only not in name:
                continue
            engine = "duckdb" if "duckdb" in name else "sqlite"
            modes = {}
            for label, module in (("landed", old), ("sandbox", sandboxed)):
                db = module.Database(source, engine)
                check = module.sql_result_match(source, engine=engine)
                modes[label] = {
                    "run_query": lambda q, g, m=module, d=db: m.run_query(d, q, 10.0),
                    "sql_result_match": lambda q, g, c=check: c.evaluate(
                        evaluated_model_gold_answer=g, evaluated_model_output=q),
                }
            for what in ("run_query", "sql_result_match"):
                figures: dict[str, list[tuple[float, float]]] = {"landed": [], "sandbox": []}
                for label in modes:  # warm: imports, the copy, the gold rows
                    timed(modes[label][what], work[:20])
                for _ in range(rounds):
                    for label in ("landed", "sandbox"):
                        figures[label].append(timed(modes[label][what], work))
                print(f"{name:16} {what:16} {_line(figures)}")


def _line(figures: dict[str, list[tuple[float, float]]]) -> str:
    (wall_a, cpu_a), (wall_b, cpu_b) = (
        (statistics.median(w for w, _ in figures[k]), statistics.median(c for _, c in figures[k]))
        for k in ("landed", "sandbox"))
    return (f"landed {wall_a:7.3f} ms wall {cpu_a:7.3f} ms CPU | sandbox {wall_b:7.3f} ms wall "
            f"{cpu_b:7.3f} ms CPU | x{wall_b / wall_a:5.2f} wall x{cpu_b / cpu_a:5.2f} CPU "
            f"(wall per round: landed {_r(figures['landed'])}; sandbox {_r(figures['sandbox'])})")


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
        ENDLESS + "SELECT count(*) FROM c",
        "SELECT count(*) FROM range(1000000000) a, range(1000) b",
        "SELECT a.range, md5(b.range::VARCHAR) FROM range(100000) a, range(100000) b",
    ],
    # Not bounded (the README says so): one function building a huge value, inside DuckDB
    # before any check can see it, 2,048 rows at a time: repeat('x', 2000000000) ~4 GB.
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

    start = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        outcomes = list(pool.map(one, queries))
    answered = time.perf_counter() - start
    settled = _settled()  # a query past its timeout inside one C call ends on its own
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print(f"{engine}: 16 hostile queries in flight, every row answered in {answered:.1f} s, their "
          f"threads done {settled:.1f} s later; peak RSS {peak} MB (before them: {before} MB)")
    for line in outcomes:
        print("  " + line)


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


def hostile() -> None:
    for engine in ("sqlite", "duckdb"):
        if engine == "duckdb" and importlib.util.find_spec("duckdb") is None:
            continue
        subprocess.run([sys.executable, __file__, "--child", engine], check=False)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", choices=["cost", "hostile", "both"], default="both")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="", help="the databases whose name has this ('sqlite', 'duckdb')")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return hostile_child(args.child)
    if args.part in ("cost", "both"):
        cost(args.rounds, args.only)
    if args.part in ("hostile", "both"):
        hostile()


if __name__ == "__main__":
    main()
