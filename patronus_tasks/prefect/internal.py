"""Every use of Prefect's private interfaces, in one place.

- The REST API through the client's HTTP client (``client._client``): Prefect's public
  client has no bulk way to record task runs or to ask which of a set of ids the server
  holds. ``POST /events`` (the event format of `events`, also internal), ``POST /logs/``,
  the filter and count endpoints, the flows and flow runs the recorder makes, their
  states, tags and artifacts (the same bodies Prefect's client sends, so that the
  recorder's `lean.LeanClient` needs none of Prefect's models). Events
  and logs are sent by the retry loop's own ``send`` with the headers Prefect's adds
  (CSRF, attribution): see `_send_once`; other posts too while the database is busy
  (`_post`). The
  contract test (tests/test_recording.py) runs the same calls through Prefect's own task
  engine and compares what the API returns; the Prefect range in pyproject.toml is what
  it passed on.
- The built-in server (`prefect.server.local`): the class Prefect starts it with
  (`SubprocessASGIServer`, in `SERVER_MODULE`, loaded on first use: importing it imports the
  whole server application), the registry of its instances Prefect looks it up in, the
  application factory its process runs and the settings that process expects.
- A log record's ``send_to_api`` attribute, which Prefect's API log handler heeds.
- The server's database interface, to migrate a new database and register block types
  before several API processes start on it (`PREPARE_DATABASE`, run as a script).

tests/test_local_server.py and tests/test_stack.py run these against real servers.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, Self

if TYPE_CHECKING:
    import httpx
    from prefect.server.api.server import SubprocessASGIServer


class ApiClient(Protocol):
    """A client of the API as this module uses it: Prefect's `PrefectClient`, or the
    recorder's `lean.LeanClient`; its HTTP client (Prefect's private ``_client``)."""

    @property
    def _client(self) -> httpx.AsyncClient: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> Any: ...

#: Prefect's server application; imported only to start a server (~3 s).
SERVER_MODULE = "prefect.server.api.server"

#: The Prefect releases this package supports, as pyproject.toml's dependency says
#: (``>=3.8,<3.10``; tests/test_public_api.py holds them equal), and the ones CI tests:
#: the contract tests on the lowest, the whole suite on the newest (.ci/run).
SUPPORTED_PREFECT = ((3, 8), (3, 10))
TESTED_PREFECT = ("3.8.0", "3.9.1")


def prefect_outside_range(version: str) -> str | None:
    """What to say of Prefect ``version`` when it is outside `SUPPORTED_PREFECT`, else None.

    Accepted with a warning, not refused: nothing else of Prefect's may have changed for
    this package, and the recorder counts what the server recorded, so a broken contract
    shows as task runs reported lost, never as a silent pass.
    """
    parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    low, high = SUPPORTED_PREFECT
    if len(parts) == 2 and low <= parts < high:
        return None
    return (f"Prefect {version} is outside the releases patronus-tasks supports "
            f"(>={low[0]}.{low[1]},<{high[0]}.{high[1]}; tested on {' and '.join(TESTED_PREFECT)}): "
            "experiments run, but recording their calls as task runs relies on Prefect's "
            "internal event format, which may have changed; install a supported one "
            f"(pip install 'prefect>={low[0]}.{low[1]},<{high[0]}.{high[1]}') or a newer "
            "patronus-tasks")


def warn_outside_range() -> None:
    """Warn once per process when the installed Prefect is outside the supported range."""
    global _WARNED
    if _WARNED:
        return
    _WARNED = True
    from importlib.metadata import PackageNotFoundError, version

    try:
        said = prefect_outside_range(version("prefect"))
    except PackageNotFoundError:
        return
    if said:
        import warnings

        warnings.warn(said, RuntimeWarning, stacklevel=3)


_WARNED = False


#: Waits (seconds, each jittered by +-50%) before asking again after a busy database. A
#: server on SQLite answers 503 without Retry-After when two writes meet ("database is
#: locked", at once: SQLite does not wait for a read turned write). It clears within
#: milliseconds, but Prefect's client asks again after 2, 4, 8, 16 and 32 s.
_BUSY_WAITS = (0.1, 0.2, 0.4, 0.8, 1.6)


async def _post(client: ApiClient, path: str, **kwargs: Any) -> httpx.Response:
    """``POST`` ``path``; a busy database asked again soon (`_BUSY_WAITS`), then through
    Prefect's retry loop, which also takes ``Retry-After`` and, for a client that had an
    answer before, refused connections (one that never had fails at once, as in Prefect:
    asked twice, a server that answers nothing took twice its ~1.5 s per try)."""
    import asyncio
    import random

    import httpx

    for wait in _BUSY_WAITS:
        try:
            response = await _send_once(client, "POST", path, **kwargs)
        except httpx.TransportError:
            if not getattr(client._client, "_has_connected", False):
                raise
            break
        if not _busy(response):
            response.raise_for_status()
            return response
        await asyncio.sleep(wait * random.uniform(0.5, 1.5))
    response = await client._client.post(path, **kwargs)
    response.raise_for_status()
    return response


def _busy(response: httpx.Response) -> bool:
    return response.status_code == 503 and "retry-after" not in response.headers


async def _send_once(client: ApiClient, method: str, path: str,
                     **kwargs: Any) -> httpx.Response:
    """A request sent once, its answer at once. Prefect's client, even with its retries set
    to 0, sleeps a 429's ``Retry-After`` (a 502/503's back-off, a minute in all with its
    retries) before it hands the answer back: the recorder, which waits that long itself,
    waited twice (a rate-limited server took events at half the pace it allowed; measured
    with tests/prefect_gate.py)."""
    import httpx

    http: Any = client._client  # Prefect's subclass of httpx.AsyncClient, or `lean`'s
    request = http.build_request(method, path, **kwargs)
    if method != "GET" and getattr(http, "enable_csrf_support", False):  # as Prefect's `send`
        await http._add_csrf_headers(request=request)
    if hasattr(http, "_add_attribution_headers"):
        http._add_attribution_headers(request)
    response = await httpx.AsyncClient.send(http, request)  # the retry loop's own `send`
    if csrf_refused(response) and await _renew_csrf(http, request):
        response = await httpx.AsyncClient.send(http, request)  # refused: not taken
    # As Prefect's `send` marks it: only a client that got an answer once retries a refused
    # connection (a server restarting). Unmarked, a post-run whose first answer came here
    # (`answers`) lost its artifacts to a restart (tests/test_recorder_restarts.py).
    http._has_connected = True
    return response


def csrf_refused(response: httpx.Response) -> bool:
    """Whether a Prefect server refused a change for its CSRF token (its middleware:
    "Missing CSRF token.", "Invalid CSRF token or client identifier.")."""
    return response.status_code == 403 and "CSRF token" in response.text


async def _renew_csrf(http: Any, request: httpx.Request) -> bool:
    """A new CSRF token on ``request`` (as Prefect's retry loop does on a stale one);
    whether there is one to send it again with."""
    if hasattr(http, "renew_csrf"):  # `lean.LeanHttp`: asks for one only once refused
        return bool(await http.renew_csrf(request))
    if not getattr(http, "enable_csrf_support", False):
        return False
    http.csrf_token = None
    await http._add_csrf_headers(request=request)
    return True


async def answers(client: ApiClient) -> bool:
    """Whether the server answers ``GET /health`` now (asked once). Asked every time: an
    answer of the last second, taken instead (one round trip less at a run's end), let a
    server killed in that second lose the whole post-run (tests/test_recorder_restarts.py)."""
    import httpx

    try:
        return (await _send_once(client, "GET", "/health")).status_code == 200
    except httpx.HTTPError:
        return False


async def persister_said_off(client: ApiClient) -> bool:
    """Whether the server's settings (``GET /admin/settings``) say its event persister is
    off. Anything else (on, no such route as on Prefect Cloud, no answer) is False."""
    import httpx

    try:
        response = await _send_once(client, "GET", "/admin/settings")
        if response.status_code != 200:
            return False
        enabled = response.json()["server"]["services"]["event_persister"]["enabled"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return False
    return enabled is False


async def post_events(client: ApiClient, body: bytes) -> None:
    """Send a JSON array of events (already serialised) for the server to record, once."""
    response = await _send_once(client, "POST", "/events", content=body,
                                 headers={"content-type": "application/json"})
    response.raise_for_status()


async def post_logs(client: ApiClient, logs: list[dict[str, Any]]) -> None:
    """Send log records, once."""
    (await _send_once(client, "POST", "/logs/", json=logs)).raise_for_status()


async def count_task_runs(client: ApiClient, body: dict[str, Any]) -> int:
    """``POST /task_runs/count`` with a filter body."""
    return int((await _post(client, "/task_runs/count", json=body)).json())


async def filter_task_runs(client: ApiClient, body: dict[str, Any]) -> list[dict[str, Any]]:
    """``POST /task_runs/filter``: the task runs as JSON (no model parsing: faster)."""
    return list((await _post(client, "/task_runs/filter", json=body)).json())


async def filter_events(client: ApiClient, body: dict[str, Any]) -> dict[str, Any]:
    """``POST /events/filter``: one page of events and the total."""
    return dict((await _post(client, "/events/filter", json=body)).json())


async def create_flow_run(client: ApiClient, body: dict[str, Any]) -> dict[str, Any]:
    """``POST /flow_runs/`` (the public client's takes a `Flow` object, which the recorder
    process does not have: the experiment's code runs elsewhere)."""
    return dict((await _post(client, "/flow_runs/", json=body)).json())


async def create_flow(client: ApiClient, name: str) -> str:
    """``POST /flows/`` (what the public client's `create_flow_from_name` sends): the id of
    the flow of that name, made if new."""
    return str((await _post(client, "/flows/", json={"name": name})).json()["id"])


async def create_task_run(client: ApiClient, body: dict[str, Any]) -> dict[str, Any]:
    """``POST /task_runs/`` (the public client's takes a `Task` object)."""
    return dict((await _post(client, "/task_runs/", json=body)).json())


async def set_state(client: ApiClient, kind: str, run_id: str, state: dict[str, Any]) -> None:
    """``POST /flow_runs/<id>/set_state`` (``kind`` "flow_runs") or the task run's, forced
    (nothing else orchestrates these runs); ``state`` as `states.RunState.body` makes it."""
    await _post(client, f"/{kind}/{run_id}/set_state", json={"state": state, "force": True})


async def read_flow_run(client: ApiClient, flow_run_id: str) -> dict[str, Any]:
    """``GET /flow_runs/<id>``, as JSON."""
    return dict((await _request(client, "GET", f"/flow_runs/{flow_run_id}")).json())


async def update_flow_run(client: ApiClient, flow_run_id: str, body: dict[str, Any]) -> None:
    """``PATCH /flow_runs/<id>`` with the fields to change."""
    await _request(client, "PATCH", f"/flow_runs/{flow_run_id}", json=body)


async def read_deployment(client: ApiClient, deployment_id: str) -> dict[str, Any]:
    """``GET /deployments/<id>``, as JSON."""
    return dict((await _request(client, "GET", f"/deployments/{deployment_id}")).json())


async def create_artifact(client: ApiClient, body: dict[str, Any]) -> dict[str, Any]:
    """``POST /artifacts/`` (what Prefect's artifact classes send: `ui.artifacts`)."""
    return dict((await _post(client, "/artifacts/", json=body)).json())


async def update_artifact(client: ApiClient, artifact_id: str, body: dict[str, Any]) -> None:
    """``PATCH /artifacts/<id>`` with the fields to change."""
    await _request(client, "PATCH", f"/artifacts/{artifact_id}", json=body)


async def latest_artifacts(client: ApiClient, key: str, limit: int,
                           offset: int = 0) -> list[dict[str, Any]]:
    """The newest ``limit`` artifacts of ``key`` after the ``offset`` newest (``POST
    /artifacts/filter``), as JSON."""
    body = {"artifacts": {"key": {"any_": [key]}}, "sort": "CREATED_DESC", "limit": limit,
            "offset": offset}
    return list((await _post(client, "/artifacts/filter", json=body)).json())


async def _request(client: ApiClient, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """A request through the client's retries (Prefect's, or the lean client's alike)."""
    response = await client._client.request(method, path, **kwargs)
    response.raise_for_status()
    return response


def watch_responses(client: ApiClient, hook: Callable[[httpx.Response], None]) -> None:
    """Call ``hook`` with every response the client gets, retried ones included (Prefect's
    client retries a 429 itself: the recorder still wants to know the server limits it)."""

    async def seen(response: httpx.Response) -> None:
        hook(response)

    client._client.event_hooks["response"].append(seen)


# -- the built-in server ------------------------------------------------------------------


def _server_class() -> type[SubprocessASGIServer]:
    from prefect.server.api.server import SubprocessASGIServer

    return SubprocessASGIServer


def __getattr__(name: str) -> Any:
    """`SubprocessASGIServer`, from `SERVER_MODULE` when first asked for."""
    if name == "SubprocessASGIServer":
        return _server_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def built_in_server() -> SubprocessASGIServer | None:
    """The instance Prefect uses for its built-in server, if one exists (none before
    `SERVER_MODULE` is loaded)."""
    if SERVER_MODULE not in sys.modules:
        return None
    return _server_class()._instances.get(None)


def forget_built_in_server(server: SubprocessASGIServer) -> None:
    """Prefect makes a new instance for its next built-in server (if ``server`` is its
    current one)."""
    instances = _server_class()._instances
    if instances.get(None) is server:
        del instances[None]


def server_command(port: int) -> list[str]:
    """The command of a server process: Prefect's application under uvicorn (what
    `SubprocessASGIServer` and ``prefect server start`` run), no UI, on 127.0.0.1."""
    import prefect

    return [sys.executable, "-m", "uvicorn", "--app-dir", str(prefect.__module_path__.parent),
            "--factory", f"{SERVER_MODULE}:create_app", "--host", "127.0.0.1",
            "--port", str(port), "--log-level", "error", "--lifespan", "on"]


#: What the built-in server's process is told about itself, as `SubprocessASGIServer`
#: tells it: it is ephemeral, and its application the last one the process makes (Prefect
#: then frees what it kept for another).
BUILT_IN_SERVER_ENV = {"PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}


# -- logs --------------------------------------------------------------------------------


def keep_from_api(record: logging.LogRecord) -> None:
    """Prefect's API log handler does not send ``record`` (this package sends it, attached
    to the call's task run)."""
    record.send_to_api = False


# -- the server's database ---------------------------------------------------------------

#: Migrations and block registration, once, before the API processes start: several
#: processes doing both at start-up on a new database race (and block registration stalls).
PREPARE_DATABASE = """
import asyncio
from prefect.server.database import provide_database_interface
from prefect.server.models.block_registration import run_block_auto_registration

async def main():
    db = provide_database_interface()
    await db.create_db()
    async with await db.session() as session:
        await run_block_auto_registration(session=session)

asyncio.run(main())
"""


def dask_client() -> Any:
    """The Dask client of the flow run this runs in, when its task runner is Dask's
    (`prefect_dask.DaskTaskRunner.client`, made on first use), else None."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    runner = ctx.task_runner if ctx is not None else None
    if runner is None or type(runner).__name__ != "DaskTaskRunner":
        return None
    return getattr(runner, "client", None)
