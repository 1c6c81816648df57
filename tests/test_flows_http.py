"""flows/openai_task.py (the reference's full example) against local stand-ins, and a
scan of everything such a run writes for the API keys it used."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from patronus_tasks import Client
from patronus_tasks.openai import LLMJudge, openai_endpoint

from .conftest import ROOT
from .servers import PatronusAPI, Recorded, Reply, chat_completion, echo_chat, serve

OPENAI_KEY = "sk-test-SECRET-openai-9f8e7d6c5b4a"
PATRONUS_KEY = "pt-test-SECRET-patronus-1a2b3c4d5e"


def _flow_env(tmp_path: Path, openai_url: str, patronus_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OPENAI_", "PATRONUS_"))}  # PREFECT_API_URL: the shared server
    env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), OPENAI_BASE_URL=openai_url + "/v1",
               OPENAI_API_KEY=OPENAI_KEY, PATRONUS_API_KEY=PATRONUS_KEY,
               PATRONUS_API_URL=patronus_url, PATRONUS_TASKS_RESULTS_DIR=str(tmp_path / "results"),
               **extra)
    return env


def _run_flow(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "flows" / "openai_task.py")], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=300)


def _files_containing(root: Path, secret: str) -> list[str]:
    hits = []
    for path in root.rglob("*"):
        if path.is_file() and secret.encode() in path.read_bytes():
            hits.append(str(path))
    return hits


def test_full_example_flow_end_to_end_and_no_key_is_written(tmp_path: Path,
                                                            prefect_server_home: Path) -> None:
    api = PatronusAPI()
    api.faults = ["500", "429"]  # retried: the retry logs must not carry the key either
    with serve(echo_chat) as openai, serve(api) as patronus:
        out = _run_flow(_flow_env(tmp_path, openai.url, patronus.url), tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "is-on-point [link 0]" in out.stdout and "Pass rate : 66.7%  (2/3)" in out.stdout
    assert openai.requests[0].headers["authorization"] == f"Bearer {OPENAI_KEY}"
    assert openai.requests[0].body["max_tokens"] == 200
    manifest = json.loads(next((tmp_path / "results").rglob("manifest.json")).read_text())
    assert manifest["rows"] == 3 and manifest["evaluator_errors"] == 0
    usage = {(u["step"], u["model"]): u for u in manifest["usage"]}  # the answers' usage
    chat = usage[("call_gpt", "gpt-4o")]
    assert (chat["calls"], chat["input_tokens"], chat["output_tokens"]) == (3, 3, 3)
    assert manifest["cost_usd"] == chat["cost_usd"] == pytest.approx((3 * 2.5 + 3 * 10.0) / 1e6)
    assert "Tokens and cost" in out.stdout
    # The scan sees what runs store: task-run names in Prefect's database, outputs in Parquet.
    assert _files_containing(prefect_server_home, "call_gpt-3")
    assert _files_containing(tmp_path / "results", "polymorphism")
    for secret in (OPENAI_KEY, PATRONUS_KEY):
        assert secret not in out.stdout + out.stderr
        assert _files_containing(tmp_path / "results", secret) == []
        # Prefect's database: flow and task runs, parameters, events, logs, artifacts.
        assert _files_containing(prefect_server_home, secret) == []
        assert _files_containing(tmp_path / "prefect-home", secret) == []


def test_flow_with_an_openai_compatible_judge(tmp_path: Path, prefect_server: str) -> None:
    def both(req: Recorded) -> Reply:
        if req.body["messages"][0]["content"].startswith("You are an impartial evaluator"):
            return 200, {}, chat_completion('{"pass": true, "score": 1, "explanation": "ok"}')
        return echo_chat(req)

    with serve(both) as openai:
        out = _run_flow(_flow_env(tmp_path, openai.url, "http://127.0.0.1:9", JUDGE="openai"),
                        tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Pass rate : 100.0%  (3/3)" in out.stdout
    assert len(openai.requests) == 6


def test_reprs_hold_no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATRONUS_API_KEY", PATRONUS_KEY)
    judge = Client().remote_evaluator("custom-large", "is-on-point")
    llm = LLMJudge("j", "be right", endpoint=openai_endpoint("http://127.0.0.1:9", OPENAI_KEY))
    for obj in (judge, judge.endpoint, llm, llm.endpoint, Client(api_key=PATRONUS_KEY)):
        assert PATRONUS_KEY not in repr(obj) and OPENAI_KEY not in repr(obj)
