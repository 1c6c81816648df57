"""A tool-using agent, judged by how it worked as well as by what it answered.

An order-support agent (`AgentTask`) with four tools (look up an order, quote shipping,
convert a currency, search the help pages) answers the bundled questions
(``datasets/agent_tasks.jsonl``: texts and conversations, each with the tool calls it should
make). Every model call and tool call is a span: a task run nested under the row's in the
Prefect UI, a row of ``spans.parquet``. The trajectory evaluators judge the calls
(`tool_calls_match`, `tool_args_valid`, `no_loops`, `budget`); `contains` judges the answer.

Offline by default: the model is a deterministic local policy behind the same
OpenAI-compatible interface (`local_endpoint`; the flow says so), which reads the request
and picks tools by simple rules. With ``OPENAI_BASE_URL`` set (``OPENAI_MODEL``,
``OPENAI_API_KEY`` as needed), a real model plays the agent, and `trajectory_judge` runs.

    python flows/agent_tools.py
    OPENAI_BASE_URL=http://localhost:11434/v1 OPENAI_MODEL=qwen2.5 python flows/agent_tools.py
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.states import State

from patronus_tasks import Evaluator, run_experiment
from patronus_tasks.agents import AgentTask, local_endpoint
from patronus_tasks.evaluators import (
    budget,
    contains,
    no_loops,
    tool_args_valid,
    tool_calls_match,
    trajectory_judge,
)
from patronus_tasks.prefect import experiment_flow_run_name, use_built_in_server, verdict_state

HERE = Path(__file__).resolve().parent
logger = logging.getLogger("patronus_tasks.flows.agent")
LOCAL = ("The agent's model is a deterministic local policy behind the OpenAI chat API "
         "(OPENAI_BASE_URL is not set): its tool choices are scripted rules, not a model's. "
         "Set OPENAI_BASE_URL to let a real model play it (and run trajectory_judge).")
SYSTEM = ("You are an order-support agent. Use the tools to look things up; never guess an "
          "order's status, a price or a rate. Answer in one or two sentences.")

ORDERS = {"A100": {"status": "shipped", "eta": "2026-12-01", "total": 42.0, "currency": "EUR"},
          "B200": {"status": "processing", "eta": "2026-12-05", "total": 15.5, "currency": "USD"}}
RATES = {("USD", "EUR"): 0.92, ("EUR", "USD"): 1.09, ("GBP", "EUR"): 1.17, ("EUR", "GBP"): 0.85}
ZONES = {"france": 8.0, "germany": 8.0, "japan": 24.0, "canada": 18.0}
HELP = {"returns": "Returns are free within 30 days: start one from your order page.",
        "warranty": "Every device has a two-year warranty covering manufacturing faults.",
        "payment": "We take cards and bank transfers; invoices come by email."}


def lookup_order(order_id: str) -> dict[str, Any]:
    """Look up an order's status, delivery date and total.

    Args:
        order_id: The order's id, a letter and three digits (A100).
    """
    if order_id not in ORDERS:
        raise KeyError(f"no order {order_id}")
    return ORDERS[order_id]


def shipping_quote(country: str, weight_kg: float) -> dict[str, Any]:
    """Quote shipping in EUR for a parcel to a country.

    Args:
        country: Where it goes (English name).
        weight_kg: The parcel's weight in kilograms.
    """
    base = ZONES.get(country.lower())
    if base is None:
        raise ValueError(f"we do not ship to {country}")
    return {"country": country, "price": round(base + 1.5 * weight_kg, 2), "currency": "EUR"}


def convert_currency(amount: float, from_currency: str, to_currency: str) -> float:
    """Convert an amount between currencies at today's rate.

    Args:
        amount: How much.
        from_currency: Its ISO code (USD, EUR, GBP).
        to_currency: The ISO code to convert to.
    """
    rate = RATES.get((from_currency.upper(), to_currency.upper()))
    if rate is None:
        raise ValueError(f"no rate from {from_currency} to {to_currency}")
    return round(amount * rate, 2)


def search_help(query: str) -> list[str]:
    """Search the help pages; the passages that match.

    Args:
        query: Words to look for.
    """
    words = set(re.findall(r"\w+", query.lower()))
    return [text for topic, text in HELP.items() if topic in words or topic.rstrip("s") in words]


TOOLS = [lookup_order, shipping_quote, convert_currency, search_help]


def _last_user(messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """The last user message, and the tool results given after it."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            return str(messages[i].get("content") or ""), [m for m in messages[i:] if m.get("role") == "tool"]
    return "", []


def _plan(text: str) -> list[tuple[str, dict[str, Any] | str]]:
    calls: list[tuple[str, dict[str, Any] | str]] = []
    calls += [("lookup_order", {"order_id": o}) for o in re.findall(r"\b([A-Z]\d{3})\b", text)]
    ship = re.search(r"(\d+(?:\.\d+)?)\s*kg.*?\bto\s+([A-Z][a-z]+)", text)
    if ship:
        calls.append(("shipping_quote", {"country": ship.group(2), "weight_kg": float(ship.group(1))}))
    money = re.search(r"(\d+(?:\.\d+)?)\s*([A-Z]{3})\s+(?:in|to)\s+([A-Z]{3})", text)
    if money:
        calls.append(("convert_currency", {"amount": float(money.group(1)),
                                           "from_currency": money.group(2), "to_currency": money.group(3)}))
    return calls or [("search_help", {"query": text})]


def local_policy(messages: list[dict[str, Any]], tools: list[str]) -> str | list[Any]:
    """The offline model: plan the calls from the user's words, then answer from the results."""
    text, results = _last_user(messages)
    if not results:
        return _plan(text)
    said = [r["content"] for r in results]
    return "From what I found: " + " ".join(said)


@flow(name="agent-tools", flow_run_name=experiment_flow_run_name)
def agent_tools(dataset: str = "datasets/agent_tasks.jsonl", project: str = "agent-tools",
                experiment_name: str | None = None, max_concurrency: int = 8,
                results_dir: str | None = None, max_steps: int = 4,
                resume: bool = False) -> State:
    """Run the order-support agent over the dataset and judge its trajectories; the flow run
    ends in its verdict's state.

    Args:
        dataset: JSONL, a row per request: `evaluated_model_input` (a text or a conversation),
            `evaluated_model_gold_answer` (words the answer must hold) and
            `expected_tool_calls`. Relative: from the working directory, else this project's.
        project: The project (and series) of the runs.
        experiment_name: This run's name; empty for a new timestamped one.
        max_concurrency: Rows run at once.
        results_dir: Where the Parquet results go (a folder or an object-storage URL).
        max_steps: The agent's model calls at most, per row.
        resume: Go on with the latest run named `experiment_name` (an interrupted or
            crashed one): its finished rows are kept, only the rest run.
    """
    real = bool(os.environ.get("OPENAI_BASE_URL"))
    if not real:
        logger.warning(LOCAL)
        print(LOCAL)
    agent = AgentTask(TOOLS, system=SYSTEM, max_steps=max_steps, temperature=0,
                      **({} if real else {"endpoint": local_endpoint(local_policy),
                                          "model": "local-policy"}))
    checks: list[Evaluator] = [
        tool_calls_match(mode="unordered", args="subset"), tool_args_valid(TOOLS), no_loops(),
        budget(max_steps=max_steps - 1, name="within_budget"), contains(name="answer_holds")]
    if real:
        checks.append(trajectory_judge())
    path = Path(dataset)
    experiment = run_experiment(
        project, data=path if path.is_absolute() or path.exists() else HERE.parent / path,
        task=agent, evaluators=checks, tags={"suite": "agent", "model": agent.model},
        experiment_name=experiment_name, max_concurrency=max_concurrency, results_dir=results_dir,
        resume=resume)
    state = verdict_state(experiment)
    if not real:
        state.message = f"{state.message} (model: local policy)"
    return state


if __name__ == "__main__":
    use_built_in_server()
    agent_tools()
