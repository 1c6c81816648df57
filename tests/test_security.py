"""The security suite: every attack this package defends against, as a test that fails on
code that does not defend against it. The threat model is the README's "Security" section:
model output, datasets and names are untrusted input; the server asks who you are.

Sections (each owned by one part of the defence): the SQL sandbox, Markdown this package
writes, the server's authentication, names and other input.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

# ---------------------------------------------------------------------------------------
# 1. The SQL sandbox: sql_result_match runs the model's query with no files, network,
#    extensions or settings, one statement, within its timeout and result caps.
# ---------------------------------------------------------------------------------------


# (end of the SQL sandbox section)



# ---------------------------------------------------------------------------------------
# 2. Untrusted text is text in every Markdown this package writes.
# ---------------------------------------------------------------------------------------


# (end of the Markdown section)



# ---------------------------------------------------------------------------------------
# 3. A server that asks who you are.
# ---------------------------------------------------------------------------------------
# One stack for the section: `patronus-tasks server up --no-deploy` (server, pool, worker;
# from the suite's migrated database), started as a user starts it. Its secret is read from
# the file `server up` keeps it in (None on a stack that asks nothing: the code before).


class _Asking:
    def __init__(self, home: Path, api_url: str, shown: str) -> None:
        self.home, self.api_url, self.shown = home, api_url, shown  # shown: what `up` printed
        found = home / "auth-string"
        self.secret = found.read_text().strip() if found.exists() else None


def _server_cli(*args: str, **env: str) -> tuple[int, str, str]:
    """``patronus-tasks server ARGS`` as a user runs it (no API of the suite's): its exit
    code, output and errors."""
    import os
    import subprocess
    import sys

    from .conftest import ROOT

    given = {k: v for k, v in os.environ.items()
             if k not in ("PREFECT_API_URL", "PREFECT_API_AUTH_STRING")}
    ran = subprocess.run([sys.executable, "-m", "patronus_tasks", "server", *args], cwd=ROOT,
                         env={**given, **env}, capture_output=True, text=True, timeout=300)
    return ran.returncode, ran.stdout, ran.stderr


@pytest.fixture(scope="module")
def asking(tmp_path_factory: pytest.TempPathFactory, prefect_template_db: Path) -> Iterator[_Asking]:
    from patronus_tasks.prefect.server.stack import Stack

    from .prefect_servers import copy_database, free_port

    home = tmp_path_factory.mktemp("asking")
    copy_database(prefect_template_db, home)  # a migrated database: spares ~20 s of start-up
    code, shown, errors = _server_cli("up", "--home", str(home), "--port", str(free_port()),
                                      "--no-deploy", "--nice", "0", PREFECT_WORKER_QUERY_SECONDS="1")
    assert code == 0, shown + errors
    stack = Stack.load(home)
    assert stack is not None
    try:
        yield _Asking(home, stack.api_url, shown)
    finally:
        _server_cli("down", "--home", str(home))


def _basic(secret: str) -> dict[str, str]:
    import base64

    return {"Authorization": f"Basic {base64.b64encode(secret.encode()).decode()}"}


def test_an_unauthenticated_request_is_refused(asking: _Asking) -> None:
    import httpx

    from .prefect_servers import asked_headers

    api = asking.api_url
    assert httpx.get(f"{api}/admin/version").status_code == 401
    assert httpx.get(f"{api}/admin/version", headers=_basic("not-it")).status_code == 401
    assert asking.secret is not None, "server up made no auth string"
    assert httpx.get(f"{api}/admin/version", headers=_basic(asking.secret)).status_code == 200
    # A change needs a CSRF token (403 without: checked before who asks), and a token
    # needs the auth string: none to be had without it.
    assert httpx.post(f"{api}/flow_runs/filter", json={}).status_code == 403
    assert httpx.get(f"{api}/csrf-token", params={"client": "c"}).status_code == 401
    asked = asked_headers(api, asking.secret)
    assert httpx.post(f"{api}/flow_runs/filter", json={}, headers=asked).status_code == 200
    assert httpx.get(f"{api}/health").status_code == 200  # a load balancer's probe: anyone


def test_its_websockets_the_ui_and_other_origins_are_asked_too(asking: _Asking) -> None:
    import json

    import httpx
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect
    from websockets.typing import Subprotocol

    api, ui = asking.api_url, asking.api_url.removesuffix("/api")
    # Events come in through a websocket, authenticated by its first message.
    with connect(f"ws{api.removeprefix('http')}/events/in", subprotocols=[Subprotocol("prefect")],
                 open_timeout=10) as sock:
        sock.send(json.dumps({"type": "auth", "token": "not-it"}))
        with pytest.raises(ConnectionClosed) as closed:
            sock.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    # The UI asks for the auth string on its login page, and sends CSRF tokens.
    settings = httpx.get(f"{ui}/ui-settings").json()
    assert settings["auth"] == "BASIC" and settings["csrf_enabled"] is True
    # A page of another origin may not call the API from a browser; the UI's own may.
    for origin, allowed in (("http://evil.example", False), (ui, True)):
        asked = httpx.options(f"{api}/flow_runs/filter", headers={
            "Origin": origin, "Access-Control-Request-Method": "POST"})
        assert (asked.headers.get("access-control-allow-origin") == origin) is allowed, origin


async def _attack_with_prefect(api: str, secret: str | None, command: str) -> None:
    """The review's attack as a script with Prefect's own client makes it (a CSRF token
    fetched first): a deployment on the stack's pool whose command is a shell command,
    and a flow run of it."""
    from prefect.client.orchestration import PrefectClient

    async with PrefectClient(api, auth_string=secret) as client:
        flow = (await client._client.post("/flows/", json={"name": "innocent"})).json()["id"]
        deployment = (await client._client.post("/deployments/", json={
            "name": "innocent", "flow_id": flow, "work_pool_name": "local-process",
            "job_variables": {"command": command}})).json()["id"]
        await client._client.post(f"/deployments/{deployment}/create_flow_run", json={})


def _attack_raw(api: str, command: str) -> list[int]:
    """The review's attack as plain HTTP requests: each one's status."""
    import httpx

    said = [httpx.post(f"{api}/flows/", json={"name": "innocent"})]
    flow = said[-1].json().get("id") if said[-1].status_code == 201 else "none"
    said.append(httpx.post(f"{api}/deployments/", json={
        "name": "innocent", "flow_id": flow, "work_pool_name": "local-process",
        "job_variables": {"command": command}}))
    made = said[-1].json().get("id") if said[-1].status_code == 201 else "none"
    said.append(httpx.post(f"{api}/deployments/{made}/create_flow_run", json={}))
    return [r.status_code for r in said]


def test_the_reviews_attack_runs_nothing(asking: _Asking, tmp_path: Path) -> None:
    import asyncio

    import httpx

    from .prefect_servers import asked_headers
    from .waits import until

    ran = tmp_path / "ran"
    command = f"touch {ran}"
    assert set(_attack_raw(asking.api_url, command)) <= {401, 403}
    with pytest.raises(httpx.HTTPStatusError) as refused:
        asyncio.run(_attack_with_prefect(asking.api_url, None, command))
    assert refused.value.response.status_code == 401
    assert asking.secret is not None
    asked = asked_headers(asking.api_url, asking.secret)
    made = httpx.post(f"{asking.api_url}/flows/filter", headers=asked,
                      json={"flows": {"name": {"any_": ["innocent"]}}}).json()
    assert made == [] and not ran.exists()  # none of it made: nothing to run, nothing ran
    # Whoever has the auth string may (what the worker runs: the README's "Across hosts"):
    # the same requests with it run the command. So the worker polled meanwhile, asking
    # with the auth string and CSRF tokens of its own.
    asyncio.run(_attack_with_prefect(asking.api_url, asking.secret, command))
    until(ran.exists, "the worker to run the deployment's command", timeout=90)


def _exported(shown: str) -> dict[str, str]:
    import shlex

    lines = [shlex.split(line) for line in shown.splitlines()]
    return dict(words[1].split("=", 1) for words in lines if words[:1] == ["export"])


def _experiment(env: dict[str, str], tmp_path: Path, name: str,
                rows: int) -> tuple[dict[str, object], str]:
    """tests/stack_experiment.py (ROWS rows, three task runs each) with ``env``: what it
    printed, and its errors."""
    import json
    import os
    import subprocess
    import sys

    from .conftest import ROOT

    ran = subprocess.run([sys.executable, str(ROOT / "tests" / "stack_experiment.py"),
                          str(tmp_path / "results"), name, str(rows), "60"],
                         env={**os.environ, **env, "PREFECT_HOME": str(tmp_path / name)},
                         capture_output=True, text=True, timeout=180)
    assert ran.returncode == 0, ran.stderr[-3000:]
    return json.loads(ran.stdout.splitlines()[-1]), ran.stderr


def test_an_experiment_given_server_env_records_every_task_run(asking: _Asking,
                                                               tmp_path: Path) -> None:
    import httpx

    from .prefect_servers import asked_headers

    exported = _exported(_server_cli("env", "--home", str(asking.home))[1])
    assert exported == {"PREFECT_API_URL": asking.api_url, "PREFECT_API_AUTH_STRING": asking.secret}
    out, said = _experiment(exported, tmp_path, "asked", 20)
    assert out["recorded"], out
    assert exported["PREFECT_API_AUTH_STRING"] not in said
    asked = asked_headers(asking.api_url, exported["PREFECT_API_AUTH_STRING"])
    runs = httpx.post(f"{asking.api_url}/task_runs/filter", headers=asked, json={
        "flow_runs": {"id": {"any_": [out["flow_run_id"]]}}, "limit": 200}).json()
    assert len(runs) == 3 * 20 and {r["state_type"] for r in runs} == {"COMPLETED"}
    # Without it the recorder says so at once (not after 30 s of retries), with the fix.
    out, said = _experiment({"PREFECT_API_URL": asking.api_url}, tmp_path, "unasked", 2)
    assert out["flow_run_id"] is None and not out["recorded"]
    assert "asks who you are (401 Unauthorized)" in said and "server env" in said, said[-2000:]
    assert exported["PREFECT_API_AUTH_STRING"] not in said


def test_run_says_the_server_asks_who_you_are(asking: _Asking) -> None:
    import typer
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    from patronus_tasks.cli.run import _check_api

    with temporary_settings({PREFECT_API_URL: asking.api_url}), pytest.raises(typer.Exit) as said:
        _check_api()
    assert said.value.exit_code == 2
    with temporary_settings({PREFECT_API_URL: asking.api_url, PREFECT_API_AUTH_STRING: asking.secret}):
        _check_api()


def test_a_server_that_answers_anyone_is_not_left_running(prefect_server: str) -> None:
    from patronus_tasks.exceptions import ConfigError
    from patronus_tasks.prefect.server.stack import auth

    with pytest.raises(ConfigError, match="answered a request without its auth string"):
        auth.require_asking(prefect_server)  # the suite's server asks nobody


def test_an_auth_string_others_may_read_is_refused(tmp_path: Path) -> None:
    import os

    from patronus_tasks.exceptions import ConfigError
    from patronus_tasks.prefect.server.stack import Stack, down, up

    from .prefect_servers import free_port

    home = tmp_path / "home"
    home.mkdir()
    (home / "auth-string").write_text("seen-by-others")
    os.chmod(home / "auth-string", 0o644)
    try:
        with pytest.raises(ConfigError, match=r"others on this machine may read it \(mode -rw-r--r--\)"):
            up(tmp_path, home, free_port(), deploy=False, worker=False)
        assert Stack.load(home) is None  # refused before anything started
    finally:
        down(home)  # (what a stack that took it started)


def test_the_secret_shows_nowhere_but_server_env(asking: _Asking) -> None:
    """Last of the section: the stack has served the attack and the experiments."""
    import json
    import stat

    from typer.testing import CliRunner

    from patronus_tasks.cli import app
    from patronus_tasks.prefect.server.stack import Stack

    secret = asking.secret
    assert secret is not None
    assert stat.S_IMODE((asking.home / "auth-string").stat().st_mode) == 0o600
    status = CliRunner().invoke(app, ["server", "status", "--home", str(asking.home), "--json"])
    assert status.exit_code == 0 and json.loads(status.stdout), status.stdout
    stack = Stack.load(asking.home)
    assert stack is not None
    titles = [Path(f"/proc/{p.pid}/cmdline").read_bytes().decode(errors="replace")
              for p in stack.procs if p.pid]
    logs = {p.name: p.read_text(errors="replace") for p in asking.home.glob("*.log")}
    assert {"server.log", "worker.log"} <= set(logs)
    seen = {"server up's output": asking.shown, "server status --json": status.stdout,
            "stack.json": (asking.home / "stack.json").read_text(), **logs,
            **{f"process {i}'s title": t for i, t in enumerate(titles)}}
    assert [where for where, text in seen.items() if secret in text] == []
    helped = CliRunner().invoke(app, ["server", "env", "--help"])
    assert "prints a secret" in " ".join(helped.stdout.split())


# (end of the server section)



# ---------------------------------------------------------------------------------------
# 4. Names cannot collide; the report's template; credentials in URLs; huge datasets.
# ---------------------------------------------------------------------------------------


# (end of the names section)
