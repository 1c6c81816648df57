"""The recorder's lean client of the Prefect API (`prefect.lean`): the settings read from
the environment as Prefect reads them, or left to Prefect when a file could set one; the
headers, retries and CSRF tokens of Prefect's client; a recorder process that records an
experiment without importing Prefect."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from patronus_tasks.prefect import client_settings, internal
from patronus_tasks.prefect.client_settings import CLIENT_SETTINGS, ClientSettings
from patronus_tasks.prefect.lean import LeanClient

from .conftest import ROOT
from .servers import Recorded, Reply, serve


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No client setting in the environment, an empty working directory and Prefect home
    (no profile, no settings file): what a test sets is all there is."""
    for name in list(os.environ):
        if name.upper() in CLIENT_SETTINGS or name.upper().startswith("PREFECT_PROFILE"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _prefects_reading() -> ClientSettings | None:
    """What Prefect reads now (a new `Settings`: the environment, the files, the profile),
    in `ClientSettings`' terms."""
    from prefect.settings.models.root import Settings

    s = Settings()
    if not s.api.url:
        return None

    def secret(value: Any) -> str | None:
        return value.get_secret_value() if value is not None else None

    return ClientSettings(
        api_url=s.api.url, auth_string=secret(s.api.auth_string) or None,
        api_key=secret(s.api.key) or None, tls_insecure=s.api.tls_insecure_skip_verify,
        cert_file=s.api.ssl_cert_file or None, http2=s.api.enable_http2,
        timeout=s.api.request_timeout, max_retries=s.client.max_retries,
        jitter=s.client.retry_jitter_factor,
        extra_codes=frozenset(int(c) for c in (s.client.retry_extra_codes or ())),
        csrf=s.client.csrf_support_enabled, headers=dict(s.client.custom_headers or {}),
        cloud_api_url=s.cloud.api_url, ui_url=s.ui_url)


@pytest.mark.parametrize("env", [
    {"PREFECT_API_URL": "http://127.0.0.1:4200/api"},
    {"PREFECT_API_URL": "https://prefect.example.com/api", "PREFECT_API_AUTH_STRING": "u:p",
     "PREFECT_API_KEY": "k", "PREFECT_CLIENT_CSRF_SUPPORT_ENABLED": "false",
     "PREFECT_CLIENT_CUSTOM_HEADERS": '{"X-Team": "evals"}', "PREFECT_API_REQUEST_TIMEOUT": "12.5",
     "PREFECT_CLIENT_MAX_RETRIES": "2", "PREFECT_CLIENT_RETRY_JITTER_FACTOR": "0",
     "PREFECT_CLIENT_RETRY_EXTRA_CODES": "404,409", "PREFECT_API_ENABLE_HTTP2": "yes",
     "PREFECT_API_TLS_INSECURE_SKIP_VERIFY": "1", "PREFECT_UI_URL": "https://ui.example.com"},
    {"PREFECT_API_URL": "https://api.prefect.cloud/api/accounts/a1/workspaces/w2",
     "PREFECT_API_KEY": "pnu_x", "PREFECT_CLIENT_RETRY_EXTRA_CODES": "[500]"},
    {"prefect_api_url": "http://127.0.0.1:4200/api", "PREFECT_CLOUD_API_URL": "https://c.example/api",
     "PREFECT_CLOUD_UI_URL": "https://c-ui.example"},
])
def test_the_environment_reads_as_prefect_reads_it(clean_env: Path, env: dict[str, str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert client_settings.from_env(os.environ) == _prefects_reading()


def _profile(home: Path, active: str, **settings: str) -> None:
    home.mkdir(parents=True, exist_ok=True)
    lines = [f'active = "{active}"', f"[profiles.{active}]",
             *(f'{k} = "{v}"' for k, v in settings.items())]
    (home / "profiles.toml").write_text("\n".join(lines) + "\n")


def test_what_a_file_may_set_is_left_to_prefect(clean_env: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    url = "http://127.0.0.1:4200/api"
    monkeypatch.setenv("PREFECT_API_URL", url)
    home = clean_env / "home"
    # A profile's key the environment lacks: Prefect sends it, so the environment alone
    # would not; the URL it also sets is the environment's (which wins).
    _profile(home, "team", PREFECT_API_KEY="from-profile", PREFECT_API_URL="http://other/api")
    assert _prefects_reading() == ClientSettings(url, api_key="from-profile", ui_url=url[:-4],
                                                 cert_file=os.environ.get("SSL_CERT_FILE"))
    assert client_settings.from_env(os.environ) is None
    monkeypatch.setenv("PREFECT_API_KEY", "from-env")  # the environment's wins: it decides
    assert client_settings.from_env(os.environ) == _prefects_reading()
    _profile(home, "plain", PREFECT_SERVER_EPHEMERAL_ENABLED="true")  # no client setting
    assert client_settings.from_env(os.environ) == _prefects_reading()
    for name, text in ((".env", "PREFECT_API_AUTH_STRING=a:b\n"), ("prefect.toml", "[api]\n"),
                       ("pyproject.toml", '[tool.prefect.api]\nkey = "k"\n')):
        (clean_env / name).write_text(text)
        assert client_settings.from_env(os.environ) is None, name
        (clean_env / name).unlink()
    assert client_settings.from_env(os.environ) is not None
    monkeypatch.setenv("PREFECT_API_ENABLE_HTTP2", "maybe")  # Prefect says what is wrong
    assert client_settings.from_env(os.environ) is None
    monkeypatch.delenv("PREFECT_API_URL")  # Prefect's built-in server
    monkeypatch.delenv("PREFECT_API_ENABLE_HTTP2")
    assert client_settings.from_env(os.environ) is None


def _settings(url: str, **given: Any) -> ClientSettings:
    return ClientSettings(api_url=f"{url}/api", jitter=0.0, **given)


_ASIDE = {"host", "content-length", "content-type", "accept", "accept-encoding", "connection"}


def test_it_sends_the_headers_prefects_client_sends(clean_env: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.client.orchestration import PrefectClient
    from prefect.settings import PREFECT_CLIENT_CUSTOM_HEADERS, temporary_settings

    monkeypatch.setenv("PREFECT__DEPLOYMENT_NAME", "nightly")  # a worker's flow run's
    with serve(lambda r: (200, {}, {"id": "f"})) as fake:
        given = {"auth_string": "user:secret", "headers": {"X-Team": "evals"}, "csrf": False}

        async def both() -> None:
            async with LeanClient(_settings(fake.url, **given)) as lean:
                await internal.create_flow(lean, "f")
            with temporary_settings({PREFECT_CLIENT_CUSTOM_HEADERS: {"X-Team": "evals"}}):
                async with PrefectClient(f"{fake.url}/api", auth_string="user:secret") as client:
                    client._client.enable_csrf_support = False
                    await internal.create_flow(client, "f")

        asyncio.run(both())
    lean_sent, prefect_sent = ({k: v for k, v in r.headers.items() if k not in _ASIDE}
                               for r in fake.requests)
    assert lean_sent == prefect_sent
    assert lean_sent["authorization"].startswith("Basic ") and lean_sent["x-team"] == "evals"
    assert lean_sent["x-prefect-deployment-name"] == "nightly"


def _answers(*replies: Reply) -> Iterator[Reply]:
    yield from replies
    while True:
        yield 200, {}, {"id": "done"}


def test_it_retries_as_prefects_client_does(clean_env: Path) -> None:
    replies = _answers((429, {"Retry-After": "0.3"}, {}), (503, {"Retry-After": "0.2"}, {}))
    with serve(lambda r: next(replies)) as fake:
        async def read() -> tuple[dict[str, Any], float]:
            began = time.monotonic()
            async with LeanClient(_settings(fake.url)) as lean:
                found = await internal.read_flow_run(lean, "x")
            return found, time.monotonic() - began

        found, took = asyncio.run(read())
        assert found == {"id": "done"} and len(fake.requests) == 3 and took >= 0.5  # as asked
    refused = _answers(*[(429, {"Retry-After": "0"}, {})] * 3, (404, {}, {"detail": "no"}))
    with serve(lambda r: next(refused)) as fake:
        async def read(retries: int) -> None:
            async with LeanClient(_settings(fake.url, max_retries=retries)) as lean:
                await internal.read_flow_run(lean, "x")

        with pytest.raises(httpx.HTTPStatusError) as gave_up:
            asyncio.run(read(1))  # one retry, then the answer stands
        assert gave_up.value.response.status_code == 429 and len(fake.requests) == 2
        with pytest.raises(httpx.HTTPStatusError) as refused_at_once:
            asyncio.run(read(5))
        assert refused_at_once.value.response.status_code == 404 and len(fake.requests) == 4


class _CsrfServer:
    """Answers as Prefect's CSRF middleware does (`server up`'s servers turn it on)."""

    def __init__(self, on: bool) -> None:
        self.on = on

    def __call__(self, r: Recorded) -> Reply:
        if r.path.startswith("/api/csrf-token"):
            if not self.on:
                return 422, {}, {"detail": "CSRF protection is disabled."}
            return 200, {}, {"token": "t0k", "client": "c", "expiration": "2999-01-01T00:00:00Z"}
        if r.method == "POST" and self.on and r.headers.get("prefect-csrf-token") != "t0k":
            return 403, {}, {"detail": "Missing CSRF token."}
        return 200, {}, {"id": "made"}


def test_csrf_tokens_are_asked_for_once_a_server_wants_them(clean_env: Path) -> None:
    async def two_clients(url: str) -> None:
        for _ in range(2):  # the token is the process's: the second client sends it at once
            async with LeanClient(_settings(url)) as lean:
                await internal.create_flow(lean, "f")  # through the retry loop
                await internal.post_events(lean, b"[]")  # sent once, past it

    with serve(_CsrfServer(on=False)) as fake:
        asyncio.run(two_clients(fake.url))
        assert [r.path for r in fake.requests] == ["/api/flows/", "/api/events"] * 2  # no token asked
    with serve(_CsrfServer(on=True)) as fake:
        asyncio.run(two_clients(fake.url))
        sent = [(r.path.split("?")[0], r.headers.get("prefect-csrf-token")) for r in fake.requests]
        assert sent == [("/api/flows/", None), ("/api/csrf-token", None), ("/api/flows/", "t0k"),
                        ("/api/events", "t0k"), ("/api/flows/", "t0k"), ("/api/events", "t0k")]
    with serve(_CsrfServer(on=True)) as fake:  # a client told to send none (as Prefect's)
        with pytest.raises(httpx.HTTPStatusError):
            asyncio.run(_one_post(_settings(fake.url, csrf=False)))
        assert len(fake.requests) == 1


async def _one_post(s: ClientSettings) -> None:
    async with LeanClient(s) as lean:
        await internal.create_flow(lean, "f")


_SEES_IMPORTS = """
import atexit, os, sys
if "patronus_tasks.prefect.recorder" in " ".join(sys.orig_argv):
    def said() -> None:
        with open(os.environ["SEEN_IMPORTS"], "w") as out:
            loaded = {m.split(".")[0] for m in sys.modules}
            out.write(" ".join(sorted(m for m in sys.modules if m.split(".")[0] == "prefect")) + "|"
                      + " ".join(sorted(loaded & {"pandas", "pyarrow", "numpy", "matplotlib"})))
    atexit.register(said)
else:  # the experiment's process: it computes the post-run, without Prefect either
    def said_here() -> None:
        with open(os.environ["SEEN_IMPORTS"] + ".experiment", "w") as out:
            out.write(" ".join(sorted(m for m in sys.modules if m.split(".")[0] == "prefect")))
    atexit.register(said_here)
"""

_EXPERIMENT = """
import json
from patronus_tasks import evaluator, run_experiment, task

@task
def upper(evaluated_model_input: str) -> str:
    return evaluated_model_input.upper()

@evaluator
def long_enough(evaluated_model_output: str) -> bool:
    return len(evaluated_model_output) > 1

exp = run_experiment("lean", data=[{"evaluated_model_input": f"q{i}"} for i in range(3)],
                     task=upper, evaluators=[long_enough], results_dir="results",
                     print_summary=False)
print(json.dumps({"recorded": exp.wait_recorded(120), "flow_run_id": exp.manifest["flow_run_id"]}))
"""


def test_the_recorder_process_records_without_importing_prefect(
        prefect_server: str, tmp_path: Path) -> None:
    """An experiment, its task runs, artifacts and final state, recorded by a process
    that never loaded Prefect (its environment gives the API's URL), nor pandas, pyarrow
    or matplotlib: the experiment's process computed the post-run (charts included), the
    recorder only asked the server and posted what it made."""
    (tmp_path / "sees").mkdir()
    (tmp_path / "sees" / "sitecustomize.py").write_text(_SEES_IMPORTS)
    seen = tmp_path / "seen.txt"
    env = {k: v for k, v in os.environ.items() if k.upper() not in CLIENT_SETTINGS}
    env.update(PREFECT_API_URL=prefect_server, SEEN_IMPORTS=str(seen),
               PYTHONPATH=os.pathsep.join([str(tmp_path / "sees"), str(ROOT)]))
    ran = subprocess.run([sys.executable, "-c", _EXPERIMENT], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    out = json.loads(ran.stdout.strip().splitlines()[-1])
    assert seen.exists(), ran.stderr[-3000:]
    assert out["recorded"] and seen.read_text() == "|", seen.read_text()[:300]
    experiment_side = Path(f"{seen}.experiment").read_text()
    assert experiment_side == "", experiment_side[:300]  # the UI's path came from the recorder
    api = httpx.Client(base_url=prefect_server, timeout=30)
    run = api.get(f"/flow_runs/{out['flow_run_id']}").json()
    assert run["state_type"] == "COMPLETED" and "Results: " in run["state"]["message"]
    task_runs = api.post("/task_runs/filter", json={
        "flow_runs": {"id": {"any_": [out["flow_run_id"]]}}}).json()
    assert len(task_runs) == 6 and {r["state_type"] for r in task_runs} == {"COMPLETED"}
    made = api.post("/artifacts/filter", json={
        "artifacts": {"flow_run_id": {"any_": [out["flow_run_id"]]}}}).json()
    assert {a["type"] for a in made} == {"table", "markdown", "progress"}
    assert {a["key"] for a in made} >= {"lean-summary", "lean-report", "lean-results",
                                        "lean-vs-previous", "lean-history", "lean-charts",
                                        "lean-baseline"}, sorted(a["key"] for a in made)
    charts = next(a for a in made if a["key"] == "lean-charts")["data"]
    assert charts.count("](data:image/png;base64,") >= 2


_DIES_COMPUTING = _EXPERIMENT.replace("import json\n", """import json, os, time
from patronus_tasks.prefect.ui import artifacts

def dies(*args, **kwargs):
    time.sleep(1.0)  # the writes made before this one reach the recorder, which applies them
    os._exit(3)

artifacts.publish_history = dies
""")


def test_a_post_run_whose_process_dies_computing_it_is_finished_once_by_the_recorder(
        prefect_server: str, tmp_path: Path) -> None:
    """The experiment's process computes the post-run and dies midway (after its first
    artifacts were applied): the recorder computes it again and applies what was not
    made yet. Every artifact once, the final state set."""
    env = {k: v for k, v in os.environ.items() if k.upper() not in CLIENT_SETTINGS}
    env.update(PREFECT_API_URL=prefect_server, PYTHONPATH=str(ROOT))
    ran = subprocess.run([sys.executable, "-c", _DIES_COMPUTING.replace('"lean"', '"dies"')],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 3, ran.stderr[-3000:]
    api = httpx.Client(base_url=prefect_server, timeout=30)
    body = {"flow_runs": {"tags": {"all_": ["project:dies"]}}}
    deadline = time.monotonic() + 120
    while (runs := api.post("/flow_runs/filter", json=body).json()) and \
            runs[0]["state_type"] == "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert len(runs) == 1 and runs[0]["state_type"] == "COMPLETED", runs
    made = api.post("/artifacts/filter", json={
        "artifacts": {"flow_run_id": {"any_": [runs[0]["id"]]}}}).json()
    keys = sorted(a["key"] for a in made if a["type"] != "progress")
    assert keys == ["dies-baseline", "dies-charts", "dies-history", "dies-report",
                    "dies-results", "dies-summary", "dies-vs-previous"], keys


def test_a_server_that_just_answered_is_asked_for_its_health_all_the_same(clean_env: Path) -> None:
    """Before a run's post-run: an answer a moment before proves nothing (a server killed
    in that moment lost the whole post-run), so its health is asked each time."""
    with serve(lambda r: (200, {}, {})) as fake:
        async def ask() -> list[bool]:
            async with LeanClient(_settings(fake.url)) as lean:
                said = [await internal.answers(lean)]
                await internal.post_events(lean, b"[]")
                return [*said, await internal.answers(lean)]  # asked again: it just answered

        assert asyncio.run(ask()) == [True, True]
        assert [r.path for r in fake.requests] == ["/api/health", "/api/events", "/api/health"]
        gone = fake.url
    async def after() -> bool:
        async with LeanClient(_settings(gone)) as lean:
            return await internal.answers(lean)

    assert asyncio.run(after()) is False  # stopped: it does not answer
