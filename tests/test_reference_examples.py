"""Every example of the reference docs, as written but for the import line.

Where an example calls OpenAI, a small OpenAI-compatible server on 127.0.0.1 stands in
(the real ``openai`` client talks to it through ``OPENAI_BASE_URL``). Placeholders the
docs leave undefined (``execute_sql``, ``evaluate_output``, ``evaluators=[...]``) are
given small definitions.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from patronus_tasks import Experiment, Row, evaluator

from .servers import FakeServer, PatronusAPI, echo_chat, serve

BASIC_TASK = '''
from openai import OpenAI
from patronus_tasks import task

oai = OpenAI()


@task
def call_gpt(evaluated_model_system_prompt: str, evaluated_model_input: str) -> str:
    model = "gpt-4o"
    evaluated_model_output = (
        oai.chat.completions.create(
            model=model,
            messages=[
                {"role": "system", "content": evaluated_model_system_prompt},
                {"role": "user", "content": evaluated_model_input},
            ],
            temperature=0,
        )
        .choices[0]
        .message.content
    )
    return evaluated_model_output
'''

ENHANCED_TASK = '''
from openai import OpenAI
from patronus_tasks import task, TaskResult

oai = OpenAI()


@task
def call_gpt(evaluated_model_system_prompt: str, evaluated_model_input: str) -> TaskResult:
    model = "gpt-4o"
    params = {
        "temperature": 1,
        "max_tokens": 200,
    }
    evaluated_model_output = (
        oai.chat.completions.create(
            model=model,
            messages=[
                {"role": "system", "content": evaluated_model_system_prompt},
                {"role": "user", "content": evaluated_model_input},
            ],
            **params,
        )
        .choices[0]
        .message.content
    )
    return TaskResult(
        evaluated_model_output=evaluated_model_output,
        metadata={
            "evaluated_model_name": model,
            "evaluated_model_provider": "openai",
            "evaluated_model_params": params,
            "evaluated_model_selected_model": model,
        },
        tags={"task_type": "chat_completion", "language": "English"},
    )
'''

FULL_EXAMPLE = '''
from openai import OpenAI
import textwrap
from patronus_tasks import Client, task, TaskResult

oai = OpenAI()
cli = Client()


@task
def call_gpt(evaluated_model_system_prompt: str, evaluated_model_input: str) -> TaskResult:
    model = "gpt-4o"
    params = {
        "temperature": 1,
        "max_tokens": 200,
    }
    evaluated_model_output = (
        oai.chat.completions.create(
            model=model,
            messages=[
                {"role": "system", "content": evaluated_model_system_prompt},
                {"role": "user", "content": evaluated_model_input},
            ],
            **params,
        )
        .choices[0]
        .message.content
    )
    return TaskResult(
        evaluated_model_output=evaluated_model_output,
        evaluated_model_system_prompt=evaluated_model_system_prompt,
        evaluated_model_name=model,
        evaluated_model_provider="openai",
        evaluated_model_params=params,
        evaluated_model_selected_model=model,
        tags={"task_type": "chat_completion", "language": "English"},
    )


evaluate_on_point = cli.remote_evaluator(
    "custom-large",
    "is-on-point",
    profile_config={
        "pass_criteria": textwrap.dedent(
            """
            The MODEL OUTPUT should accurately and concisely answer the USER INPUT.
            """
        ),
    },
    allow_update=True,
)

data = [
    {
        "evaluated_model_system_prompt": "You are a helpful assistant.",
        "evaluated_model_input": "How do I write a Python function?",
    },
    {
        "evaluated_model_system_prompt": "You are a knowledgeable assistant.",
        "evaluated_model_input": "Explain the concept of polymorphism in OOP.",
    },
    {
        "evaluated_model_system_prompt": "You are a creative poet who loves abstract ideas.",
        "evaluated_model_input": "What is 2 + 2?",
    },
]

cli.experiment(
    "Tutorial",
    data=data,
    task=call_gpt,
    evaluators=[evaluate_on_point],
    tags={"unit": "R&D", "version": "0.0.1"},
    experiment_name="OpenAI Task",
)
'''

TASKLESS = '''
from patronus_tasks import Client
cli = Client()
result = cli.experiment(
    "Project Name",
    data=[
        {
            "evaluated_model_input": "How do I write a Python function?",
            "evaluated_model_output": "def my_function():\\n    pass",
        }
    ],
    evaluators=[my_evaluator],
)
'''

MY_EVALUATOR = '''
from patronus_tasks import evaluator, Row, TaskResult

@evaluator
def my_evaluator(row: Row, task_result: TaskResult) -> bool:
    # Handle case where task_result is None
    if task_result is None:
        # Access output directly from row
        output = row.evaluated_model_output
    else:
        # Access output from task_result
        output = task_result.evaluated_model_output

    # Proceed with evaluation
    return evaluate_output(output)
'''

CONDITIONAL = '''
from patronus_tasks import task, Row

@task
def perform_sql_query(row: Row):
    if row.language != "sql":
        return None
    return execute_sql(row.query)
'''

DATA = [
    {"evaluated_model_system_prompt": "You are a helpful assistant.",
     "evaluated_model_input": "How do I write a Python function?"},
    {"evaluated_model_system_prompt": "You are a knowledgeable assistant.",
     "evaluated_model_input": "Explain the concept of polymorphism in OOP."},
]


@pytest.fixture
def openai_stand_in(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeServer]:
    with serve(echo_chat) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url + "/v1")
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
        monkeypatch.setenv("PATRONUS_TASKS_RESULTS_DIR", str(tmp_path / "results"))
        yield server


def _exec(source: str, **names: Any) -> dict[str, Any]:
    namespace: dict[str, Any] = dict(names)
    exec(compile(textwrap.dedent(source), "<reference example>", "exec"), namespace)
    return namespace


@evaluator
def mentions_input(row: Row, task_result: Any) -> bool:
    return row.evaluated_model_input in task_result.evaluated_model_output


@pytest.mark.parametrize("source", [BASIC_TASK, ENHANCED_TASK], ids=["basic", "enhanced"])
def test_openai_task_examples(prefect_server: str, openai_stand_in: FakeServer, source: str) -> None:
    ns = _exec(source)
    run = _exec("from patronus_tasks import Client\n"
                "exp = Client().experiment('Tutorial', data=data, task=call_gpt, "
                "evaluators=[ev], experiment_name='OpenAI Task')",
                data=DATA, call_gpt=ns["call_gpt"], ev=mentions_input)
    df = run["exp"].to_dataframe().sort_values("sid")
    assert df["task_output"].tolist() == [
        "[You are a helpful assistant.] How do I write a Python function?",
        "[You are a knowledgeable assistant.] Explain the concept of polymorphism in OOP.",
    ]
    assert df["pass"].tolist() == [True, True]
    bodies = [r.body for r in openai_stand_in.requests]
    assert len(bodies) == 2 and all(b["model"] == "gpt-4o" for b in bodies)
    if source is ENHANCED_TASK:
        assert bodies[0]["max_tokens"] == 200 and bodies[0]["temperature"] == 1
        assert '"evaluated_model_provider": "openai"' in df["task_metadata"].iloc[0]
        assert '"language": "English"' in df["task_tags"].iloc[0]


def test_taskless_example_with_my_evaluator(prefect_server: str, openai_stand_in: FakeServer) -> None:
    seen: list[str] = []

    def evaluate_output(output: str) -> bool:
        seen.append(output)
        return output.startswith("def ")

    ns = _exec(MY_EVALUATOR, evaluate_output=evaluate_output)
    run = _exec(TASKLESS, my_evaluator=ns["my_evaluator"])
    exp: Experiment = run["result"]
    assert seen == ["def my_function():\n    pass"]
    assert exp.to_dataframe()["pass"].tolist() == [True]
    assert exp.project == "Project Name"


def test_conditional_task_example(prefect_server: str, openai_stand_in: FakeServer) -> None:
    ns = _exec(CONDITIONAL, execute_sql=lambda q: f"rows of {q}")

    @evaluator
    def ran(task_result: Any) -> bool:
        return task_result.evaluated_model_output.startswith("rows of")

    data = [{"language": "sql", "query": "SELECT 1"}, {"language": "text", "query": ""}]
    run = _exec("from patronus_tasks import Client\n"
                "exp = Client().experiment('SQL', data=data, task=t, evaluators=[ran])",
                data=data, t=ns["perform_sql_query"], ran=ran)
    df = run["exp"].to_dataframe().set_index("sid")
    assert df.loc["1", "task_output"] == "rows of SELECT 1" and df.loc["1", "pass"]
    assert df.loc["2", "status"] == "skipped" and pd.isna(df.loc["2", "evaluator_name"])


def test_full_example_with_a_remote_evaluator(prefect_server: str, openai_stand_in: FakeServer,
                                              monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    api = PatronusAPI()
    with serve(api) as patronus:
        monkeypatch.setenv("PATRONUS_API_KEY", "pt-test-key-000000")
        monkeypatch.setenv("PATRONUS_API_URL", patronus.url)
        _exec(FULL_EXAMPLE)
    exp = Experiment(tmp_path / "results" / "Tutorial" / "OpenAI_Task-50e05a25")  # name + hash
    df = exp.to_dataframe().sort_values("sid")
    assert df["pass"].tolist() == [True, True, False]  # the poet rambles
    assert df["evaluator_name"].tolist() == ["is-on-point"] * 3
    assert '"evaluated_model_provider": "openai"' in df["task_metadata"].iloc[0]
    assert exp.manifest["tags"] == {"unit": "R&D", "version": "0.0.1"}
    assert len(openai_stand_in.requests) == 3
    assert api.criteria["is-on-point"]["config"]["pass_criteria"].strip().startswith("The MODEL")
