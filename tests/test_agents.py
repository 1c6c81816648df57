"""Agents: `AgentTask` against a real HTTP server on 127.0.0.1 speaking the OpenAI chat API
with tool calls; a tool that raises, a tool that does not exist, malformed arguments, a
budget exceeded and a conversation input, each a clear outcome on its row; the trajectory
evaluators on what it did; the bundled offline flow on the session's Prefect server."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from patronus_tasks import ConfigError, run_experiment
from patronus_tasks.agents import AgentTask, Tool, as_messages
from patronus_tasks.agents.local import answer
from patronus_tasks.evaluators import (
    budget,
    no_loops,
    span_matches,
    tool_args_valid,
    tool_calls_match,
    trajectory_judge,
)
from patronus_tasks.exceptions import DatasetError
from patronus_tasks.openai import openai_endpoint
from patronus_tasks.trace import SpanData, Trace

from .conftest import RECORDED_WITHIN, ROOT
from .judge_server import ScriptedJudge, judge_server
from .servers import Recorded, Reply, serve


def weather(city: str, unit: str = "C") -> dict[str, Any]:
    """Today's weather in a city.

    Args:
        city: The city's English name.
        unit: C or F.
    """
    if city == "Atlantis":
        raise LookupError("no such city")
    return {"city": city, "temp": 21 if unit == "C" else 70}


def policy(messages: list[dict[str, Any]], tools: list[str]) -> Any:
    """What the scripted model does, by the first user message's marker."""
    first = next(m["content"] for m in messages if m["role"] == "user")
    if not tools:  # a plain chat call
        return f"{len(messages)} messages"
    results = [m for m in messages if m["role"] == "tool"]
    if "LOOP" in first:
        return [("weather", {"city": "Paris"})]  # never answers
    if results:
        return "Done: " + " | ".join(r["content"] for r in results)
    if "RAISE" in first:
        return [("weather", {"city": "Atlantis"})]
    if "UNKNOWN" in first:
        return [("teleport", {"to": "Mars"})]
    if "MALFORMED" in first:
        return [("weather", '{"city": "Paris"'), ("weather", {"town": "Paris"})]
    return [("weather", {"city": "Paris"}), ("weather", {"city": "Oslo", "unit": "F"})]


def scripted(req: Recorded) -> Reply:
    return 200, {}, answer(req.body, policy, req.body["model"])


ROWS = [
    {"sid": "ok", "evaluated_model_input": "Weather in Paris and Oslo?",
     "expected_tool_calls": [{"name": "weather", "arguments": {"city": "Paris"}},  # as sent
                             {"name": "weather", "arguments": {"city": "Oslo", "unit": "F"}}]},
    {"sid": "raise", "evaluated_model_input": "RAISE", "expected_tool_calls": []},
    {"sid": "unknown", "evaluated_model_input": "UNKNOWN", "expected_tool_calls": []},
    {"sid": "malformed", "evaluated_model_input": "MALFORMED", "expected_tool_calls": []},
    {"sid": "loop", "evaluated_model_input": "LOOP", "expected_tool_calls": []},
    {"sid": "conversation", "expected_tool_calls": [],
     "evaluated_model_input": [{"role": "user", "content": "hello"},
                               {"role": "assistant", "content": "Hi! Which city?"},
                               {"role": "user", "content": "Paris and Oslo, please"}]},
]


def test_tool_schema_from_hints_and_docstring() -> None:
    assert Tool.of(weather).schema() == {"type": "function", "function": {
        "name": "weather", "description": "Today's weather in a city.",
        "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                       "properties": {"city": {"type": "string", "description": "The city's English name."},
                                      "unit": {"type": "string", "description": "C or F.",
                                               "default": "C"}}}}}


def test_an_agent_on_a_real_chat_server_and_each_failure_on_its_row(results_dir: Path) -> None:
    with serve(scripted) as server:
        agent = AgentTask([weather], model="tool-model", system="Be brief.", max_steps=3,
                          endpoint=openai_endpoint(base_url=server.url, api_key="sk-test-secret-1"))
        ex = run_experiment("agents", data=ROWS, task=agent, backend="local", results_dir=results_dir,
                            print_summary=False, html_report=False, evaluators=[
                                tool_calls_match(mode="strict"), tool_args_valid(),
                                no_loops(), budget(max_steps=2)])
    df = ex.to_dataframe()
    rows = df.groupby("sid").first()
    assert rows.loc["loop", "status"] == "error" and rows.loc["loop", "error_type"] == "BudgetExceeded"
    assert "max_steps=3" in rows.loc["loop", "error_message"]
    assert (df[df.sid != "loop"]["status"] == "ok").all()  # every other row answered
    verdicts = df[df.sid != "loop"].pivot(index="sid", columns="evaluator_name", values="pass")
    assert verdicts.loc["ok"].to_dict() == {"tool_calls_match": True, "tool_args_valid": True,
                                            "no_loops": True, "budget": True}
    assert verdicts.loc["malformed", "tool_args_valid"] == False  # noqa: E712
    meta = json.loads(rows.loc["raise", "task_metadata"])
    assert meta["trajectory"] == [{"name": "weather", "arguments": {"city": "Atlantis"}, "output": None,
                                   "error": "LookupError: no such city"}]
    assert rows.loc["raise", "task_output"] == "Done: error: LookupError: no such city"

    spans = ex.spans()
    tools = spans[spans.kind == "tool"].set_index("sid")
    assert tools.loc["unknown", "name"] == "teleport"
    assert tools.loc["unknown", "error"].startswith("ToolError: no tool named 'teleport'")
    assert sorted(tools.loc["malformed", "error"].str.split(":").str[1]) == [
        " arguments of 'weather' are not valid JSON (Expecting ',' delimiter)",
        " arguments of 'weather' do not fit its schema"]
    loop = spans[spans.sid == "loop"]
    assert (loop.kind == "llm").sum() == 3 and (loop.kind == "tool").sum() == 3  # kept though it failed
    assert loop[loop.kind == "agent"]["error"].iloc[0].startswith("BudgetExceeded")
    llm = spans[(spans.kind == "llm") & (spans.sid == "ok")]
    assert llm["model"].tolist() == ["tool-model", "tool-model"] and llm["input_tokens"].notna().all()
    # the conversation went to the model as given, the system prompt first
    sent = [r.body["messages"] for r in server.requests
            if r.body["messages"][-1]["content"].startswith("Paris")]
    assert [m["role"] for m in sent[0]] == ["system", "user", "assistant", "user"]
    assert all(r.body["tools"][0]["function"]["name"] == "weather" for r in server.requests)
    assert "sk-test-secret-1" not in spans.to_csv() + df.to_csv()


def test_chat_task_takes_a_conversation_too() -> None:
    from patronus_tasks.openai import ChatTask

    with serve(scripted) as server:
        chat = ChatTask("m", endpoint=openai_endpoint(base_url=server.url))
        result = asyncio.run(chat.execute(ROWS[-1]["evaluated_model_input"], "Be brief."))
    assert result.evaluated_model_output == "4 messages"  # the system prompt, then the three
    assert [m["role"] for m in server.requests[0].body["messages"]] == [
        "system", "user", "assistant", "user"]


def test_a_conversation_that_is_not_one_is_a_clear_error() -> None:
    assert as_messages('[{"role": "user", "content": "hi"}]') == [{"role": "user", "content": "hi"}]
    assert as_messages("[not json") == [{"role": "user", "content": "[not json"}]
    with pytest.raises(DatasetError, match="list of messages each with a role"):
        as_messages([{"content": "no role"}])


def _trace(*calls: tuple[str, dict[str, Any]]) -> Trace:
    return Trace([SpanData(str(i), None, name, "tool", float(i), float(i) + 1, json.dumps(args))
                  for i, (name, args) in enumerate(calls)], duration=3.0)


@pytest.mark.parametrize(("mode", "made", "passed"), [
    ("strict", [("a", {"x": 1}), ("b", {})], True),
    ("strict", [("b", {}), ("a", {"x": 1})], False),
    ("unordered", [("b", {}), ("a", {"x": 1})], True),
    ("unordered", [("a", {"x": 1})], False),
    ("subset", [("a", {"x": 1})], True),
    ("subset", [("a", {"x": 1}), ("c", {})], False),
    ("superset", [("c", {}), ("b", {}), ("a", {"x": 1})], True),
    ("superset", [("a", {"x": 2}), ("b", {})], False),
])
def test_tool_calls_match_modes(mode: str, made: list[Any], passed: bool) -> None:
    expected = [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]
    result = tool_calls_match(expected, mode=mode).evaluate(trace=_trace(*made))
    assert result.pass_ is passed, result.explanation


def test_args_ignore_subset_or_a_function_and_the_other_trajectory_checks() -> None:
    trace = _trace(("a", {"x": 1, "y": 2}), ("a", {"x": 1, "y": 2}), ("a", {"x": 1, "y": 2}))
    want = [{"name": "a", "arguments": {"x": 1}}] * 3
    assert not tool_calls_match(want).evaluate(trace=trace).pass_
    assert tool_calls_match(want, args="subset").evaluate(trace=trace).pass_
    assert tool_calls_match([{"name": "a"}] * 3, args="ignore").evaluate(trace=trace).pass_
    assert tool_calls_match(want, args=lambda got, exp: got["x"] == exp["x"]).evaluate(trace=trace).pass_
    looped = no_loops(max_repeats=2).evaluate(trace=trace)
    assert not looped.pass_ and 'a({"x": 1, "y": 2}) 3 times' in (looped.explanation or "")
    assert span_matches("a", kind="tool").evaluate(trace=trace).pass_
    assert not span_matches(kind="llm").evaluate(trace=trace).pass_
    assert span_matches(kind="llm", present=False).evaluate(trace=trace).pass_
    within = budget(max_seconds=2.5).evaluate(trace=trace)
    assert not within.pass_ and within.explanation == "over max_seconds: seconds 3 of 2.5"
    with pytest.raises(ValueError, match="max_cost is set but the task's cost is unknown"):
        budget(max_cost=1.0).evaluate(trace=trace)


def test_trajectory_judge_reads_the_whole_trajectory_and_never_passes_silently() -> None:
    from patronus_tasks.define.row import Row
    from patronus_tasks.exceptions import JudgeError

    trace = _trace(("lookup", {"id": 7}))
    row = Row({"sid": "1", "expected_tool_calls": '[{"name": "lookup", "arguments": {"id": 7}}]'})
    script = ScriptedJudge(script={"BROKEN": ["not json at all"]},
                           default={"pass": True, "explanation": "sensible"})
    with judge_server(script) as server:
        judge = trajectory_judge(endpoint=server.url, model="judge-model", structured=False)
        ok = asyncio.run(judge.evaluate(trace=trace, row=row, evaluated_model_input="find 7",
                                        evaluated_model_output="found 7"))
        with pytest.raises(JudgeError):
            asyncio.run(judge.evaluate(trace=trace, row=row, evaluated_model_input="BROKEN",
                                       evaluated_model_output="x"))
    assert ok.pass_ is True
    prompt = script.requests[0].body["messages"][1]["content"]
    assert '1. lookup({"id": 7}) -> null' in prompt and "A reference trajectory" in prompt
    assert prompt.count('lookup({"id": 7})') == 2  # made, and the reference


def _flow() -> Any:
    spec = importlib.util.spec_from_file_location("agent_flow", ROOT / "flows" / "agent_tools.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.agent_tools


def test_the_bundled_agent_flow_runs_offline_with_a_local_policy(
        prefect_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from patronus_tasks.results import load_experiment

    from .test_prefect_run import _task_runs

    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    state = _flow()(results_dir=str(tmp_path), experiment_name="offline", return_state=True)
    assert "deterministic local policy" in capsys.readouterr().out
    assert state.message.endswith("(model: local policy)")
    assert "tool_calls_match 8 of 9 rows passed (88.9%)" in state.message  # two1 misses its conversion
    ex = load_experiment(tmp_path / "agent-tools" / "offline")
    assert ex.wait_recorded(RECORDED_WITHIN)
    runs = asyncio.run(_task_runs(ex.manifest.flow_run_id))
    spans = ex.spans()
    nested = [r for r in runs if r.task_key.startswith("span-")]
    assert len(nested) == len(spans) == 36  # every span a task run


def test_expected_calls_and_conversations_read_back_from_parquet(tmp_path: Path) -> None:
    import pandas as pd

    from patronus_tasks.define.row import Row
    from patronus_tasks.evaluators.agentic import expected_calls

    for i, row in enumerate((ROWS[0], ROWS[-1])):
        pd.DataFrame([row]).to_parquet(tmp_path / f"{i}.parquet")
    # read back, a list of objects is an array of structs: every key of any item, null
    first, conversation = (pd.read_parquet(tmp_path / f"{i}.parquet").iloc[0] for i in (0, 1))
    calls = expected_calls("expected_tool_calls", Row(first), "t")
    assert [(c.name, c.arguments) for c in calls] == [("weather", {"city": "Paris"}),
                                                      ("weather", {"city": "Oslo", "unit": "F"})]
    assert as_messages(conversation["evaluated_model_input"]) == ROWS[-1]["evaluated_model_input"]


def test_two_span_matches_in_one_experiment_each_named(results_dir: Path) -> None:
    """``name=`` names the evaluator, as for every other one; the span is ``span_name=``."""
    from patronus_tasks import run_experiment, span, task

    @task
    def tooled(evaluated_model_input: str) -> str:
        with span("search", kind="tool"):
            pass
        return "x"

    checks = [span_matches("search", kind="tool", name="searched"),
              span_matches(kind="llm", present=False, name="no_model")]
    exp = run_experiment("spans", data=[{"evaluated_model_input": "q"}], task=tooled,
                         evaluators=checks, backend="local", results_dir=results_dir,
                         print_summary=False, html_report=False)
    df = exp.to_dataframe().set_index("evaluator_name")
    assert df.loc["searched", "pass"] and df.loc["no_model", "pass"]
    assert df.loc["no_model", "explanation"] == "0 span(s) with kind='llm'; wanted none"


def test_agent_limits_otel_error_type_and_a_reference_trajectory() -> None:
    from patronus_tasks.agents import AgentTask, local_endpoint
    from patronus_tasks.evaluators.agentic import _trajectory_text
    from patronus_tasks.record.otel import span_attributes
    from patronus_tasks.trace.spans import SpanData
    from patronus_tasks.trace.tree import ToolCall

    def weather(city: str) -> str:
        """The weather."""
        return "sunny"

    for bad in (0, -1, True):
        with pytest.raises(ConfigError, match="max_steps must be a whole number >= 1"):
            AgentTask([weather], model="m", endpoint=local_endpoint(lambda m, t: "x"), max_steps=bad)
    failed = SpanData("s1", None, "weather", "tool", 0.0, 1.0,
                      error="ToolError: no tool named 'delete_database'")
    assert span_attributes(failed)["error.type"] == "ToolError"  # the conventions': the type
    calls = [ToolCall("lookup", {"id": 1}, output=None)]
    assert _trajectory_text(calls, outputs=False) == '1. lookup({"id": 1})'  # no "-> null"
    # an instrumentor's tool span (captured from the user's OpenTelemetry) is its tool's call
    captured = [SpanData("s2", None, "execute_tool get_weather", "tool", 0.0, 1.0,
                         attributes={"gen_ai.tool.name": "get_weather"}),
                SpanData("s3", None, "lookup-tool", "tool", 1.0, 2.0, attributes={"tool.name": "lookup"})]
    assert [c.name for c in Trace(captured).tool_calls()] == ["get_weather", "lookup"]


def test_on_budget_stop_hands_the_run_to_the_evaluators(results_dir: Path) -> None:
    """As Inspect AI scores a sample that hit its limit: the loop is judged, not an error."""
    from patronus_tasks.agents import local_endpoint

    def weather(city: str) -> str:
        """The weather."""
        return "sunny"

    looping = local_endpoint(lambda messages, tools: [("weather", {"city": "Oslo"})])
    with pytest.raises(ConfigError, match='on_budget must be "error" or "stop"'):
        AgentTask([weather], model="m", endpoint=looping, on_budget="return")  # type: ignore[arg-type]
    agent = AgentTask([weather], model="m", endpoint=looping, max_steps=3, on_budget="stop")
    ex = run_experiment("stopped", data=[{"evaluated_model_input": "weather?"}], task=agent,
                        evaluators=[no_loops(), budget(max_steps=2)], backend="local",
                        results_dir=results_dir, print_summary=False, html_report=False)
    df = ex.to_dataframe().set_index("evaluator_name")
    assert (df["status"] == "ok").all()
    assert not df.loc["no_loops", "pass"] and not df.loc["budget", "pass"]
    meta = json.loads(df["task_metadata"].iloc[0])
    assert meta["stopped"] == "max_steps=3" and meta["steps"] == 3 and len(meta["trajectory"]) == 3
    agent_span = ex.spans().query("kind == 'agent'").iloc[0]
    assert pd.isna(agent_span["error"]) and json.loads(agent_span["attributes"])["stopped"] == "max_steps=3"


def test_traced_tools_in_a_class_or_a_factory_are_one_span_per_call_named_as_called(
        results_dir: Path) -> None:
    """An agent's tools decorated ``@traced(kind="tool")`` (methods, closures): each call is
    one tool span, named as the model calls the tool, so the trajectory matches the
    dataset's (it was ``build.<locals>.convert`` beside the agent's ``convert``: two calls)."""
    from patronus_tasks.agents import local_endpoint

    from .test_spans import EXPECTED_CALLS, Forecasts, make_converter

    def plan(messages: list[dict[str, Any]], tools: list[str]) -> Any:
        if any(m["role"] == "tool" for m in messages):
            return "It is sunny; 3 EUR."
        return [("get_weather", {"city": "Paris"}), ("convert", {"amount": 3, "to": "EUR"})]

    agent = AgentTask([Forecasts().get_weather, make_converter()], model="m",
                      endpoint=local_endpoint(plan))
    assert list(agent.tools) == ["get_weather", "convert"]
    ex = run_experiment("traced-tools", data=[{"evaluated_model_input": "Paris?"}], task=agent,
                        evaluators=[tool_calls_match(EXPECTED_CALLS), tool_args_valid()],
                        backend="local", results_dir=results_dir, print_summary=False,
                        html_report=False)
    assert ex.to_dataframe()["pass"].tolist() == [True, True]
    spans = ex.spans()
    tools = spans[spans.kind == "tool"]
    assert tools["name"].tolist() == ["get_weather", "convert"]  # one span per call
    agent_span = spans.query("kind == 'agent'")["span_id"].iloc[0]
    assert (tools["parent_id"] == agent_span).all()
    # the tool's own attributes join its call's span; its output is the tool's
    weather = tools.set_index("name").loc["get_weather"]
    assert json.loads(weather["attributes"])["source"] == "met-office"
    assert json.loads(weather["output"]) == "sunny in Paris"


def test_a_tool_a_traced_tool_calls_is_a_span_of_its_own() -> None:
    """Only the tool the agent called records into the agent's span of the call."""
    from patronus_tasks import traced
    from patronus_tasks.trace import Collector, collecting, span
    from patronus_tasks.trace.decorate import tool_call

    @traced(kind="tool")
    def geocode(city: str) -> str:
        return "48.9,2.4"

    @traced(kind="tool")
    def get_weather(city: str) -> str:
        return f"sunny at {geocode(city)}"

    with collecting(Collector()) as collector:
        with span("get_weather", kind="tool") as called, tool_call(called):
            get_weather("Paris")
        geocode("Oslo")  # outside the agent's call: a span of its own too
    spans = collector.harvest() or []
    assert [(s.name, s.parent_id) for s in spans] == [
        ("get_weather", None), ("geocode", called.span_id), ("geocode", None)]
