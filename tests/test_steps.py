"""Tasks and evaluators: decorator and class forms, parameter checks, result conversion."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from patronus_tasks import (
    ConfigError,
    EvaluationResult,
    Evaluator,
    InvalidResultError,
    Task,
    TaskResult,
    evaluator,
    task,
)
from patronus_tasks.define.step_results import to_evaluation_result, to_task_result


def test_task_decorator_forms_keep_the_function_callable() -> None:
    @task
    def plain(evaluated_model_input: str) -> str:
        return evaluated_model_input * 2

    @task(name="renamed", retries=2, retry_delay_seconds=0.5, timeout_seconds=3)
    async def named(row, parent, tags) -> str:  # type: ignore[no-untyped-def]
        return "x"

    assert isinstance(plain, Task) and plain.name == "plain" and plain("ab") == "abab"
    assert not plain.is_async and named.is_async
    assert (named.name, named.retries, named.retry_delay_seconds, named.timeout_seconds) == (
        "renamed", 2, 0.5, 3)
    assert named.signature.names == ("row", "parent", "tags")


def test_unknown_task_parameter_fails_at_decoration_naming_it_and_the_allowed() -> None:
    with pytest.raises(ConfigError) as err:
        @task
        def bad(evaluated_model_input: str, prompt: str) -> str:
            return prompt
    msg = str(err.value)
    assert "'prompt'" in msg and "evaluated_model_input" in msg and "parent" in msg
    assert "task_result" not in msg  # tasks may not ask for it


def test_evaluator_may_ask_for_task_result_and_kwargs_gets_everything() -> None:
    @evaluator(name="judge", criteria="be nice")
    def judge(task_result: TaskResult, **kwargs) -> bool:  # type: ignore[no-untyped-def]
        return True

    assert (judge.name, judge.criteria) == ("judge", "be nice")
    assert "task_result" in judge.signature.names and "row" in judge.signature.names


def test_class_forms_are_checked_when_defined() -> None:
    class Upper(Task):
        def execute(self, evaluated_model_input: str) -> str:
            return evaluated_model_input.upper()

    class Exact(Evaluator):
        criteria = "exact match"

        async def evaluate(self, task_result: TaskResult, evaluated_model_gold_answer: str) -> bool:
            return task_result.evaluated_model_output == evaluated_model_gold_answer

    assert Upper().name == "Upper" and Upper(name="up").name == "up"
    assert Exact().is_async and Exact().criteria == "exact match"
    assert Upper().signature.names == ("evaluated_model_input",)

    with pytest.raises(ConfigError, match="'question'"):
        class Bad(Task):
            def execute(self, question: str) -> str:
                return question


def test_bad_run_options_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="retries"):
        task(retries=-1)(lambda row: "x")
    with pytest.raises(ConfigError, match="timeout_seconds"):
        evaluator(timeout_seconds=0)(lambda row: True)


def test_task_result_conversion() -> None:
    assert to_task_result("hi") == TaskResult(evaluated_model_output="hi")
    assert to_task_result(None) is None
    with pytest.raises(InvalidResultError, match="not int"):
        to_task_result(42)


def test_task_result_accepts_the_reference_fields_and_checks_metadata_and_tags() -> None:
    tr = TaskResult(evaluated_model_output="o", evaluated_model_system_prompt="s",
                    evaluated_model_name="gpt-4o", evaluated_model_provider="openai",
                    evaluated_model_params={"temperature": 1}, evaluated_model_selected_model="m",
                    tags={"k": "v"}, metadata={"a": [1, {"b": None}]})
    assert tr.model_info() == {"evaluated_model_name": "gpt-4o",
                               "evaluated_model_provider": "openai",
                               "evaluated_model_params": {"temperature": 1},
                               "evaluated_model_selected_model": "m"}
    with pytest.raises(ValueError, match="JSON"):
        TaskResult(evaluated_model_output="o", metadata={"when": dt.datetime.now()})
    with pytest.raises(ValueError, match="tags must map str to str"):
        TaskResult(evaluated_model_output="o", tags={"n": 1})  # type: ignore[dict-item]


def test_evaluation_result_conversion_and_pass_alias() -> None:
    assert to_evaluation_result(True) == EvaluationResult(pass_=True, score_raw=1.0)
    assert to_evaluation_result(0.25) == EvaluationResult(score_raw=0.25)
    assert to_evaluation_result("label") == EvaluationResult(text_output="label")
    assert to_evaluation_result(None) is None
    with pytest.raises(InvalidResultError, match="not list"):
        to_evaluation_result([1])
    er = EvaluationResult(pass_=False, score_raw=0.1, evaluation_duration=1.5)
    dumped = json.loads(er.model_dump_json(by_alias=True))
    assert dumped["pass"] is False and "pass_" not in dumped
    assert er.evaluation_duration == dt.timedelta(seconds=1.5)
    assert EvaluationResult.model_validate({"pass": True}).pass_ is True


def test_run_options_set_on_the_class_are_the_defaults() -> None:
    """``retries = 2`` on a subclass counts as ``inline`` and ``cache`` there do; the
    constructor's value wins when given, 0 included."""
    class Flaky(Task):
        retries, retry_delay_seconds, timeout_seconds = 2, 0.5, 5.0

        def execute(self, evaluated_model_input: str) -> str:
            return evaluated_model_input

    class Judge(Evaluator):
        retries = 3

        def evaluate(self, evaluated_model_output: str) -> bool:
            return True

    flaky = Flaky()
    assert (flaky.retries, flaky.retry_delay_seconds, flaky.timeout_seconds) == (2, 0.5, 5.0)
    assert Flaky(retries=0).retries == 0 and Judge().retries == 3
    assert Task.retries == 0 and Judge(retries=1).retries == 1


def test_sdk_style_results_and_class_options_that_conflict() -> None:
    assert EvaluationResult(score=None, score_raw=0.5).score_raw == 0.5  # every field passed
    with pytest.raises(ConfigError, match="inline=True cannot have a timeout_seconds"):
        class Stuck(Task):
            inline, timeout_seconds = True, 5.0

            def execute(self, evaluated_model_input: str) -> str:
                return ""

        Stuck()
