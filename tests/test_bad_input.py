"""Every bad input of issue 7, table-driven: each gives an error naming what, where and
the fix, before any model call where it can be known in advance. And property-based
round trips of generated datasets through an experiment and its Parquet."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from patronus_tasks import (
    ConfigError,
    Row,
    TaskResult,
    evaluator,
    run_experiment,
    task,
)

CALLS: list[str] = []


@task
def model(evaluated_model_input: str, row: Row) -> str:
    CALLS.append(row.sid)
    return evaluated_model_input


@evaluator
def ok(row: Row) -> bool:
    return True


def _file(tmp: Path, name: str, text: str) -> Path:
    path = tmp / name
    path.write_text(text)
    return path


SETUP_ERRORS: list[tuple[str, Any, list[str]]] = [
    ("missing file", lambda t: {"data": t / "nope.jsonl", "task": model},
     ["nope.jsonl", "no such dataset file"]),
    ("unknown format", lambda t: {"data": _file(t, "d.txt", "x"), "task": model},
     ["d.txt", "unknown dataset format '.txt'", "Use .csv, .jsonl"]),
    ("empty dataset", lambda t: {"data": _file(t, "e.jsonl", "\n"), "task": model},
     ["e.jsonl", "is empty"]),
    ("missing column", lambda t: {"data": [{"question": "q"}], "task": model},
     ["task 'model'", "needs column 'evaluated_model_input'", "evaluated_model_input_field="]),
    ("duplicate ids", lambda t: {"data": _file(t, "dup.csv", "sid,evaluated_model_input\na,1\na,2\n"),
                                 "task": model},
     ["dup.csv", "duplicate sample ids ['a']", "Sample ids must be unique"]),
    ("missing ids", lambda t: {"data": [{"sid": "a", "evaluated_model_input": "x"},
                                        {"sid": None, "evaluated_model_input": "y"}], "task": model},
     ["rows at positions [1] have no 'sid'"]),
    ("rows not dicts", lambda t: {"data": ["a", "b"], "task": model},
     ["data is a list, but row 0 is a str ('a'), not a dict", "give each row as a dict"]),
    ("link without steps", lambda t: {"data": [{"x": 1}], "chain": [{"evaluators": []}]},
     ["chain link 0 has neither a task nor evaluators"]),
    ("chain and evaluators", lambda t: {"data": [{"x": 1}], "evaluators": [ok],
                                        "chain": [{"evaluators": [ok]}]},
     ["pass either task=/evaluators= or chain=, not both"]),
    ("unwritable results", lambda t: {"data": [{"x": 1}], "evaluators": [ok],
                                      "results_dir": _file(t, "a-file", "") / "sub"},
     ["is not writable", "results_dir="]),
    ("bad gate", lambda t: {"data": [{"x": 1}], "evaluators": [ok], "fail_on_error": 1.5},
     ["fail_on_error must be a row count"]),
]


@pytest.mark.parametrize(("case", "make", "words"), SETUP_ERRORS, ids=[c[0] for c in SETUP_ERRORS])
def test_setup_errors_before_any_call(tmp_path: Path, case: str, make: Any,
                                      words: list[str]) -> None:
    CALLS.clear()
    kwargs = {"results_dir": tmp_path / "r", "backend": "local", "print_summary": False,
              **make(tmp_path)}
    with pytest.raises(ConfigError) as err:
        run_experiment("bad", **kwargs)
    for word in words:
        assert word in str(err.value), (case, str(err.value))
    assert CALLS == []


def test_unknown_parameter_names_it_and_the_fix() -> None:
    with pytest.raises(ConfigError) as err:
        @evaluator
        def judge(answer: str) -> bool:
            return True
    assert "'answer'" in str(err.value) and "allowed names are" in str(err.value)
    assert "task_result" in str(err.value)


@task
def returns_bad(row: Row) -> Any:
    if row.sid == "1":
        return TaskResult(evaluated_model_output="x", metadata={"f": {1, 2}})
    if row.sid == "2":
        return TaskResult(evaluated_model_output="x", tags={"n": 3})
    if row.sid == "5":
        return TaskResult(output="x")  # type: ignore[call-arg]  # other tools' name
    return "fine"


@evaluator
def bad_type(row: Row) -> Any:
    return [1, 2] if row.sid == "3" else True


def test_row_level_errors_name_row_field_and_fix(tmp_path: Path) -> None:
    data = [{"evaluated_model_input": "a"}, {"evaluated_model_input": "b"},
            {"evaluated_model_input": "c"}, {"evaluated_model_input": None},
            {"evaluated_model_input": "e"}]

    @task
    def needs_input(evaluated_model_input: str, row: Row) -> Any:
        return returns_bad.fn(row)

    exp = run_experiment("bad-rows", data=data, task=needs_input, evaluators=[bad_type],
                         backend="local", results_dir=tmp_path, print_summary=False)
    df = exp.to_dataframe().set_index("sid")
    assert "metadata must be JSON-serialisable" in df.loc["1", "error_message"]
    assert "tags must map str to str" in df.loc["2", "error_message"]
    assert "Convert with str()" in df.loc["2", "error_message"]
    assert df.loc["3", "error_type"] == "InvalidResultError"
    assert "not list" in df.loc["3", "error_message"]
    assert "row sid=4: field 'evaluated_model_input' is empty" in df.loc["4", "error_message"]
    assert "give the parameter a default" in df.loc["4", "error_message"]
    assert "as evaluated_model_output=..., not output=" in df.loc["5", "error_message"]
    assert exp.manifest["rows"] == 5 and exp.manifest["errored_rows"] == 5


def _rows_strategy() -> Any:
    from hypothesis import strategies as st

    text = st.text(st.characters(blacklist_categories=["Cs"]), max_size=60)
    meta = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | text,
                        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
                        max_leaves=8)
    return st.lists(st.fixed_dictionaries({
        "evaluated_model_input": text | st.text(min_size=2000, max_size=4000),
        "note": text, "meta": meta.map(json.dumps)}), min_size=1, max_size=6)


def test_round_trip_through_experiment_and_parquet(tmp_path: Path) -> None:
    # Hypothesis is imported here, not at the module's top: every test process collects
    # every module, and its import costs ~1.4 s of CPU in each.
    from hypothesis import HealthCheck, given, settings

    # Long inputs on purpose (2,000-4,000 characters): hypothesis' size and speed checks,
    # which trip when the machine is busy (tests run two at a time), are not the point here.
    @settings(max_examples=25, deadline=None,
              suppress_health_check=[HealthCheck.data_too_large, HealthCheck.too_slow])
    @given(rows=_rows_strategy())
    def round_trip(rows: list[dict[str, Any]]) -> None:
        _round_trip(tmp_path, rows)

    round_trip()


def _round_trip(tmp_path: Path, rows: list[dict[str, Any]]) -> None:
    @task
    def echo(evaluated_model_input: str, row: Row) -> TaskResult:
        return TaskResult(evaluated_model_output=evaluated_model_input,
                          metadata={"meta": json.loads(row.meta)}, tags={"note": row.note})

    @evaluator
    def same(evaluated_model_output: str, row: Row) -> bool:
        return evaluated_model_output == row.evaluated_model_input

    results = tmp_path / f"r{os.getpid()}-{abs(hash(json.dumps(rows))) % 10**9}"
    exp = run_experiment("prop", data=rows, task=echo, evaluators=[same], backend="local",
                         results_dir=results, print_summary=False)
    df = exp.to_dataframe().sort_values("sid", key=lambda s: s.astype(int))
    assert df["pass"].all() and len(df) == len(rows)
    for got, want in zip(df.to_dict("records"), rows, strict=True):
        assert got["task_output"] == want["evaluated_model_input"]
        assert got["evaluated_model_input"] == want["evaluated_model_input"]
        assert got["note"] == want["note"]
        assert json.loads(got["task_metadata"]) == {"meta": json.loads(want["meta"])}
        assert json.loads(got["task_tags"]) == {"note": want["note"]}


UNANSWERED = """
from patronus_tasks import evaluator, run_experiment

@evaluator
def nonempty(evaluated_model_output: str) -> bool:
    return bool(evaluated_model_output)

exp = run_experiment("nowhere", data=[{"evaluated_model_output": "x"}], evaluators=[nonempty],
                     print_summary=False)
print("results", exp.to_dataframe()["pass"].tolist(), flush=True)
"""


@pytest.mark.heavy
def test_a_prefect_api_that_answers_nothing_is_said_in_our_terms(tmp_path: Path) -> None:
    # A PREFECT_API_URL where nothing listens: the results are written at once; the flow
    # run is given up on after a while, in one line that names the URL and the fixes.
    import socket
    import subprocess
    import sys

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/api"
    env = {**os.environ, "PREFECT_API_URL": url,
           "PATRONUS_TASKS_RECORDER_UNANSWERED_SECONDS": "3"}  # 30 by default
    out = subprocess.run([sys.executable, "-c", UNANSWERED], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "results [True]" in out.stdout, out.stderr[-2000:]
    said = [line for line in out.stderr.splitlines() if "did not answer" in line]
    assert len(said) == 1 and url in said[0] and "did not answer for 3 s" in said[0], out.stderr
    assert "`patronus-tasks server up`" in said[0] and "unset PREFECT_API_URL" in said[0]
    assert "RuntimeError" not in out.stderr and "Traceback" not in out.stderr
    assert "Prefect did not record 1 task runs" in out.stderr


def test_a_recorder_setting_that_is_no_number_of_seconds_is_said_before_any_row(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATRONUS_TASKS_RECORDER_STALL_SECONDS", "soon")
    with pytest.raises(ConfigError, match=r"PATRONUS_TASKS_RECORDER_STALL_SECONDS='soon' is "
                                          r"not a number of seconds.*above 0.*or unset it"):
        run_experiment("impatient", data=[{"evaluated_model_input": "x"}], task=model,
                       evaluators=[ok], results_dir=tmp_path, print_summary=False)
    assert not list(tmp_path.rglob("results.parquet"))


def test_a_closed_stdout_never_fails_a_finished_run(tmp_path: Path) -> None:
    """A worker killed mid-run leaves its flow run writing to a closed pipe: the summary's
    BrokenPipeError ended a completed night Crashed (and Python's flush at exit, status 120)."""
    import subprocess
    import sys

    script = tmp_path / "night.py"
    script.write_text(
        "import time\nfrom patronus_tasks import evaluator, run_experiment\n"
        "@evaluator\ndef ok(evaluated_model_output: str) -> bool:\n    return True\n"
        "time.sleep(1)  # the reader is gone by now\n"
        f"run_experiment('p', data=[{{'evaluated_model_output': 'a'}}], evaluators=[ok],\n"
        f"               backend='local', results_dir={str(tmp_path / 'r')!r}, html_report=False)\n"
        f"open({str(tmp_path / 'done')!r}, 'w').write('ok')\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=tmp_path)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    proc.stderr.close()  # both ends gone, as with a dead worker
    assert proc.wait(120) == 0
    assert (tmp_path / "done").read_text() == "ok"


def test_console_lines_a_stream_cannot_encode_are_no_gone_reader() -> None:
    """Only a closed or broken stream is swapped for /dev/null: a text the terminal
    cannot encode still fails loudly, the user's own prints unharmed."""
    import io
    import sys

    from patronus_tasks.run import background

    ascii_out = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    with pytest.raises(UnicodeEncodeError):
        background.console_print("50% → 75%", ascii_out)
    closed = io.StringIO()
    closed.close()
    background.console_print("gone", closed)  # nothing raised
    assert not sys.stdout.closed


def test_a_signal_names_only_the_interrupt_it_caused() -> None:
    import asyncio

    from patronus_tasks.prefect.runs.orchestrate import _stopped_by
    from patronus_tasks.run import background

    background.stopped_by[:] = ["SIGTERM"]
    try:
        assert _stopped_by(asyncio.CancelledError()) == "stopped by SIGTERM"
        assert _stopped_by(ValueError("boom")) == "stopped by ValueError: boom"
    finally:
        background.stopped_by.clear()
    assert _stopped_by(KeyboardInterrupt()) == "stopped by Ctrl-C"
