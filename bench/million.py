"""A 1,000,000-row local experiment (a trivial task, one evaluator): its memory over time.

    python bench/million.py [ROWS] [--backend local|prefect]   # default 1,000,000, local

Prints a line every 5 s (seconds, rows done, the process's RSS in MB, the journal's and
parts' bytes on disk so far: the results stream to Parquet as rows end) and a JSON
summary: rows/s, peak RSS, the final file's size. The rows come from a JSONL file the
script writes first (what a user's dataset is), so the rows themselves are read as a
user's would be. RSS is read from /proc (the process and its children: with
``--backend prefect`` the recorder process).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from patronus_tasks import evaluator, run_experiment, task


@task
def echo(evaluated_model_input: str) -> str:
    return evaluated_model_input


@evaluator
def nonempty(evaluated_model_output: str) -> bool:
    return bool(evaluated_model_output)


def _rss_mb(pid: int) -> float:
    """RSS of ``pid`` and its children, in MB (/proc)."""
    total = 0
    for p in [pid, *_children(pid)]:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task_dir in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task_dir / "children").read_text().split()]
        except OSError:
            continue
    return found + [g for c in found for g in _children(c)]


def _on_disk(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    rows = int(args[0]) if args else 1_000_000
    backend = sys.argv[sys.argv.index("--backend") + 1] if "--backend" in sys.argv else "local"
    work = Path(tempfile.mkdtemp(prefix="bench-million-"))
    data = work / "rows.jsonl"
    with data.open("w") as out:
        for i in range(rows):
            out.write(json.dumps({"evaluated_model_input": f"question {i}"}) + "\n")
    done = [0]
    peak = [0.0]
    start = time.monotonic()
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(5.0):
            rss = _rss_mb(os.getpid())
            peak[0] = max(peak[0], rss)
            print(f"{time.monotonic() - start:7.0f} s {done[0]:>9} rows {rss:7.0f} MB "
                  f"{_on_disk(work / 'results') / 1e6:8.1f} MB on disk", flush=True)

    threading.Thread(target=watch, daemon=True).start()
    exp = run_experiment("million", data=str(data), task=echo, evaluators=[nonempty],
                         backend=backend, results_dir=work / "results", print_summary=False,
                         html_report=False, on_progress=lambda d, _all: done.__setitem__(0, d))
    took = time.monotonic() - start
    stop.set()
    peak[0] = max(peak[0], _rss_mb(os.getpid()))
    print(json.dumps({"rows": rows, "backend": backend, "seconds": round(took, 1),
                      "rows_per_s": round(rows / took), "peak_rss_mb": round(peak[0]),
                      "results_mb": round(Path(str(exp.results_path)).stat().st_size / 1e6, 1),
                      "records": len(exp.to_dataframe(columns=["sid"]))}))


if __name__ == "__main__":
    main()
