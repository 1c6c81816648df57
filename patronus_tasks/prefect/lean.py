"""A client of the Prefect API over plain httpx (`LeanClient`), for the recorder process
when its environment gives every client setting (`client_settings.from_env`).

It sends what Prefect's `PrefectClient` sends (the API version, the user agent, the
auth string or API key, the user's custom headers, CSRF tokens, the attribution headers of
a worker's or deployment's run), and its `LeanHttp` retries as Prefect's HTTP client does
(408, 429, 502, 503 and the user's extra codes, after ``Retry-After`` or an exponential
back-off, jittered; a refused connection only once it had an answer; a stale CSRF token
fetched again), raising on any other error status; `internal` sends the events and logs
past that loop. Without Prefect imported (~1.0 s of CPU), a 10-row script's first task
runs were posted ~1 s sooner (bench/README.md). The attribute and method names `internal`
reads are those of Prefect's client (``_client``, ``enable_csrf_support``,
``_add_csrf_headers``, ``_add_attribution_headers``, ``_has_connected``): one code path
serves both.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import functools
import importlib
import os
import random
import ssl
import uuid
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from types import TracebackType
from typing import Any

import httpx

from patronus_tasks.http import retry_after
from patronus_tasks.prefect.client_settings import ClientSettings
from patronus_tasks.prefect.internal import csrf_refused

#: The REST API version Prefect's client says it speaks (``X-PREFECT-API-VERSION``; the
#: same in every Prefect release this package supports).
API_VERSION = "0.8.4"
_RETRIED = frozenset({408, 429, 502, 503})
_PROTECTED = frozenset({"user-agent", "prefect-csrf-token", "prefect-csrf-client"})
#: Errors retried as Prefect's client retries them (a refused connection only once the
#: server answered: `LeanHttp._has_connected`).
_RETRIED_ERRORS: tuple[type[Exception], ...] = (
    httpx.ReadTimeout, httpx.PoolTimeout, httpx.ConnectTimeout, httpx.ReadError,
    httpx.WriteError, httpx.RemoteProtocolError, httpx.LocalProtocolError)
#: Headers naming the run a request comes from, from the environment a worker gives its
#: flow runs (Prefect's `get_attribution_headers` outside a run context).
_ATTRIBUTION = {"PREFECT__WORKER_ID": "X-Prefect-Worker-Id",
                "PREFECT__WORKER_NAME": "X-Prefect-Worker-Name",
                "PREFECT__FLOW_ID": "X-Prefect-Flow-Id",
                "PREFECT__FLOW_NAME": "X-Prefect-Flow-Name",
                "PREFECT__DEPLOYMENT_ID": "X-Prefect-Deployment-Id",
                "PREFECT__DEPLOYMENT_NAME": "X-Prefect-Deployment-Name"}


@dataclass
class _Csrf:
    """A server's CSRF token, shared by this process's clients of it (each of Prefect's
    asked for its own: one more request before the first change of each). Asked for only
    once the server refused a change without one (``enabled`` None until then): a server
    answers the token's request 422 unless its CSRF protection is on, which is Prefect's
    default, and that request was a round trip before the first flow run of every
    experiment; a server that wants one (`server up`'s) refuses the first change (403),
    which is then sent again with it."""

    enabled: bool | None = None
    token: str | None = None
    expires: dt.datetime | None = None
    client_id: str = ""
    lock: asyncio.Lock | None = None


_CSRF: dict[tuple[str, str], _Csrf] = {}


class LeanHttp(httpx.AsyncClient):
    """httpx with the retries, CSRF tokens and errors of Prefect's HTTP client."""

    def __init__(self, s: ClientSettings, max_retries: int | None = None) -> None:
        headers = {"X-PREFECT-API-VERSION": API_VERSION, **_auth(s)}
        super().__init__(
            base_url=s.api_url, headers=headers, verify=tls_context(s.tls_insecure, s.cert_file),
            http2=s.http2, timeout=httpx.Timeout(s.timeout), follow_redirects=True,
            limits=httpx.Limits(max_connections=16, max_keepalive_connections=8,
                                keepalive_expiry=25))
        self.headers["User-Agent"] = f"prefect/{_prefect_version()} (API {API_VERSION})"
        for name, value in s.headers.items():  # after the auth header, as Prefect's are
            if name.lower() not in _PROTECTED:
                self.headers[name] = value
        self.settings = s
        self.max_retries = s.max_retries if max_retries is None else max_retries
        self.enable_csrf_support = s.csrf and not s.cloud
        key = (s.api_url, self.headers.get("Authorization", ""))
        self._csrf = _CSRF.setdefault(key, _Csrf(client_id=str(uuid.uuid4())))
        self._has_connected = False

    async def send(self, request: httpx.Request, *args: Any, **kwargs: Any) -> httpx.Response:
        """Send ``request``, retried as Prefect's client retries it; raise on an error status."""
        self._add_attribution_headers(request)
        if request.method not in ("GET", "HEAD", "OPTIONS"):
            await self._add_csrf_headers(request)
        retried = _RETRIED_ERRORS + ((httpx.ConnectError,) if self._has_connected else ())
        tries = 0
        while True:
            wait, response = None, None
            try:
                response = await super().send(request, *args, **kwargs)
            except retried:
                tries += 1
                if tries > self.max_retries:
                    raise
            else:
                tries += response.headers.get("Prefect-Maintenance") != "true"
                if csrf_refused(response) and await self.renew_csrf(request):
                    continue  # no token, or a stale one: again with a new one
                if response.status_code not in _RETRIED | self.settings.extra_codes:
                    break
                if tries > self.max_retries:
                    break
                wait = retry_after(response)
            await asyncio.sleep(self._wait(wait, tries))
        assert response is not None  # each try either answered or raised
        self._has_connected = True
        response.raise_for_status()
        return response

    def _wait(self, asked: float | None, tries: int) -> float:
        """Seconds before the next try: at least what the server asked (up to a jitter
        factor more), else 2**tries, jittered both ways (as Prefect's, in uniform draws)."""
        jitter = self.settings.jitter
        if asked is not None:
            return asked * random.uniform(1.0, 1.0 + jitter) if asked > 0 else 0.0
        return 2.0**tries * random.uniform(max(0.0, 1.0 - jitter), 1.0 + jitter)

    def _add_attribution_headers(self, request: httpx.Request) -> None:
        for name, header in _ATTRIBUTION.items():
            if value := os.environ.get(name):
                request.headers[header] = value

    async def renew_csrf(self, request: httpx.Request) -> bool:
        """The server refused ``request`` for its CSRF token (none, or a stale one): put a
        new one on it; whether there is one to send it again with (not when
        ``PREFECT_CLIENT_CSRF_SUPPORT_ENABLED`` is off, nor twice for one request)."""
        if not self.enable_csrf_support or request.extensions.get("csrf_renewed"):
            return False
        request.extensions["csrf_renewed"] = True
        self._csrf.enabled, self._csrf.token = True, None
        await self._add_csrf_headers(request)
        return self._csrf.token is not None

    async def _add_csrf_headers(self, request: httpx.Request) -> None:
        """The CSRF token on ``request`` once the server asked for one (`_Csrf`), fetched
        first if there is none yet, or it expired (a server with CSRF protection off
        answers 422, an old one 404: none is sent)."""
        csrf = self._csrf
        if not (self.enable_csrf_support and csrf.enabled):
            return
        csrf.lock = csrf.lock or asyncio.Lock()
        async with csrf.lock:  # clients made at once ask once
            if csrf.token is None or (csrf.expires is not None and dt.datetime.now(dt.UTC) > csrf.expires):
                await self._fetch_csrf()
        if csrf.enabled and csrf.token is not None:
            request.headers["Prefect-Csrf-Token"] = csrf.token
            request.headers["Prefect-Csrf-Client"] = csrf.client_id

    async def _fetch_csrf(self) -> None:
        csrf = self._csrf
        try:
            answer = (await self.send(self.build_request(
                "GET", "/csrf-token", params={"client": csrf.client_id}))).json()
        except httpx.HTTPStatusError as exc:
            answered = exc.response
            if answered.status_code == 404 or (answered.status_code == 422 and
                                               "CSRF protection is disabled." in answered.text):
                csrf.enabled = False
                return
            raise
        csrf.token = str(answer["token"])
        csrf.expires = dt.datetime.fromisoformat(str(answer["expiration"]))
        if csrf.expires.tzinfo is None:
            csrf.expires = csrf.expires.replace(tzinfo=dt.UTC)


class LeanClient:
    """Prefect's client as far as this package uses it: its HTTP client (``_client``),
    entered and left as Prefect's is (``async with``)."""

    def __init__(self, s: ClientSettings, max_retries: int | None = None) -> None:
        self._client = LeanHttp(s, max_retries)

    async def __aenter__(self) -> LeanClient:
        await self._client.__aenter__()
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._client.__aexit__(kind, exc, tb)


def warm(s: ClientSettings) -> None:
    """Make now what the first request would wait for (measured: the TLS context 30 ms,
    the first client 50 ms, anyio's asyncio backend, loaded by httpcore's first
    connection, 60 ms), while the experiment's process is still sending its opening."""
    LeanHttp(s)
    with contextlib.suppress(ImportError):
        importlib.import_module("httpcore._backends.anyio")
        importlib.import_module("anyio._backends._asyncio")


def _auth(s: ClientSettings) -> dict[str, str]:
    if s.auth_string:
        return {"Authorization": "Basic " + base64.b64encode(s.auth_string.encode()).decode()}
    if s.api_key:
        return {"Authorization": f"Bearer {s.api_key}"}
    return {}


@functools.cache
def tls_context(insecure: bool, cert_file: str | None) -> ssl.SSLContext:
    """One TLS context per setting, made as Prefect makes it (the CA bundle: ~33 ms)."""
    if insecure:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    import certifi

    return ssl.create_default_context(cafile=cert_file or certifi.where())


@functools.cache
def _prefect_version() -> str:
    try:
        return version("prefect")
    except PackageNotFoundError:
        return "unknown"
