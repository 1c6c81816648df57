"""Which agent wins: the order-support agent of ``agent_tools.py``, swept over the models
that could play it, each judged by its trajectories and answers, side by side.

One sweep (`patronus_tasks.sweep`): every variant an experiment of its own (a subflow run
of the sweep's, with its own nightly series: each night compared with its own last
night), together under one limit on calls; the sweep's flow run carries the matrix
(pass rates with their intervals, each variant against the baseline, McNemar's test
adjusted for the comparisons) and the chart of cost against quality, and its state names
the best variant.

Offline by default: the variants are local policies behind the OpenAI chat API
(`local_endpoint`), each a rule set of its own: ``rules`` (the agent's full rules),
``no-currency`` (it never converts a currency) and ``no-tools`` (it answers without
looking anything up). With ``OPENAI_BASE_URL`` set, the variants are models: those of
``OPENAI_MODELS`` (comma-separated), else ``OPENAI_MODEL``.

    python flows/agent_sweep.py
    OPENAI_BASE_URL=http://localhost:11434/v1 OPENAI_MODELS=qwen2.5,llama3.1 python flows/agent_sweep.py
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.states import Completed, Failed, State

from patronus_tasks import Evaluator, sweep
from patronus_tasks.agents import AgentTask, local_endpoint
from patronus_tasks.evaluators import (
    budget,
    contains,
    no_loops,
    tool_args_valid,
    tool_calls_match,
    trajectory_judge,
)
from patronus_tasks.prefect import use_built_in_server

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the agent's tools and rules live beside this file
import agent_tools  # noqa: E402

logger = logging.getLogger("patronus_tasks.flows.agent_sweep")
LOCAL = ("The variants are local policies behind the OpenAI chat API (OPENAI_BASE_URL is not "
         "set): scripted rules, not models. Set OPENAI_BASE_URL (and OPENAI_MODELS) to sweep "
         "real models.")


def _no_currency(messages: list[dict[str, Any]], tools: list[str]) -> Any:
    """The rules, but it never converts a currency (it answers from what it found)."""
    decided = agent_tools.local_policy(messages, tools)
    if isinstance(decided, list):
        kept = [call for call in decided if call[0] != "convert_currency"]
        return kept or "I cannot convert currencies."
    return decided


def _no_tools(messages: list[dict[str, Any]], tools: list[str]) -> Any:
    """It answers at once, looking nothing up."""
    return "Your request is being handled; it should be fine."


POLICIES = {"rules": agent_tools.local_policy, "no-currency": _no_currency, "no-tools": _no_tools}


def variants(max_steps: int) -> dict[str, dict[str, Any]]:
    """Each variant's agent: a local policy each, or (``OPENAI_BASE_URL``) a model each."""
    common: dict[str, Any] = {"system": agent_tools.SYSTEM, "max_steps": max_steps,
                              "temperature": 0}
    if not os.environ.get("OPENAI_BASE_URL"):
        return {name: {"task": AgentTask(agent_tools.TOOLS, name="agent", model=name,
                                         endpoint=local_endpoint(policy, model=name), **common)}
                for name, policy in POLICIES.items()}
    models = [m.strip() for m in (os.environ.get("OPENAI_MODELS") or "").split(",") if m.strip()]
    models = models or [os.environ.get("OPENAI_MODEL") or "gpt-4o-mini"]
    return {m: {"task": AgentTask(agent_tools.TOOLS, name="agent", model=m, **common)}
            for m in models}


def checks(max_steps: int, real: bool) -> list[Evaluator]:
    found: list[Evaluator] = [
        tool_calls_match(mode="unordered", args="subset"), tool_args_valid(agent_tools.TOOLS),
        no_loops(), budget(max_steps=max_steps - 1, name="within_budget"),
        contains(name="answer_holds")]
    return [*found, trajectory_judge()] if real else found


@flow(name="agent-sweep")
def agent_sweep(dataset: str = "datasets/agent_tasks.jsonl", project: str = "agent-sweep",
                sweep_name: str = "nightly", max_concurrency: int = 8,
                results_dir: str | None = None, max_steps: int = 4,
                resume: bool = False) -> State:
    """Sweep the order-support agent over its variants (local policies, or models with
    OPENAI_BASE_URL); the flow run ends Completed naming the best variant, Failed when a
    variant could not run.

    Args:
        dataset: JSONL, a row per request (see agent_tools.py). Relative: from the working
            directory, else this project's.
        project: The project of the runs.
        sweep_name: The sweep's name: each variant's series is <project>/<sweep_name>/<variant>,
            each night compared with its own last night.
        max_concurrency: Calls at once, of every variant together.
        results_dir: Where the Parquet results go (a folder or an object-storage URL).
        max_steps: The agent's model calls at most, per row.
        resume: Go on with the last sweep of this name: only its unfinished variants and rows run.
    """
    real = bool(os.environ.get("OPENAI_BASE_URL"))
    if not real:
        logger.warning(LOCAL)
        print(LOCAL)
    path = Path(dataset)
    s = sweep(project, data=path if path.is_absolute() or path.exists() else HERE.parent / path,
              variants=variants(max_steps), evaluators=checks(max_steps, real),
              sweep_name=sweep_name, max_concurrency=max_concurrency, results_dir=results_dir,
              resume=resume, tags={"suite": "agent"})
    message = s.headline() + ("" if real else " (variants: local policies)")
    return Failed(message=message) if s.failed else Completed(message=message)


if __name__ == "__main__":
    use_built_in_server()
    agent_sweep()
