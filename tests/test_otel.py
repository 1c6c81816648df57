"""OpenTelemetry: with OTEL_EXPORTER_OTLP_ENDPOINT set, an experiment's spans reach a real
OTLP receiver on 127.0.0.1 (protobuf decoded; over HTTP, or gRPC when asked) as one tree
with the GenAI conventions, the verdicts as events on the span they judged; the user's own
OpenTelemetry spans inside the task (an instrumentor's) are captured into the results and
the tree. The experiment runs in its own process: the global tracer provider is set once
per process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from patronus_tasks import ConfigError, run_experiment, task
from patronus_tasks.record import otel

from .conftest import ROOT
from .otlp_grpc_receiver import otlp_grpc_receiver
from .otlp_receiver import Received, otlp_receiver

SCRIPT = '''
import json, sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

trace.set_tracer_provider(TracerProvider())  # the user's own set-up, as an instrumentor's
tracer = trace.get_tracer("user-instrumentation")

from patronus_tasks import evaluator, run_experiment, task, traced
from patronus_tasks.agents import AgentTask, local_endpoint


class Kit:
    @traced(kind="tool")  # a method: its span, and gen_ai.tool.name, are "forecast"
    def forecast(self, city: str) -> str:
        return "sunny"


def weather(city: str) -> str:
    """The weather."""
    return "sunny"


def policy(messages, tools):
    done = any(m["role"] == "tool" for m in messages)
    return "It is sunny." if done else [("weather", {"city": "Paris"})]


agent = AgentTask([weather], model="local-policy", endpoint=local_endpoint(policy))


@task
async def answer(evaluated_model_input: str):
    with tracer.start_as_current_span("openai.chat", attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o-mini",
            "gen_ai.usage.input_tokens": 11, "gen_ai.usage.output_tokens": 3}):
        pass
    with tracer.start_as_current_span("retrieve", attributes={
            "openinference.span.kind": "RETRIEVER", "input.value": "paris weather"}):
        with tracer.start_as_current_span("embed", attributes={
                "openinference.span.kind": "EMBEDDING", "llm.model_name": "text-embedding-3-small"}):
            pass
    Kit().forecast("Paris")
    return await agent.execute(evaluated_model_input)


@evaluator
def sunny(evaluated_model_output: str) -> bool:
    return "sunny" in evaluated_model_output


rows = int(sys.argv[2]) if len(sys.argv) > 2 else 1
data = [{"sid": f"r{i}", "evaluated_model_input": "Weather in Paris?"} for i in range(1, rows + 1)]
ex = run_experiment("otel", data=data,
                    task=answer, evaluators=[sunny], backend="local", results_dir=sys.argv[1],
                    experiment_name="traced", print_summary=False, html_report=False)
print(json.dumps({"spans": ex.spans().drop(columns=["started_at", "ended_at"]).to_dict("records"),
                  "reports": ex.manifest.reports}, default=str))
'''


def _traced_run(tmp_path: Path, got: Received, **variables: str) -> dict[str, Any]:
    """SCRIPT run with its spans sent to ``got``: what it printed."""
    script = tmp_path / "traced.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": got.url, "OTEL_SERVICE_NAME": "nightly-evals",
           "PYTHONPATH": str(ROOT), **variables}
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "results")], env=env,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def test_an_experiment_reaches_an_otlp_receiver_as_one_tree(tmp_path: Path) -> None:
    with otlp_receiver() as got:
        out = _traced_run(tmp_path, got)
    assert got.paths and set(got.paths) == {"/v1/traces"}
    _check_tree(got, out)


def test_otlp_over_grpc_when_the_protocol_says_so(tmp_path: Path) -> None:
    """OTEL_EXPORTER_OTLP_PROTOCOL=grpc: the same tree reaches a gRPC-only receiver (it
    went over HTTP, so a collector on 4317 alone got nothing)."""
    with otlp_grpc_receiver() as got:
        out = _traced_run(tmp_path, got, OTEL_EXPORTER_OTLP_PROTOCOL="grpc")
    assert got.paths and set(got.paths) == {"TraceService/Export"}
    _check_tree(got, out)


def _check_tree(got: Received, out: dict[str, Any]) -> None:
    spans = {s["name"]: s for s in got.spans}
    assert len({s["trace_id"] for s in got.spans}) == 1  # one tree
    assert {s["resource"]["service.name"] for s in got.spans} == {"nightly-evals"}
    parent = {name: next((p["name"] for p in got.spans if p["span_id"] == s["parent_id"]), None)
              for name, s in spans.items()}
    assert parent == {
        "experiment otel/traced": None, "row r1": "experiment otel/traced",
        "task answer": "row r1", "evaluator sunny": "row r1",
        "openai.chat": "task answer", "retrieve": "task answer", "embed": "retrieve",
        "invoke_agent agent": "task answer", "chat local-policy": "invoke_agent agent",
        "weather": "invoke_agent agent", "forecast": "task answer"}
    assert spans["chat local-policy"]["attributes"]["gen_ai.operation.name"] == "chat"
    # the conventions' span kinds: a model call CLIENT, a tool and a local agent INTERNAL
    assert (spans["chat local-policy"]["kind"], spans["openai.chat"]["kind"]) == (3, 3)
    assert (spans["weather"]["kind"], spans["invoke_agent agent"]["kind"]) == (1, 1)
    assert spans["chat local-policy"]["attributes"]["gen_ai.request.model"] == "local-policy"
    assert spans["chat local-policy"]["attributes"]["gen_ai.usage.input_tokens"] > 0
    tool = spans["weather"]["attributes"]
    assert tool["gen_ai.operation.name"] == "execute_tool" and tool["gen_ai.tool.name"] == "weather"
    assert json.loads(tool["gen_ai.tool.call.arguments"]) == {"city": "Paris"}
    assert spans["forecast"]["attributes"]["gen_ai.tool.name"] == "forecast"  # not Kit.forecast
    assert spans["invoke_agent agent"]["attributes"]["gen_ai.operation.name"] == "invoke_agent"
    assert spans["invoke_agent agent"]["attributes"]["gen_ai.agent.name"] == "agent"
    assert spans["openai.chat"]["attributes"]["gen_ai.usage.input_tokens"] == 11
    events = spans["task answer"]["events"]
    assert events == [("gen_ai.evaluation.result", {
        "gen_ai.evaluation.name": "sunny", "gen_ai.evaluation.score.value": 1.0,
        "gen_ai.evaluation.score.label": "pass"})]
    row, task = spans["row r1"], spans["task answer"]
    assert row["start"] <= task["start"] < task["end"] <= row["end"]
    # the user's spans, captured into the results with their attributes read
    captured = {s["name"]: s for s in out["spans"]}
    assert captured["openai.chat"]["kind"] == "llm" and captured["openai.chat"]["input_tokens"] == 11
    assert captured["openai.chat"]["model"] == "gpt-4o-mini"
    assert captured["retrieve"]["kind"] == "retrieval"
    assert captured["retrieve"]["arguments"] == "paris weather"
    assert captured["embed"]["parent_id"] == captured["retrieve"]["span_id"]
    assert out["reports"]["opentelemetry"] == {"spans": len(got.spans), "exported": len(got.spans),
                                               "failed": 0}


def test_a_receiver_that_is_down_is_reported_never_the_runs_failure(tmp_path: Path) -> None:
    script = tmp_path / "traced.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "PYTHONPATH": str(ROOT),
           "OTEL_EXPORTER_OTLP_TIMEOUT": "2"}
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "results")], env=env,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])["reports"]["opentelemetry"]
    assert report["exported"] == 0 and report["failed"] == report["spans"] > 0
    assert "not exported (the receiver refused or did not answer; is the " in done.stderr


def test_a_big_run_goes_out_in_batches_and_none_is_dropped(tmp_path: Path) -> None:
    script = tmp_path / "traced.py"
    script.write_text(SCRIPT)
    with otlp_receiver() as got:
        env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": got.url, "PYTHONPATH": str(ROOT)}
        done = subprocess.run([sys.executable, str(script), str(tmp_path / "results"), "150"],
                              env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])["reports"]["opentelemetry"]
    # per row: the row, its task and evaluator, 3 user spans, the agent, 2 model calls, 2 tools
    assert report == {"spans": 1 + 150 * 11, "exported": 1 + 150 * 11, "failed": 0}
    assert len(got.spans) == report["spans"] and len(got.paths) >= 3  # batches of 512
    rows = [s for s in got.spans if s["name"].startswith("row ")]
    assert len(rows) == 150 and len({s["trace_id"] for s in got.spans}) == 1


def test_the_traces_own_protocol_variable_wins_and_a_bad_one_says_the_choices(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

    for variable in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        monkeypatch.delenv(variable, raising=False)
    assert (otel.protocol(), otel.exporter_class()) == (("http/protobuf", None), Http)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
    assert otel.exporter_class() is Grpc  # the traces' own variable over the general one
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")
    with pytest.raises(ConfigError, match=r"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL='http/json' is not an "
                       r"OTLP protocol .* use 'http/protobuf' or 'grpc'"):
        otel.exporter_class()


def test_grpc_without_its_extra_stops_the_run_at_its_start_naming_the_extra(
        monkeypatch: pytest.MonkeyPatch, results_dir: Path) -> None:
    """The gRPC exporter not installed (its import made to fail, as without the extra):
    a ConfigError before any row, saying which extra to install."""
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.grpc", None)
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.grpc.trace_exporter", None)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    ran: list[str] = []

    @task
    def answer(evaluated_model_input: str) -> str:
        ran.append(evaluated_model_input)
        return "x"

    with pytest.raises(ConfigError) as raised:
        run_experiment("otel", data=[{"evaluated_model_input": "q"}], task=answer, backend="local",
                       results_dir=results_dir, print_summary=False, html_report=False)
    assert str(raised.value).startswith(
        "exporting spans over OTLP grpc (OTEL_EXPORTER_OTLP_PROTOCOL) needs "
        "opentelemetry-exporter-otlp-proto-grpc, which is not installed")
    assert "pip install 'patronus-tasks[otlp-grpc]'" in str(raised.value)
    assert ran == [] and not any(results_dir.rglob("results.parquet"))
