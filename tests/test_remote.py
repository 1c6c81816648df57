"""Patronus remote evaluators and OpenAI-compatible judges and tasks, against real local
HTTP servers that record requests and misbehave on demand."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from patronus_tasks import Client, ConfigError, RemoteAPIError, UnparseableResponseError, run_experiment
from patronus_tasks.openai import ChatTask, LLMJudge, openai_endpoint, parse_verdict

from .servers import FakeServer, PatronusAPI, Recorded, Reply, chat_completion, echo_chat, serve

KEY = "pt-test-SECRET-0123456789"
DATA = [
    {"evaluated_model_system_prompt": "You are a helpful assistant.",
     "evaluated_model_input": "How do I write a Python function?",
     "evaluated_model_output": "def f(): pass"},
    {"evaluated_model_system_prompt": "You are a creative poet who loves abstract ideas.",
     "evaluated_model_input": "What is 2 + 2?", "evaluated_model_output": "Four petals"},
]
CONFIG = {"pass_criteria": "The MODEL OUTPUT should accurately and concisely answer the USER INPUT."}


@pytest.fixture
def patronus(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeServer, PatronusAPI]]:
    api = PatronusAPI()
    with serve(api) as server:
        monkeypatch.setenv("PATRONUS_API_KEY", KEY)
        monkeypatch.setenv("PATRONUS_API_URL", server.url)
        yield server, api


def _run(results_dir: Path, evaluators: list[Any], data: list[dict[str, Any]] = DATA,
         **kwargs: Any) -> pd.DataFrame:
    exp = run_experiment("remote", data=data, evaluators=evaluators, backend="local",
                         results_dir=results_dir, print_summary=False, **kwargs)
    return exp.to_dataframe().sort_values("sid").reset_index(drop=True)


def _evaluate_requests(server: FakeServer) -> list[Recorded]:
    return [r for r in server.requests if r.path == "/v1/evaluate"]


def test_remote_evaluator_creates_criteria_and_scores_each_row(
        patronus: tuple[FakeServer, PatronusAPI], results_dir: Path) -> None:
    server, _api = patronus
    judge = Client().remote_evaluator("custom-large", "is-on-point", profile_config=CONFIG,
                                      allow_update=True)
    df = _run(results_dir, [judge])
    assert [r.path.split("?")[0] for r in server.requests[:3]] == [
        "/v1/evaluators", "/v1/evaluator-criteria", "/v1/evaluator-criteria"]
    assert server.requests[2].body == {"name": "is-on-point", "evaluator_family": "custom",
                                       "config": CONFIG}
    assert "evaluator_family=custom" in server.requests[1].path
    assert all(r.headers["x-api-key"] == KEY for r in server.requests)
    sent = sorted(_evaluate_requests(server), key=lambda r: r.body["evaluated_model_input"])
    assert sent[0].body == {
        "evaluators": [{"evaluator": "custom-large", "criteria": "is-on-point",
                        "explain_strategy": "always"}],
        "evaluated_model_system_prompt": "You are a helpful assistant.",
        "evaluated_model_retrieved_context": None,
        "evaluated_model_input": "How do I write a Python function?",
        "evaluated_model_output": "def f(): pass", "evaluated_model_gold_answer": None,
        "tags": {},
    }
    assert df["pass"].tolist() == [True, False]
    assert df["score"].tolist() == [1.0, 0.0]
    assert df["explanation"].tolist() == ["on point", "rambles"]
    assert df["evaluation_duration_s"].tolist() == [0.5, 0.5]
    assert df["evaluator_name"].tolist() == ["is-on-point"] * 2
    assert '"positions": []' in df["evaluation_metadata"][0]
    # each remote judgement is a model call made elsewhere: an llm span, no key in it
    spans = [json.loads(s)[0] for s in df["evaluation_spans"]]
    assert [(s["name"], s["kind"], s["model"]) for s in spans] == [
        ("patronus custom-large", "llm", "custom-large:is-on-point")] * 2
    assert KEY not in df.to_csv()


def test_criteria_update_needs_allow_update(patronus: tuple[FakeServer, PatronusAPI],
                                            results_dir: Path) -> None:
    server, api = patronus
    api.criteria["is-on-point"] = {"name": "is-on-point", "revision": 2,
                                   "config": {"pass_criteria": "old words"}}
    strict = Client().remote_evaluator("custom-large", "is-on-point", profile_config=CONFIG)
    with pytest.raises(ConfigError) as err:
        _run(results_dir, [strict])
    assert "'old words' on the server" in str(err.value) and "allow_update=True" in str(err.value)
    assert _evaluate_requests(server) == []  # nothing scored before the mistake was fixed
    updating = Client().remote_evaluator("custom-large", "is-on-point", criteria_config=CONFIG,
                                         allow_update=True)
    _run(results_dir, [updating])
    assert api.criteria["is-on-point"]["revision"] == 3
    assert any(r.path == "/v1/evaluator-criteria/is-on-point/revision" for r in server.requests)
    with pytest.raises(ConfigError, match="no evaluator 'nope'"):
        _run(results_dir, [Client().remote_evaluator("nope", "is-on-point")])


def test_remote_evaluator_without_a_key_fails_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PATRONUS_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="set PATRONUS_API_KEY"):
        Client().remote_evaluator("custom-large", "is-on-point")


@pytest.mark.parametrize(
    ("faults", "requests", "error"),
    [
        (["429"], 2, None),
        (["500", "500"], 3, None),
        (["500", "500", "500"], 3, "failed after 3 attempts: HTTP 500; HTTP 500; HTTP 500"),
        (["400"], 1, "HTTP 400 (not retried)"),
        (["garbage"], 1, "not JSON"),
        (["hang", "hang", "hang"], 3, "ReadTimeout; ReadTimeout; ReadTimeout"),
    ],
)
def test_retries_and_faults(patronus: tuple[FakeServer, PatronusAPI], results_dir: Path,
                            faults: list[str], requests: int, error: str | None,
                            caplog: pytest.LogCaptureFixture) -> None:
    server, api = patronus
    api.faults, api.hang_seconds = list(faults), 1.0
    judge = Client().remote_evaluator("custom-large", "is-on-point", profile_config=CONFIG,
                                      timeout=0.3)
    judge.endpoint.backoff = 0.01
    caplog.set_level(logging.WARNING, logger="patronus_tasks.http")
    df = _run(results_dir, [judge], data=DATA[:1])
    assert len(_evaluate_requests(server)) == requests
    if error is None:
        assert df["status"][0] == "ok" and df["pass"][0]
        assert f'"http_attempts": {requests}' in df["evaluation_metadata"][0]
    else:
        # A Patronus judge that gives no verdict is unscored, as every judge.
        assert df["error_type"][0] == "JudgeError" and error in df["error_message"][0]
        assert "judge 'is-on-point' did not answer" in df["error_message"][0]
    retries = [r.getMessage() for r in caplog.records if "retry" in r.getMessage()]
    assert len(retries) == (requests - 1 if "not retried" not in (error or "") else 0)
    if faults == ["429"]:
        assert retries == ["POST /v1/evaluate: HTTP 429; retry 1/2 in 0.10s"]  # Retry-After


def test_connection_refused_is_retried_then_recorded(results_dir: Path) -> None:
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    judge = LLMJudge("j", "be right", endpoint=openai_endpoint(f"http://127.0.0.1:{port}"))
    judge.endpoint.backoff = 0.01
    df = _run(results_dir, [judge], data=DATA[:1])
    assert df["error_message"][0].endswith(
        "failed after 3 attempts: ConnectError; ConnectError; ConnectError (nothing answered "
        "there: is the server up, and the URL right?)")
    assert df["error_type"][0] == "JudgeError"  # no answer: unscored, not a fail


def test_in_flight_limit_is_per_endpoint(patronus: tuple[FakeServer, PatronusAPI],
                                         results_dir: Path) -> None:
    _server, api = patronus
    api.delay = 0.1
    judge = Client().remote_evaluator("custom-large", "is-on-point", profile_config=CONFIG,
                                      max_in_flight=2)
    data = [dict(DATA[0], evaluated_model_input=f"q{i}") for i in range(12)]
    _run(results_dir, [judge], data=data, max_concurrency=12)
    assert api.max_in_flight == 2


def _judge_server(answers: list[str]) -> Any:
    def handle(req: Recorded) -> Reply:
        return 200, {}, chat_completion(answers.pop(0) if answers else "{}")
    return handle


def test_llm_judge_sends_the_criteria_and_parses_the_verdict(results_dir: Path) -> None:
    answers = ['```json\n{"pass": true, "score": 0.9, "explanation": "fine"}\n```',
               "I think it passes, honestly."]
    with serve(_judge_server(answers)) as server:
        judge = LLMJudge("on-point", CONFIG["pass_criteria"], model="judge-1",
                         endpoint=openai_endpoint(server.url, "sk-judge-SECRET-99"))
        df = _run(results_dir, [judge], max_concurrency=1)
    body = server.requests[0].body
    assert body["model"] == "judge-1" and body["temperature"] == 0
    assert "PASS CRITERIA:\nThe MODEL OUTPUT should accurately" in body["messages"][1]["content"]
    assert "MODEL OUTPUT:\ndef f(): pass" in body["messages"][1]["content"]
    assert server.requests[0].headers["authorization"] == "Bearer sk-judge-SECRET-99"
    assert df["pass"][0] == True and df["score"][0] == 0.9  # noqa: E712
    assert df["error_type"][1] == "UnparseableResponseError"
    assert "I think it passes, honestly." in df["error_message"][1]
    assert pd.isna(df["pass"][1]) and pd.isna(df["score"][1])  # never a silent pass or NaN score


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"pass": false, "explanation": "no"}', (False, 0.0)),
        ('{"score": 0.7}', (True, 0.7)),
        ('{"score": 0.2}', (False, 0.2)),
    ],
)
def test_parse_verdict(text: str, expected: tuple[bool, float]) -> None:
    result = parse_verdict(text)
    assert (result.pass_, result.score_raw) == expected


@pytest.mark.parametrize("text", ["", "{}", '{"pass": "yes"}', '{"score": true}', "{not json}"])
def test_unparseable_verdicts(text: str) -> None:
    with pytest.raises(UnparseableResponseError) as err:
        parse_verdict(text)
    assert err.value.raw == text


def test_chat_task_records_model_facts(results_dir: Path) -> None:
    with serve(echo_chat) as server:
        chat = ChatTask("gpt-4o", endpoint=openai_endpoint(server.url), temperature=1,
                        max_tokens=200)
        exp = run_experiment("chat", data=DATA[:1], task=chat, backend="local",
                             results_dir=results_dir, print_summary=False)
    df = exp.to_dataframe()
    assert df["task_output"][0] == "[You are a helpful assistant.] How do I write a Python function?"
    meta = df["task_metadata"][0]
    for fact in ('"evaluated_model_name": "gpt-4o"', '"evaluated_model_provider": "openai"',
                 '"evaluated_model_params": {"temperature": 1, "max_tokens": 200}'):
        assert fact in meta
    assert server.requests[0].body["max_tokens"] == 200
    assert "authorization" not in server.requests[0].headers  # no key, no header


def test_endpoint_error_messages_redact_the_key() -> None:
    def leaky(req: Recorded) -> Reply:
        return 401, {}, {"detail": f"bad key {req.headers['x-api-key']}"}

    async def go(url: str) -> None:
        from patronus_tasks.http import Endpoint

        ep = Endpoint(url, headers={"x-api-key": KEY})
        try:
            await ep.request("GET", "/v1/evaluators")
        finally:
            await ep.aclose()

    with serve(leaky) as server, pytest.raises(RemoteAPIError) as err:
        asyncio.run(go(server.url))
    assert KEY not in str(err.value) and "bad key ***" in str(err.value)
    assert err.value.status == 401 and err.value.attempts == 1


def test_http_errors_name_the_url_without_its_credentials_and_say_what_to_check(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A base URL may carry a proxy's user:password or a key in its query: the message
    names the URL (which one failed) with those as ***; a 404 says what to check."""
    from patronus_tasks.http import Endpoint

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)

    def not_found(req: Recorded) -> Reply:
        return 404, {}, {"error": {"message": "no such route"}}

    with serve(not_found) as server:
        host = server.url.removeprefix("http://")
        url = f"http://alice:pa55word@{host}/v1?api-key=SECRETQ"
        # No key: the URL's user:password is the Basic auth (with a key: refused, see
        # tests/test_security.py).
        for endpoint, hint in ((Endpoint(url), "check the base URL and the path"),
                               (openai_endpoint(url, ""), "usually ends in /v1")):
            with pytest.raises(RemoteAPIError) as err:
                asyncio.run(endpoint.request("POST", "/chat/completions", json={}))
            said = str(err.value)
            assert f"http://***:***@{host}/v1?api-key=***" in said and hint in said, said
            assert "pa55word" not in said and "SECRETQ" not in said and "alice" not in said
            assert "pa55word" not in repr(endpoint)
