"""The reference's full example as a flow: a chat model as the task, a Patronus
``is-on-point`` remote evaluator as the judge, over the reference's three rows.

Configured by environment variables, so the same file runs against real services or
local stand-ins:

- ``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``OPENAI_MODEL`` (default ``gpt-4o``): the task's
  chat endpoint (OpenAI, vLLM, Ollama, LM Studio...).
- ``PATRONUS_API_KEY``, ``PATRONUS_API_URL``: the Patronus API for the judge.
- ``JUDGE=openai`` judges with the same pass criteria on the OpenAI-compatible endpoint
  instead, for when there is no Patronus key.

    OPENAI_API_KEY=... PATRONUS_API_KEY=... python flows/openai_task.py

The chat model's and the judge's tokens, and their cost at the model's price, are in the
summary it prints (`Tokens and cost`), the manifest and the Prefect artifacts. With
``cache=True`` an unchanged second run calls neither model (the answers come from
``.cache`` in the results directory); ``repeats=N`` asks each question N times (the
task runs at temperature 1: pass@k, pass^k and the rows whose verdict flips).
"""

from __future__ import annotations

import os
import textwrap

from prefect import flow
from prefect.states import State

from patronus_tasks import Client, Evaluator
from patronus_tasks.openai import ChatTask, LLMJudge
from patronus_tasks.prefect import experiment_flow_run_name, use_built_in_server, verdict_state

PASS_CRITERIA = textwrap.dedent(
    """
    The MODEL OUTPUT should accurately and concisely answer the USER INPUT.
    """
)

DATA = [
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


def make_judge(cli: Client, judge: str) -> Evaluator:
    """The ``is-on-point`` judge: Patronus' ``custom-large``, or an OpenAI-compatible model."""
    if judge == "openai":
        return LLMJudge("is-on-point", PASS_CRITERIA)
    return cli.remote_evaluator("custom-large", "is-on-point",
                                profile_config={"pass_criteria": PASS_CRITERIA},
                                allow_update=True)


@flow(name="openai-task", flow_run_name=experiment_flow_run_name)
def openai_task(project: str = "Tutorial", experiment_name: str = "OpenAI Task",
                max_concurrency: int = 4, results_dir: str | None = None,
                judge: str | None = None, cache: bool = False,
                repeats: int = 1) -> State:
    """Run the reference's full example; end in a state named after its verdict, the
    experiment's manifest as its result.

    Args:
        project: Project the experiment belongs to.
        experiment_name: Name of the experiment; runs with one name keep their own folders.
        max_concurrency: Rows (model calls) at once.
        results_dir: Where the Parquet results go: a folder or an object-storage URL
            (`s3://bucket/prefix`); empty for `$PATRONUS_TASKS_RESULTS_DIR`, else `./results`.
        judge: `patronus` (the `custom-large` remote evaluator, needs `PATRONUS_API_KEY`)
            or `openai` (an LLM judge on the OpenAI-compatible endpoint); empty for
            `$JUDGE`, else `patronus`.
        cache: Answer the model's and the judge's calls from the cache when they got
            exactly the same inputs before (`.cache` in the results directory).
        repeats: Ask each question this many times (pass@k, pass^k, flipping rows).
    """
    cli = Client(results_dir=results_dir)
    call_gpt = ChatTask(name="call_gpt", temperature=1, max_tokens=200)
    experiment = cli.experiment(
        project, data=DATA, task=call_gpt,
        evaluators=[make_judge(cli, judge or os.environ.get("JUDGE", "patronus"))],
        tags={"unit": "R&D", "version": "0.0.1"}, experiment_name=experiment_name,
        max_concurrency=max_concurrency, cache=True if cache else None, repeats=repeats,
    )
    return verdict_state(experiment)  # named after the verdict; its data: the manifest


if __name__ == "__main__":
    use_built_in_server()  # without PREFECT_API_URL: a fresh machine's first start takes ~20 s
    openai_task()
