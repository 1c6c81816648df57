"""Code written for the Patronus SDK's experimentation API, run with its import changed:
simple_task, simple_evaluator and the SDK's other experiment() keywords."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from patronus_tasks import (
    Client,
    ConfigError,
    EvaluationResult,
    evaluator,
    run_experiment,
    simple_evaluator,
    simple_task,
)

DATA = [
    {"evaluated_model_input": "a", "evaluated_model_gold_answer": "A"},
    {"evaluated_model_input": "b", "evaluated_model_gold_answer": "x"},
]


def _run(results_dir: Path, **kwargs: Any) -> pd.DataFrame:
    kwargs.setdefault("backend", "local")
    kwargs.setdefault("print_summary", False)
    exp = run_experiment("sdk", results_dir=results_dir, **kwargs)
    return exp.to_dataframe().sort_values("sid").reset_index(drop=True)


def test_simple_task_and_evaluator_as_in_the_sdk(results_dir: Path) -> None:
    upper = simple_task(lambda text: text.upper())
    exact = simple_evaluator(lambda output, gold: output == gold)
    df = _run(results_dir, data=DATA, task=upper, evaluators=[exact])
    assert df["task_output"].tolist() == ["A", "B"]
    assert df["pass"].tolist() == [True, False]
    assert df["score"].tolist() == [1.0, 0.0]
    assert (upper.name, exact.name) == ("simple_task", "simple_evaluator")


def test_simple_steps_keep_a_function_name_and_any_evaluator_value(results_dir: Path) -> None:
    @simple_evaluator
    def overlap(output: str, gold: str) -> float:
        return 0.5 if output.lower() == gold.lower() else 0.0

    def shout(text: str) -> str:
        return text.upper() + "!"

    task = simple_task(shout)
    judge = simple_evaluator(lambda o, g: EvaluationResult(text_output=f"{o}|{g}"), name="both")
    df = _run(results_dir, data=DATA, task=task, evaluators=[overlap, judge])
    assert (task.name, overlap.name) == ("shout", "overlap")
    scored = df[df["evaluator_name"] == "overlap"]
    assert scored["score"].tolist() == [0.0, 0.0]
    assert df[df["evaluator_name"] == "both"]["text_output"].tolist() == ["A!|A", "B!|x"]


def test_simple_evaluator_without_a_task_judges_the_rows_output(results_dir: Path) -> None:
    rows = [{"evaluated_model_output": "A", "evaluated_model_gold_answer": "A"}]
    df = _run(results_dir, data=rows, evaluators=[simple_evaluator(lambda o, g: o == g)])
    assert df["pass"].tolist() == [True]


def test_simple_evaluator_needs_a_gold_answer_column(results_dir: Path) -> None:
    with pytest.raises(ConfigError, match="evaluated_model_gold_answer"):
        _run(results_dir, data=[{"evaluated_model_output": "A"}],
             evaluators=[simple_evaluator(lambda o, g: o == g)])


def test_dataset_is_the_older_name_of_data(results_dir: Path) -> None:
    df = _run(results_dir, dataset=DATA, task=simple_task(str.upper),
              evaluators=[simple_evaluator(lambda o, g: o == g)])
    assert df["pass"].tolist() == [True, False]
    client = Client(results_dir=results_dir, backend="local")
    exp = client.experiment("sdk", dataset=DATA, task=simple_task(str.upper),
                            print_summary=False)
    assert len(exp.to_dataframe()) == 2


def test_data_and_dataset_together_or_neither_are_refused(results_dir: Path) -> None:
    with pytest.raises(ConfigError, match="not both"):
        _run(results_dir, data=DATA, dataset=DATA, task=simple_task(str.upper))
    with pytest.raises(ConfigError, match="needs data="):
        _run(results_dir, task=simple_task(str.upper))


def test_one_evaluator_or_one_chain_link_is_a_list_of_one(results_dir: Path) -> None:
    exact = simple_evaluator(lambda o, g: o == g)
    df = _run(results_dir, data=DATA, task=simple_task(str.upper), evaluators=exact)
    assert df["pass"].tolist() == [True, False]
    df = _run(results_dir, data=DATA, chain={"task": simple_task(str.upper), "evaluators": exact})
    assert df["pass"].tolist() == [True, False]


@pytest.mark.parametrize("display_hist", [True, False])
def test_display_hist_turns_the_histograms_on_and_off(
        results_dir: Path, capsys: pytest.CaptureFixture[str], display_hist: bool) -> None:
    @evaluator
    def score(evaluated_model_input: str) -> float:
        return 0.25 if evaluated_model_input == "a" else 0.75

    _run(results_dir, data=DATA, evaluators=[score], print_summary=True,
         display_hist=display_hist)
    out = capsys.readouterr().out
    assert "Pass rate" in out
    assert ("Histogram" in out) is display_hist
