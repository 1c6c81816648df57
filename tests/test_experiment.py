"""Experiments end to end with the local backend (the same row logic Prefect runs)."""

from __future__ import annotations

import asyncio
import io
import json
import threading
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from patronus_tasks import (
    Client,
    ConfigError,
    EvaluationResult,
    Parent,
    Row,
    TaskResult,
    evaluator,
    run_experiment,
    task,
)

DATA = [
    {"evaluated_model_input": "a", "evaluated_model_output": "A!", "topic": "x"},
    {"evaluated_model_input": "bb", "evaluated_model_output": "BB!", "topic": "y"},
    {"evaluated_model_input": "ccc", "evaluated_model_output": "ccc", "topic": "x"},
]


def run(results_dir: Path, **kwargs: Any) -> pd.DataFrame:
    kwargs.setdefault("data", DATA)
    kwargs.setdefault("backend", "local")
    exp = run_experiment("proj", results_dir=results_dir, print_summary=False, **kwargs)
    return exp.to_dataframe().sort_values(["sid", "link_index", "evaluator_name"],
                                          na_position="first").reset_index(drop=True)


@evaluator
def shouts(evaluated_model_output: str) -> bool:
    return evaluated_model_output.endswith("!")


def test_taskless_experiment_evaluates_the_dataset_outputs(results_dir: Path) -> None:
    seen: list[Any] = []

    @evaluator
    def my_evaluator(row: Row, task_result: TaskResult) -> bool:
        seen.append(task_result)
        output = row.evaluated_model_output if task_result is None else task_result.evaluated_model_output
        return output.endswith("!")

    df = run(results_dir, evaluators=[my_evaluator, shouts])
    assert seen == [None, None, None]
    assert df["pass"].tolist() == [True, True, True, True, False, False]
    assert df["task_name"].isna().all() and (df["status"] == "ok").all()
    assert df["topic"].tolist() == ["x", "x", "y", "y", "x", "x"]  # dataset columns kept


def test_task_output_reaches_evaluators_and_is_recorded(results_dir: Path) -> None:
    @task
    def exclaim(evaluated_model_input: str, tags: dict[str, str]) -> TaskResult:
        return TaskResult(evaluated_model_output=evaluated_model_input.upper() + tags["mark"],
                          metadata={"len": len(evaluated_model_input)}, tags={"t": "1"},
                          evaluated_model_name="m1")

    df = run(results_dir, task=exclaim, evaluators=[shouts], tags={"mark": "?"})
    assert df["task_output"].tolist() == ["A?", "BB?", "CCC?"]
    assert df["pass"].tolist() == [False] * 3
    assert json.loads(df["task_metadata"][1]) == {"evaluated_model_name": "m1", "len": 2}
    assert json.loads(df["task_tags"][0]) == {"t": "1"}
    assert (df["task_duration_s"] >= 0).all() and (df["task_attempts"] == 1).all()
    assert (df["evaluation_attempts"] == 1).all()


def test_chain_passes_parent_and_none_stops_the_row(results_dir: Path) -> None:
    parents: dict[str, Parent] = {}

    @task
    def first(row: Row) -> str | None:
        return None if row.evaluated_model_input == "bb" else row.evaluated_model_input * 2

    @evaluator(name="long")
    def long_enough(task_result: TaskResult) -> EvaluationResult:
        return EvaluationResult(pass_=len(task_result.evaluated_model_output) > 2, score_raw=0.5)

    @task
    def second(row: Row, parent: Parent) -> str:
        parents[row.sid] = parent
        verdict = parent.find_eval_result("long")
        return f"{parent.task.evaluated_model_output}:{verdict.pass_}"

    @task
    def third(parent: Parent) -> str:
        assert parent.parent is not None and parent.parent.task is not None
        return parent.parent.task.evaluated_model_output + "|" + parent.task.evaluated_model_output

    @evaluator
    def echo(task_result: TaskResult) -> str:
        return task_result.evaluated_model_output

    df = run(results_dir, chain=[
        {"task": first, "evaluators": [long_enough]},
        {"task": second, "evaluators": [echo]},
        {"task": third},
    ])
    by = {(r.sid, r.link_index): r for r in df.itertuples()}
    assert by[("1", 1)].text_output == "aa:False" and by[("3", 1)].text_output == "cccccc:True"
    assert by[("1", 2)].task_output == "aa|aa:False" and by[("1", 2)].status == "ok"
    assert by[("2", 0)].status == "skipped" and pd.isna(by[("2", 0)].evaluator_name)
    assert not any(sid == "2" and link > 0 for sid, link in by)  # chain stopped
    assert "2" not in parents
    assert parents["1"].evals["long"] == EvaluationResult(pass_=False, score_raw=0.5)
    assert parents["1"].find_eval_result(long_enough) == parents["1"].evals["long"]


def test_chain_without_a_top_level_task(results_dir: Path) -> None:
    @evaluator
    def has_output(evaluated_model_output: str) -> bool:
        return bool(evaluated_model_output)

    @task
    def summarise(parent: Parent, evaluated_model_output: str) -> str:
        return f"{evaluated_model_output}={parent.evals['has_output'].pass_}"

    df = run(results_dir, chain=[{"evaluators": [has_output]}, {"task": summarise}])
    assert df[df.link_index == 1]["task_output"].tolist() == ["A!=True", "BB!=True", "ccc=True"]


def test_failures_are_data_and_other_rows_finish(results_dir: Path) -> None:
    @task
    def flaky(evaluated_model_input: str) -> Any:
        if evaluated_model_input == "a":
            raise KeyError("no such model")
        if evaluated_model_input == "bb":
            return 123  # not a valid return type
        return evaluated_model_input

    @evaluator
    def broken(evaluated_model_output: str) -> bool:
        raise ZeroDivisionError("judge divided by zero")

    @evaluator
    def weird(evaluated_model_output: str) -> Any:
        return {"not": "allowed"}

    df = run(results_dir, task=flaky, evaluators=[broken, shouts, weird])
    task_err = df[df.error_stage == "task"].set_index("sid")
    assert task_err.loc["1", "error_type"] == "KeyError"
    assert "no such model" in task_err.loc["1", "error_message"]
    assert "Traceback" in task_err.loc["1", "error_traceback"]
    assert task_err.loc["2", "error_type"] == "InvalidResultError"
    assert "not int" in task_err.loc["2", "error_message"]
    ok = df[df.sid == "3"].set_index("evaluator_name")
    assert ok.loc["broken", "error_type"] == "ZeroDivisionError"
    assert ok.loc["shouts", "pass"] == False  # noqa: E712
    assert ok.loc["weird", "error_type"] == "InvalidResultError"
    assert "not dict" in ok.loc["weird", "error_message"]


def test_retries_and_timeouts_locally(results_dir: Path) -> None:
    calls: dict[str, int] = {}

    @task(retries=2, retry_delay_seconds=0)
    def flaky(row: Row) -> str:
        calls[row.sid] = calls.get(row.sid, 0) + 1
        if calls[row.sid] < 3:
            raise ConnectionError("try again")
        return "ok"

    @evaluator(timeout_seconds=0.2)
    async def slow(row: Row) -> bool:
        import asyncio

        await asyncio.sleep(5 if row.sid == "2" else 0)
        return True

    df = run(results_dir, task=flaky, evaluators=[slow])
    assert calls == {"1": 3, "2": 3, "3": 3}
    assert df["task_output"].tolist() == ["ok"] * 3
    assert df.set_index("sid").loc["2", "error_type"] == "TimeoutError"
    assert df.set_index("sid").loc["1", "pass"] == True  # noqa: E712


def test_max_concurrency_bounds_calls_in_flight(results_dir: Path) -> None:
    # Calls go on in fours (a barrier): a fifth in flight would be seen while four wait,
    # and fewer than four would never pass.
    lock, active, peak = threading.Lock(), [0], [0]
    fours = threading.Barrier(4, timeout=30)

    @task
    def held(row: Row) -> str:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        fours.wait()
        with lock:
            active[0] -= 1
        return "x"

    data = [{"evaluated_model_input": str(i)} for i in range(24)]
    df = run(results_dir, data=data, task=held, max_concurrency=4)
    assert df["status"].eq("ok").all() and peak[0] == 4


def test_exports_and_summary(results_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    @evaluator
    def score_only(evaluated_model_output: str) -> float:
        return len(evaluated_model_output) / 4

    exp = Client(results_dir=results_dir, backend="local").experiment(
        "proj", data=DATA, evaluators=[shouts, score_only], experiment_name="sum")
    out = capsys.readouterr().out
    assert "shouts [link 0]" in out and "score_only [link 0]" in out
    assert out.index("shouts [link 0]") < out.index("score_only [link 0]")
    assert "Pass rate : 66.7%  (2/3)" in out
    assert str(exp.results_path) in out
    csv = pd.read_csv(io.StringIO(exp.to_csv()))
    assert len(csv) == 6 and "score" in csv.columns
    lines = exp.to_json().strip().splitlines()
    assert len(lines) == 6 and "pass" in json.loads(lines[0])
    summary = exp.summary()
    score_stats = summary.evaluators[1]
    assert score_stats.pass_rate is None and score_stats.scores["max"] == 0.75
    assert sum(c for _, _, c in score_stats.histogram) == 3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"evaluators": [shouts], "chain": [{"evaluators": [shouts]}]}, "not both"),
        ({"chain": [{"task": None}]}, "neither a task nor evaluators"),
        ({"chain": [{"evaluators": [shouts, shouts]}]}, "more than once"),
        ({"evaluators": [lambda row: True]}, "is not an evaluator"),
        ({"evaluators": [shouts], "max_concurrency": 0}, "max_concurrency"),
        ({"evaluators": [shouts], "tags": {"a": 1}}, "tags must map str to str"),
        ({"evaluators": [shouts], "backend": "cloud"}, "backend must be one of 'prefect'"),
        ({"evaluators": [shouts], "dask_address": "tcp://127.0.0.1:1"},
         "dask_address= is for backend='dask'"),
        ({"evaluators": [shouts], "max_concurency": 4},
         "unknown experiment option 'max_concurency'. Did you mean 'max_concurrency'"),
    ],
)
def test_setup_mistakes_are_config_errors(results_dir: Path, kwargs: dict[str, Any],
                                          message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        run(results_dir, **kwargs)


def test_on_progress_sees_every_row_of_this_run(results_dir: Path) -> None:
    seen: list[tuple[int, int]] = []
    Client(results_dir=results_dir, backend="local").experiment(
        "proj", data=[{"evaluated_model_output": f"{i}!"} for i in range(5)], evaluators=shouts,
        print_summary=False,
        on_progress=lambda done, rows: seen.append((done, rows)))
    assert seen == [(i, 5) for i in range(1, 6)]


def test_dask_without_a_server_it_can_reach_is_a_config_error(results_dir: Path) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(restore_defaults={PREFECT_API_URL}), \
            pytest.raises(ConfigError, match="set PREFECT_API_URL"):
        run_experiment("proj", data=[{"x": 1}], evaluators=[shouts], backend="dask",
                       results_dir=results_dir)


def test_missing_column_fails_before_any_call_and_empty_field_fails_its_row(
        results_dir: Path) -> None:
    called: list[str] = []

    @task
    def needs_prompt(evaluated_model_system_prompt: str, row: Row) -> str:
        called.append(row.sid)
        return "x"

    with pytest.raises(ConfigError) as err:
        run(results_dir, task=needs_prompt)
    assert "needs column 'evaluated_model_system_prompt'" in str(err.value)
    assert called == []
    data = [{"evaluated_model_system_prompt": "s"}, {"evaluated_model_system_prompt": None}]
    df = run(results_dir, data=data, task=needs_prompt)
    assert called == ["1"]
    row2 = df.set_index("sid").loc["2"]
    assert row2["error_type"] == "DatasetError"
    assert "row sid=2: field 'evaluated_model_system_prompt' is empty" in row2["error_message"]


def test_same_name_twice_keeps_both_runs(results_dir: Path) -> None:
    a = run_experiment("p", data=DATA, evaluators=[shouts], experiment_name="../../escape",
                       backend="local", results_dir=results_dir, print_summary=False)
    b = run_experiment("p", data=DATA, evaluators=[shouts], experiment_name="../../escape",
                       backend="local", results_dir=results_dir, print_summary=False)
    assert a.path != b.path and a.results_path.exists() and b.results_path.exists()
    assert results_dir.resolve() in a.path.parents and b.path.name == a.path.name + "-2"
    assert a.name == "../../escape"


FINISHED: list[str] = []


@task
async def slower_first(row: Row) -> str:
    await asyncio.sleep(0.002 * (20 - int(row.sid)))  # the first rows finish last
    FINISHED.append(row.sid)
    return row.sid


@evaluator
def second(row: Row) -> bool:
    return True


@evaluator
def first(row: Row) -> bool:
    return True


def test_rows_are_kept_in_the_dataset_order_not_the_order_they_finished(results_dir: Path) -> None:
    exp = run_experiment("ordered", data=[{"x": i} for i in range(20)], task=slower_first,
                         evaluators=[second, first], results_dir=results_dir, backend="local",
                         print_summary=False, max_concurrency=8)
    df = exp.to_dataframe()
    assert FINISHED[-20:] != [str(i) for i in range(1, 21)]  # they did finish out of order
    assert df["sid"].tolist() == [str(i) for i in range(1, 21) for _ in range(2)]
    assert df["evaluator_name"].tolist() == ["second", "first"] * 20  # as the chain says


def test_repeats_are_kept_together_under_their_row(results_dir: Path) -> None:
    exp = run_experiment("ordered-repeats", data=[{"x": i} for i in range(6)], task=slower_first,
                         evaluators=[first], repeats=3, results_dir=results_dir, backend="local",
                         print_summary=False, max_concurrency=8)
    df = exp.to_dataframe()
    assert df["sid"].tolist() == [str(i) for i in range(1, 7) for _ in range(3)]
    assert df["repeat"].tolist() == [1, 2, 3] * 6


def test_the_summary_says_what_the_errors_were_most_frequent_first(
        results_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The console shows why rows failed, not only how many (the SDK printed each)."""
    @task
    def answer(evaluated_model_input: str) -> str:
        if evaluated_model_input != "a":
            raise RuntimeError(f"model API 500\n(body for {evaluated_model_input})")
        return "A!"

    @evaluator
    def picky(evaluated_model_output: str) -> bool:
        raise ValueError("no verdict for " + evaluated_model_output)

    run_experiment("proj", data=DATA, task=answer, evaluators=[shouts, picky],
                   backend="local", results_dir=results_dir)
    out = capsys.readouterr().out
    lines = out[out.index("Errors, most frequent first"):].splitlines()
    assert lines[1] == "  2 x task 'answer': RuntimeError: model API 500  (first: sid 2)"
    assert lines[2] == "  1 x evaluator 'picky': ValueError: no verdict for A!  (first: sid 1)"
    assert lines[3].startswith("Results: ")


def test_a_timeout_raised_by_the_steps_own_code_keeps_its_message(results_dir: Path) -> None:
    """A socket's TimeoutError is the code's error, with its message and traceback; only
    a ``timeout_seconds`` that ran out is said as the step's timeout."""
    @task
    def answer(evaluated_model_input: str) -> str:
        raise TimeoutError("read timed out from api.example.com after 30 s")

    @task(timeout_seconds=0.05)
    async def slow(evaluated_model_input: str) -> str:
        await asyncio.sleep(5)
        return "late"

    df = run(results_dir, data=DATA[:1], task=answer, evaluators=[shouts])
    assert df["error_message"].iloc[0] == "read timed out from api.example.com after 30 s"
    assert "raise TimeoutError" in df["error_traceback"].iloc[0]
    df = run(results_dir, data=DATA[:1], task=slow, evaluators=[shouts])
    assert df["error_message"].iloc[0] == "task 'slow' timed out after 0.05 s"


def test_an_evaluator_that_errored_on_every_row_passed_none_of_them(results_dir: Path) -> None:
    """Errors count as not passed: all errors is 0%, as `compare` counts it, not "-"."""
    @evaluator
    def broken(evaluated_model_output: str) -> bool:
        raise RuntimeError("down")

    @evaluator
    def length(evaluated_model_output: str) -> float:
        return len(evaluated_model_output) / 10

    exp = run_experiment("proj", data=DATA, evaluators=[broken, length], backend="local",
                         results_dir=results_dir, print_summary=False)
    rates = {s.evaluator: s.pass_rate for s in exp.summary().evaluators}
    assert rates == {"broken": 0.0, "length": None}  # a score-only evaluator has no pass rate


def test_a_text_only_evaluator_shows_what_it_said(results_dir: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A "PASS" returned as text is no verdict (the SDK's rule): the summary says the texts,
    so the mistake shows, instead of a block of dashes."""
    @evaluator
    def label(evaluated_model_output: str) -> str:
        return "PASS" if evaluated_model_output.endswith("!") else "FAIL"

    exp = run_experiment("proj", data=DATA, evaluators=[label], backend="local",
                         results_dir=results_dir, display_hist=False)
    assert "Texts     : 'PASS' 2, 'FAIL' 1" in capsys.readouterr().out
    stats = exp.summary().evaluators[0]
    assert (stats.pass_rate, stats.texts, stats.text_kinds) == (None, [("PASS", 2), ("FAIL", 1)], 2)
