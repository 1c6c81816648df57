"""A 1,000,000-row local experiment (a trivial task, one evaluator): its memory over time.

    python bench/million.py [ROWS] [--backend local|prefect] [--phase-peaks]
    # default 1,000,000 rows, local

Prints a line every 5 s (seconds, rows done, the process's RSS in MB, the journal's and
parts' bytes on disk so far: the results stream to Parquet as rows end), then the peak
after each phase of the run's end, and a JSON summary: rows/s, peak RSS, the final file's
size. The rows come from a JSONL file the script writes first (what a user's dataset
is), so the rows themselves are read as a user's would be.

The peak is the kernel's: ``getrusage``'s ``ru_maxrss`` (the most the process ever held
resident, every page counted when it was touched), never a sample; with ``--backend
prefect`` the recorder process's is its own (``children_peak_mb``, once it has ended).
A sample every 5 s missed the merge's peak by 0.3-0.8 GB. The phases are marked by
wrapping the package's functions that start them (``dataset_schema``, once the dataset is
read; ``ParquetSink.finalize``; ``write_spans``; the manifest's figures; the summary),
reading ``ru_maxrss`` and VmRSS at each boundary: the phase after which the peak grew is
the one that took it there. ``--phase-peaks`` gives each phase's own peak instead
(VmHWM, reset at each boundary; ``ru_maxrss`` is reset with it).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

from patronus_tasks import evaluator, run_experiment, task
from patronus_tasks.execute import run as _run
from patronus_tasks.record import parquet as _parquet


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


def _peak_mb(who: int = resource.RUSAGE_SELF) -> float:
    """The kernel's maximum resident set of this process (or its ended children), in MB."""
    return resource.getrusage(who).ru_maxrss / 1024  # KB on Linux


def _high_water_mb() -> float:
    """The kernel's peak RSS of this process since it was last reset (VmHWM), in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Phases:
    """The peak and the RSS at each phase's end, the phase's start being the previous
    one's end. The peak is ``ru_maxrss`` so far; with ``own`` (``--phase-peaks``), each
    phase's own (VmHWM, reset at each mark through /proc/self/clear_refs: ``ru_maxrss``
    is reset with it, and the run's peak is the phases' highest)."""

    def __init__(self, start: float, own: bool = False) -> None:
        self.start, self.own = start, own
        self.marks: list[tuple[str, float, float, float]] = []
        self.mark("start")

    def mark(self, phase: str) -> None:
        peak = _high_water_mb() if self.own else _peak_mb()
        self.marks.append((phase, time.monotonic() - self.start, peak, _rss_mb(os.getpid())))
        if self.own:
            Path("/proc/self/clear_refs").write_text("5")

    @property
    def peak_mb(self) -> float:
        return max(peak for _, _, peak, _ in self.marks) if self.own else _peak_mb()

    def hook(self, owner: object, name: str, before: str, after: str | None = None) -> None:
        """Mark ``before`` when ``owner.name`` is called (the phase it ends), ``after`` when
        it returns."""
        inner = getattr(owner, name)

        def wrapped(*args: object, **kwargs: object) -> object:
            self.mark(before)
            result = inner(*args, **kwargs)
            if after:
                self.mark(after)
            return result
        setattr(owner, name, wrapped)

    def report(self) -> None:
        head = "its own peak" if self.own else "peak MB"
        print(f"{'phase (ends at)':<34}{'s':>7}{head:>13}{'RSS MB':>8}")
        for phase, at, peak, rss in self.marks:
            print(f"{phase:<34}{at:7.1f}{peak:13.0f}{rss:8.0f}")


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

    phases = Phases(start, own="--phase-peaks" in sys.argv)
    phases.hook(_parquet, "dataset_schema", "dataset read")
    phases.hook(_parquet.ParquetSink, "finalize", "rows run (parts written)", "results written")
    phases.hook(_parquet, "write_spans", "results merged")
    phases.hook(_run, "_with_figures", "spans, parts removed", "manifest's usage figures")
    threading.Thread(target=watch, daemon=True).start()
    exp = run_experiment("million", data=str(data), task=echo, evaluators=[nonempty],
                         backend=backend, results_dir=work / "results", print_summary=False,
                         html_report=False, on_progress=lambda d, _all: done.__setitem__(0, d))
    took = time.monotonic() - start
    stop.set()
    phases.mark("gates, run_experiment returned")
    text = exp.format_summary()  # what print_summary=True (the default) prints
    phases.mark("summary")
    records = len(exp.to_dataframe(columns=["sid"]))
    phases.mark("read back (sid)")
    phases.report()
    print(text.splitlines()[0])
    print(json.dumps({"rows": rows, "backend": backend, "seconds": round(took, 1),
                      "rows_per_s": round(rows / took), "peak_rss_mb": round(phases.peak_mb),
                      # A local run's only child is `git rev-parse`: its figure is the
                      # RSS this process had when it forked, not a process of the run's.
                      **({"children_peak_mb": round(_peak_mb(resource.RUSAGE_CHILDREN))}
                         if backend != "local" else {}),
                      "sampled_peak_mb": round(peak[0]),
                      "results_mb": round(Path(str(exp.results_path)).stat().st_size / 1e6, 1),
                      "records": records}))


if __name__ == "__main__":
    main()
