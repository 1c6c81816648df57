"""Support replies, evaluated in the Patronus SDK 0.1.x's style: a program written for
``patronus.experiments`` with its imports changed to ``patronus_tasks.experiments`` (and
``patronus_tasks.evals``), run offline on Prefect.

A two-link chain: a drafting model answers each ticket, then a redaction step removes
the customer's personal data from the draft; each link's evaluators judge it (an
``@evaluator`` function, a ``StructuredEvaluator``, weighted). With no model endpoint the
drafts come from a deterministic local policy (said in the output); with
``OPENAI_BASE_URL`` set, a real model drafts them.

    python flows/support_replies.py
    patronus-tasks run flows/support_replies.py
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from prefect import flow

from patronus_tasks.evals import EvaluationResult, StructuredEvaluator, evaluator
from patronus_tasks.experiments import (
    FuncEvaluatorAdapter,
    Row,
    TaskResult,
    run_experiment,
)
from patronus_tasks.prefect import experiment_flow_run_name, use_built_in_server, verdict_state

HERE = Path(__file__).resolve().parent.parent
PII = re.compile(r"[\w.+-]+@[\w-]+\.[\w.]+|\b\d{3}-\d{3}-\d{4}\b|\bending \d{4}\b")
POLICY = {"damaged": "We will send a replacement", "password": "We sent you a reset link",
          "crashes": "Please update the app to the latest version",
          "refund": "Your refund is on its way", "delete": "We started the deletion of your account",
          "package": "We opened a carrier claim for your package"}


async def draft(row: Row, parent: Any, tags: dict[str, str]) -> TaskResult:
    """The drafting model: a real one when OPENAI_BASE_URL is set, else the local policy
    (which, like a careless model, repeats the customer's contact details)."""
    if os.environ.get("OPENAI_BASE_URL"):
        from patronus_tasks.openai import chat_completion, openai_endpoint

        answer = await chat_completion(openai_endpoint(), [
            {"role": "system", "content": "You answer customer support tickets in two sentences."},
            {"role": "user", "content": row.task_input}])
        return TaskResult(output=answer.evaluated_model_output, metadata={"model": "openai"})
    reply = next((a for k, a in POLICY.items() if k in row.task_input.lower()), "We are on it")
    contact = PII.findall(row.task_input)
    said = f" We will write to you at {contact[0]}." if contact else ""
    return TaskResult(output=f"{reply}.{said}", metadata={"model": "local policy"})


def redact(row: Row, parent: Any, tags: dict[str, str]) -> str:
    """The second link: the draft with personal data removed."""
    return PII.sub("[redacted]", parent.task.output)


@evaluator
def resolves(row: Row, task_result: TaskResult, **kwargs: Any) -> bool:
    """The reply offers the resolution the ticket needs (the dataset's gold answer)."""
    return row.gold_answer.split()[0] in task_result.output.lower()


class NoPersonalData(StructuredEvaluator):
    """No e-mail address, phone number or card digits in the reply."""

    evaluator_id = "no_personal_data"

    def evaluate(self, *, task_output: str, **kwargs: Any) -> EvaluationResult:
        found = PII.findall(task_output or "")
        return EvaluationResult(pass_=not found, score=0.0 if found else 1.0,
                                explanation=f"found {found}" if found else "none found")


@flow(name="support-replies", flow_run_name=experiment_flow_run_name)
def support_replies(dataset: str = "datasets/support_tickets.jsonl",
                    experiment_name: str | None = None, results_dir: str = "results") -> Any:
    from patronus_tasks.datasets import read_jsonl

    if not os.environ.get("OPENAI_BASE_URL"):
        print("support-replies: drafts from the local policy (set OPENAI_BASE_URL for a model)")
    path = Path(dataset) if Path(dataset).is_absolute() else HERE / dataset
    experiment = run_experiment(
        read_jsonl(path), project_name="support-replies", experiment_name=experiment_name,
        chain=[{"task": draft, "evaluators": [FuncEvaluatorAdapter(resolves, weight="0.5"),
                                              NoPersonalData(weight="0.5")]},
               {"task": redact, "evaluators": [NoPersonalData(weight="0.5")]}],
        results_dir=results_dir)
    return verdict_state(experiment.results)  # the run's verdict, as the UI shows it


if __name__ == "__main__":
    use_built_in_server()
    support_replies()
