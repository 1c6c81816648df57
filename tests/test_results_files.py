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
import pytest

from patronus_tasks import EvaluationResult, Row, TaskResult, evaluator, run_experiment, span, task
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


def test_the_merge_writes_the_dataset_order_a_window_at_a_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Records end out of order across many parts (a row's records apart, a row ending
    last, a sid the dataset lacks); the file has them in the dataset's order, written in
    windows of a few records, and each task's spans once."""
    import random

    from patronus_tasks.record import merge
    from patronus_tasks.record.parquet import ParquetSink, RowOrder
    from patronus_tasks.record.records import Record
    from patronus_tasks.trace.spans import SpanData, dump_spans

    monkeypatch.setattr(merge, "FIRST_WINDOW_ROWS", 5)
    monkeypatch.setattr(merge, "WINDOW_ROWS", 7)
    monkeypatch.setattr(merge, "MIN_WINDOW_ROWS", 1)
    sids = [str(i) for i in range(1, 61)]
    order = RowOrder(sids, [(0, "b"), (0, "a")])
    sink = ParquetSink(tmp_path, pd.DataFrame({"sid": sids, "n": range(60)}), batch_rows=4,
                       flush_seconds=3600, order=order)
    ended = sids[1:]
    random.Random(4).shuffle(ended)

    def record(sid: str, name: str) -> Record:
        spans = dump_spans([SpanData(f"{sid}-{name}", None, "lookup", "tool", 1.0, 2.0)])
        return Record(sid=sid, link_index=0, task_name="t", evaluator_name=name, row={"n": 0},
                      task_spans=spans)

    for sid in [*ended, "1"]:
        sink.add([record(sid, "a")])
        sink.add([record(sid, "b")])  # a record of its own: its own part, at times
    for sid, name in (("zz", "a"), ("zy", "a"), ("zz", "b")):  # sids the dataset lacks
        sink.add([record(sid, name)])
    final = sink.finalize({"project": "p"}, order)
    assert len(list((tmp_path / "parts").glob("*"))) == 0
    file = pq.ParquetFile(final.local)
    assert file.num_row_groups >= 123 // 7
    table = file.read()
    assert table["sid"].to_pylist() == [*[s for s in sids for _ in "ab"], "zy", "zz", "zz"]
    assert table["evaluator_name"].to_pylist() == [*["b", "a"] * 60, "a", "b", "a"]
    spans = pq.read_table(tmp_path / "spans.parquet")
    # The task's, once a row (from its first record), whichever window its records are in.
    assert spans["span_id"].to_pylist() == [*[f"{s}-b" for s in sids], "zy-a", "zz-b"]


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


# A nightly series read as one table: ten runs, each with data that used to give its
# columns other types (issue 49).
@task
def looked_up(row: Row) -> str | None:
    with span("lookup", kind="tool"):
        if row.evaluated_model_input == "none":
            return None
        if row.evaluated_model_input == "fail":
            raise RuntimeError("no answer")
    return str(row.evaluated_model_input)


@evaluator
def nonempty(evaluated_model_output: str) -> bool:
    return bool(evaluated_model_output)


def _series_datasets(tmp: Path) -> dict[str, Any]:
    """Each run's data: what the dataset's own columns hold differs run to run."""
    csv = tmp / "night.csv"
    csv.write_text("evaluated_model_input,n,note\nq1,1,\nq2,,\n")  # ints with a gap; no note
    parquet = tmp / "night.parquet"
    pq.write_table(pa.table({
        "evaluated_model_input": ["q1", "q2"], "n": pa.array([None, 4], pa.int64()),
        "note": pa.nulls(2, pa.string()),
        "evaluated_model_retrieved_context": pa.nulls(2, pa.list_(pa.string()))}), parquet)
    declared = pd.DataFrame({"evaluated_model_input": ["q1", "q2"],
                             "n": pd.array([None, None], dtype="Int64"),
                             "note": pd.array([None, None], dtype="string")})
    return {
        "full": [{"evaluated_model_input": "q1", "n": 1, "note": "x",
                  "evaluated_model_retrieved_context": ["p1", "p2"]}],
        "gaps": [{"evaluated_model_input": "q1", "n": 2, "note": None,
                  "evaluated_model_retrieved_context": None},
                 {"evaluated_model_input": "q2", "n": None, "note": None,
                  "evaluated_model_retrieved_context": None}],
        "csv": str(csv), "parquet": str(parquet), "declared": declared,
        "mixed": [{"evaluated_model_input": "q1", "note": 1}, {"evaluated_model_input": "q2",
                                                               "note": "two"}],
        "errors": [{"evaluated_model_input": "fail", "note": None}],
        "nones": [{"evaluated_model_input": "none", "note": None}],
    }


#: The types the dataset's columns have in every run that has them.
SERIES_TYPES = {"evaluated_model_input": pa.string(), "n": pa.int64(), "note": pa.string(),
                "evaluated_model_retrieved_context": pa.list_(pa.string())}


@pytest.fixture(scope="module")
def series(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Ten runs of project ``nightly``: the datasets above, an empty run and a resumed one
    (its kept rows merged with the rows it ran again)."""
    from patronus_tasks.record.parquet import ParquetSink

    tmp = tmp_path_factory.mktemp("series")
    root = tmp / "results"
    options: dict[str, Any] = {"task": looked_up, "evaluators": [nonempty], "backend": "local",
                               "results_dir": root, "print_summary": False, "html_report": False}
    for name, data in _series_datasets(tmp).items():
        run_experiment("nightly", data=data, experiment_name=name, **options)
    resumed = [{"evaluated_model_input": "q1", "n": 7}, {"evaluated_model_input": "fail"}]
    run_experiment("nightly", data=resumed, experiment_name="resumed", **options)
    run_experiment("nightly", data=resumed, experiment_name="resumed", retry_errors=True,
                   **{**options, "task": answer_again})  # the failed row runs again
    empty = ParquetSink(root / "nightly" / "empty", pd.DataFrame({"sid": ["1"], "n": [3]}))
    empty.finalize({"project": "nightly"})  # no row ended: a file with its columns only
    return root


@task
def answer_again(evaluated_model_input: str) -> str:
    return evaluated_model_input


def test_a_series_reads_as_one_table(series: Path) -> None:
    import pyarrow.dataset as ds

    files = sorted(series.glob("nightly/*/results.parquet"))
    assert len(files) == 10
    for f in files:
        schema = pq.read_schema(f)
        assert schema.names[:len(FIXED_SCHEMA)] == FIXED_SCHEMA.names, f
        for name in schema.names:
            want = FIXED_SCHEMA.field(name).type if name in FIXED_SCHEMA.names else SERIES_TYPES[name]
            assert schema.field(name).type == want, (f.parent.name, name, schema.field(name).type)
    records = sum(pq.read_metadata(f).num_rows for f in files)
    glob = f"{series}/nightly/*/results.parquet"
    with duckdb.connect() as con:
        whole = con.execute(f"SELECT * FROM read_parquet('{glob}', union_by_name=true)").df()
        assert len(whole) == records
        assert dict(con.execute(f"DESCRIBE SELECT n, note, task_started_at, pass FROM "
                                f"read_parquet('{glob}', union_by_name=true)").fetchall()[i][:2]
                    for i in range(4)) == {"n": "BIGINT", "note": "VARCHAR",
                                           "task_started_at": "DOUBLE", "pass": "BOOLEAN"}
        # The package's own columns need no union_by_name: the same in every file.
        fixed = ", ".join(f'"{n}"' for n in FIXED_SCHEMA.names)
        assert len(con.execute(f"SELECT {fixed} FROM read_parquet('{glob}')").fetchall()) == records
        kept = con.execute(f"SELECT n FROM read_parquet('{series}/nightly/resumed/results.parquet') "
                           "ORDER BY sid").fetchall()
        assert kept == [(7,), (None,)]  # whole numbers stay ints through a resume
    unified = pa.unify_schemas([pq.read_schema(f) for f in files])  # no type conflicts
    assert ds.dataset(files, schema=unified).to_table().num_rows == records
    assert ds.dataset(files).to_table(columns=FIXED_SCHEMA.names).num_rows == records


def test_a_series_spans_join_its_results(series: Path) -> None:
    """spans.parquet says where a span ran as the results do: its sid, repeat and link
    join them, and its times are seconds since the epoch as theirs."""
    glob = f"{series}/nightly/*/"
    with duckdb.connect() as con:
        spans = con.execute(f"SELECT count(*) FROM '{glob}spans.parquet'").fetchone()
        joined = con.execute(
            f"SELECT s.started_at - r.task_started_at, s.ended_at >= s.started_at FROM "
            f"read_parquet('{glob}spans.parquet', filename=true) s JOIN "
            f"read_parquet('{glob}results.parquet', union_by_name=true, filename=true) r "
            "ON s.sid = r.sid AND s.repeat IS NOT DISTINCT FROM r.repeat AND "
            "s.link_index = r.link_index AND parse_dirpath(s.filename) = parse_dirpath(r.filename)"
            ).fetchall()
    assert spans is not None and spans[0] >= 10  # a lookup in each row that ran its task
    assert len(joined) == spans[0]  # each on its record (one evaluator: one record a row)
    assert all(0 <= after < 5 and ordered for after, ordered in joined)
