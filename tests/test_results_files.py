"""The files an experiment writes: schema, manifest, readers, and crash safety."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from patronus_tasks import EvaluationResult, TaskResult, evaluator, run_experiment, task
from patronus_tasks.record.records import FIXED_SCHEMA

from .conftest import ROOT
from .waits import sids_written, until


@task
def answer(evaluated_model_input: str) -> TaskResult:
    if evaluated_model_input == "crash":
        raise RuntimeError("model crashed")
    return TaskResult(evaluated_model_output=evaluated_model_input[::-1], metadata={"n": [1, 2]},
                      tags={"kind": "reverse"}, evaluated_model_name="rev-1")


@evaluator(criteria="is a palindrome")
def palindrome(evaluated_model_output: str) -> EvaluationResult:
    ok = evaluated_model_output == evaluated_model_output[::-1]
    return EvaluationResult(pass_=ok, score_raw=float(ok), explanation="mirror",
                            metadata={"checked": True}, tags={"t": "x"}, evaluation_duration=0.25)


DATA = [
    {"evaluated_model_input": "abba", "pass": "dataset column named pass", "ctx": ["a", "b"],
     "mixed": 1},
    {"evaluated_model_input": "abc", "pass": "p2", "ctx": [], "mixed": "two"},
    {"evaluated_model_input": "crash", "pass": "p3", "ctx": ["c"], "mixed": None},
]


def m_started(path: Path) -> float:
    """When the run started, as its manifest says (epoch seconds)."""
    started = json.loads((path.parent / "manifest.json").read_text())["started_at"]
    return dt.datetime.fromisoformat(started).timestamp()


def test_every_column_and_the_manifest_with_pyarrow_alone(results_dir: Path) -> None:
    exp = run_experiment("files", data=DATA, task=answer, evaluators=[palindrome],
                         tags={"suite": "s"}, experiment_name="cols", backend="local",
                         results_dir=results_dir, print_summary=False)
    path = results_dir / "files" / "cols" / "results.parquet"
    assert exp.results_path == path and not (path.parent / "parts").exists()
    table = pq.read_table(path)
    assert table.schema.names == [*FIXED_SCHEMA.names, "evaluated_model_input", "row_pass", "ctx",
                                  "mixed"]
    for name in FIXED_SCHEMA.names:
        assert table.schema.field(name).type == FIXED_SCHEMA.field(name).type, name
    rows = {r["sid"]: r for r in table.to_pylist()}
    ok = rows["1"]
    assert ok == {
        "sid": "1", "link_index": 0, "repeat": None, "task_name": "answer",
        "evaluator_name": "palindrome",
        "criteria": "is a palindrome", "weight": None, "status": "ok", "error_stage": None,
        "pass": True,
        "score": 1.0, "text_output": None, "explanation": "mirror",
        "evaluation_duration_s": 0.25, "task_duration_s": ok["task_duration_s"],
        "task_output": "abba", "task_metadata": '{"evaluated_model_name": "rev-1", "n": [1, 2]}',
        "task_tags": '{"kind": "reverse"}', "evaluation_metadata": '{"checked": true}',
        "evaluation_tags": '{"t": "x"}', "task_attempts": 1, "evaluation_attempts": 1,
        "host": socket.gethostname(),
        # a call made, reporting no model or tokens: no cost known, not cached
        "task_model": None, "task_input_tokens": None, "task_output_tokens": None,
        "task_cost_usd": None, "task_cached": False, "evaluation_model": None,
        "evaluation_input_tokens": None, "evaluation_output_tokens": None,
        "evaluation_cost_usd": None, "evaluation_cached": False, "error_type": None,
        "error_message": None, "error_traceback": None,
        "task_spans": None, "task_started_at": ok["task_started_at"],  # no span opened
        "evaluation_started_at": ok["evaluation_started_at"], "evaluation_spans": None,
        "evaluated_model_input": "abba",
        "row_pass": "dataset column named pass", "ctx": ["a", "b"], "mixed": "1",
    }
    assert ok["task_duration_s"] >= 0
    assert m_started(path) <= ok["task_started_at"] <= ok["evaluation_started_at"] <= time.time()
    assert rows["2"]["pass"] is False and rows["2"]["mixed"] == "two"
    crash = rows["3"]
    assert (crash["status"], crash["error_stage"], crash["error_type"]) == ("error", "task",
                                                                           "RuntimeError")
    assert crash["evaluator_name"] is None and "model crashed" in crash["error_traceback"]
    kv = json.loads(table.schema.metadata[b"patronus_tasks"])
    manifest = json.loads((path.parent / "manifest.json").read_text())
    for m in (kv, manifest):
        assert m["project"] == "files" and m["experiment_name"] == "cols"
        assert m["tags"] == {"suite": "s"} and m["rows"] == 3 and m["task_errors"] == 1
        assert m["evaluator_errors"] == 0 and m["flow_run_id"] is None
        assert len(m["dataset"]["sha256"]) == 64 and m["package_version"] == "0.1.0"
        assert m["started_at"] <= m["ended_at"]
        assert m["links"] == [{"task": "answer", "evaluators": [
            {"name": "palindrome", "criteria": "is a palindrome"}]}]
    assert manifest["status"] == "completed" and len(manifest["experiment_id"]) == 32
    # Readers with no help from this package.
    assert len(pd.read_parquet(path)) == 3
    with duckdb.connect() as con:
        assert con.execute(f"SELECT count(*) FROM '{path}' WHERE pass").fetchall() == [(1,)]


KILLED = """
import sys, time
from patronus_tasks import evaluator, run_experiment, task

markers = open(sys.argv[2], "a", buffering=1)

@task
def work(row):
    if int(row.sid) > 12:
        time.sleep(600)  # these rows are still running when the process is killed
    return "out-" + row.sid

@evaluator
def done(row, task_result) -> bool:
    markers.write(row.sid + "\\n")
    return True

run_experiment("crash", data=[{"i": i} for i in range(20)], task=work, evaluators=[done],
               experiment_name="killed", backend="local", results_dir=sys.argv[1],
               max_concurrency=4)
"""


def test_sigkill_keeps_every_completed_row(tmp_path: Path) -> None:
    markers = tmp_path / "markers.txt"
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(tmp_path / "results"), str(markers)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    out_dir = tmp_path / "results" / "crash" / "killed"
    # Rows 1-12 complete, 13-16 hang: killed once the twelfth record is on disk.
    until(lambda: len(sids_written(out_dir)) >= 12 or proc.poll() is not None,
          "12 rows written", timeout=120)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL, proc.stderr.read() if proc.stderr else ""
    completed = sorted(markers.read_text().split(), key=int)
    assert completed == [str(i) for i in range(1, 13)]
    assert not (out_dir / "results.parquet").exists()
    on_disk = _read_unfinished(out_dir)
    assert sorted(on_disk["sid"], key=int) == completed  # each completed row, exactly once
    assert set(on_disk["task_output"]) == {f"out-{s}" for s in completed}
    manifest = json.loads((out_dir / "manifest.json").read_text())
    assert manifest["status"] == "running"  # it never got to say otherwise


def _read_unfinished(out_dir: Path) -> pd.DataFrame:
    """Parts with pyarrow, journals (JSON lines, the schema first) with json."""
    tables: list[Any] = [pq.read_table(p) for p in sorted((out_dir / "parts").glob("*.parquet"))]
    for journal in sorted((out_dir / "parts").glob("*.journal")):
        lines = [json.loads(line) for line in journal.read_text().splitlines()]
        assert "arrow_schema" in lines[0]
        tables.append(pa.Table.from_pylist([r for row in lines[1:] for r in row]))
    frame = pa.concat_tables(tables, promote_options="permissive").to_pandas()
    # Our own reader gives the same rows.
    from patronus_tasks.results import load_experiment

    ours = load_experiment(out_dir).to_dataframe()
    assert sorted(ours["sid"]) == sorted(frame["sid"])
    return frame


def test_journal_recovers_types_json_cannot_keep(tmp_path: Path) -> None:
    import datetime as dt

    from patronus_tasks.record.parquet import ParquetSink, read_results
    from patronus_tasks.record.records import Record

    df = pd.DataFrame({"sid": ["1", "2"], "when": pd.to_datetime(["2026-01-01", "2026-02-03"]),
                       "blob": [b"\x00\x01", b"\xff"], "n": [1, 2]})
    sink = ParquetSink(tmp_path, df, batch_rows=10_000, flush_seconds=3600)
    for row in df.to_dict("records"):
        sink.add([Record(sid=row["sid"], link_index=0, status="ok",
                         row={"when": row["when"], "blob": row["blob"], "n": row["n"]})])
    # No flush, no finalize: as if the process died here.
    table = read_results(tmp_path)
    assert table.schema.field("when").type == sink.schema.field("when").type
    back = table.to_pylist()
    assert [r["when"] for r in back] == [dt.datetime(2026, 1, 1), dt.datetime(2026, 2, 3)]
    assert [r["blob"] for r in back] == [b"\x00\x01", b"\xff"] and [r["n"] for r in back] == [1, 2]


def test_writers_checking_one_folder_at_once_do_not_trip_each_other(tmp_path: Path) -> None:
    """Dask workers start their batches together: each checks the parts folder is
    writable, and one's check must not delete the other's probe (CI caught it once)."""
    from concurrent.futures import ThreadPoolExecutor

    from patronus_tasks.record.parquet import make_writable

    def check_often(_: int) -> None:
        for _ in range(300):
            make_writable(tmp_path / "parts")

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(check_often, range(4)))
    assert list((tmp_path / "parts").iterdir()) == []
