"""HTTP endpoints: one pooled client per endpoint, an in-flight limit, retries with backoff;
and a server's rate limits (`RateLimited`, `Pace`).

Retries cover 429, 5xx, connection errors and timeouts, with exponential backoff and
full jitter, honouring ``Retry-After``; other 4xx answers fail at once. Each endpoint
keeps its own in-flight limit, so judges and tasks can be throttled apart from each
other and from the experiment's ``max_concurrency``.

A server that limits the rate of requests (Prefect Cloud counts every event and log
against per-minute limits) answers ``429 Too Many Requests`` with ``Retry-After`` past
them: what it refuses is sent again once it allows, never dropped and never sooner
(`RateLimited`); `Pace` watches its answers to say how long a catch-up will take.
"""

from __future__ import annotations

import asyncio
import base64
import email.utils
import functools
import logging
import random
import re
import ssl
import time
import weakref
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit, urlunsplit

import httpx

from patronus_tasks.exceptions import ConfigError, RemoteAPIError

logger = logging.getLogger("patronus_tasks.http")
_RETRY_AFTER_CAP = 60.0
_KEEPALIVE = 4.0


#: Connections per httpx pool. httpcore scans every connection of a pool for every
#: request (a socket poll and two syscalls per idle connection), so one pool of hundreds
#: of connections costs milliseconds of CPU per request; many small pools keep that scan
#: short: 8 per pool took the plain loop at C=256 from 1.9 to 1.6 ms of CPU per call
#: (see bench/README.md).
POOL_SHARD = 8


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    # One CA bundle load (~30 ms, ~1 MB) for every pool, not one per pool.
    return httpx.create_ssl_context()


@dataclass
class _LoopState:
    clients: list[httpx.AsyncClient]
    slots: asyncio.Semaphore
    in_flight: int = 0
    turn: int = 0

    def client(self) -> httpx.AsyncClient:
        self.turn = (self.turn + 1) % len(self.clients)
        return self.clients[self.turn]


def retry_after(response: httpx.Response) -> float | None:
    """Seconds a response's ``Retry-After`` asks for (seconds or an HTTP date), if it says."""
    value = response.headers.get("retry-after", "").strip()
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _retryable(status: int) -> bool:
    return status == 429 or status >= 500


class Endpoint:
    """An HTTP API: base URL, auth headers and how hard to try.

    The headers (which may hold an API key) never appear in its repr, logs or errors.
    """

    def __init__(self, base_url: str, *, headers: dict[str, str] | None = None,
                 max_in_flight: int = 16, timeout: float = 60.0, max_attempts: int = 3,
                 backoff: float = 0.5, max_backoff: float = 20.0,
                 transport: httpx.AsyncBaseTransport | None = None,
                 hints: Mapping[int, str] | None = None) -> None:
        """``transport``: what carries the requests instead of the network (an
        ``httpx.MockTransport`` answering in-process: the agents' local policy);
        ``hints``: what to check, by HTTP status, said with an error of that status."""
        self.shown_url = redact_url(base_url.rstrip("/"))  # in messages: no user:password, no key=
        self.base_url, self._headers = _with_url_credentials(base_url.rstrip("/"), dict(headers or {}))
        self.hints = {**_STATUS_HINTS, **(hints or {})}
        self.transport = transport
        self.max_in_flight, self.timeout = max_in_flight, timeout
        self.max_attempts, self.backoff, self.max_backoff = max(1, max_attempts), backoff, max_backoff
        self._states: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = (
            weakref.WeakKeyDictionary())

    def __repr__(self) -> str:
        return f"Endpoint({self.shown_url!r}, max_in_flight={self.max_in_flight})"

    def __getstate__(self) -> dict[str, Any]:
        # Clients and semaphores belong to one event loop; a copy elsewhere makes its own.
        return {**self.__dict__, "_states": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._states = weakref.WeakKeyDictionary()

    def redact(self, text: str) -> str:
        """``text`` with every credential of this endpoint replaced by ``***``."""
        if self.shown_url != self.base_url:
            text = text.replace(self.base_url, self.shown_url)
        for value in self._headers.values():
            for secret in {value, value.removeprefix("Bearer "), value.removeprefix("Basic ")}:
                if len(secret) >= 6:
                    text = text.replace(secret, "***")
        return text

    def _state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        state = self._states.get(loop)
        if state is None:
            shards = -(-self.max_in_flight // POOL_SHARD)
            size = -(-self.max_in_flight // shards)
            # Idle connections are dropped before the 5 s many servers (uvicorn, nginx's
            # 75 s aside) close them with: reusing one the server is closing fails the call.
            limits = httpx.Limits(max_connections=size, max_keepalive_connections=size,
                                  keepalive_expiry=_KEEPALIVE)
            clients = [httpx.AsyncClient(base_url=self.base_url, headers=self._headers,
                                         timeout=self.timeout, limits=limits,
                                         verify=_ssl_context(), transport=self.transport)
                       for _ in range(shards)]
            state = _LoopState(clients, asyncio.Semaphore(self.max_in_flight))
            self._states[loop] = state
        return state

    def _delay(self, attempt: int, response: httpx.Response | None) -> float:
        hinted = retry_after(response) if response is not None else None
        if hinted is not None:
            return min(hinted, _RETRY_AFTER_CAP)
        return random.uniform(0, min(self.max_backoff, self.backoff * 2 ** (attempt - 1)))

    async def request(self, method: str, path: str, **kwargs: Any) -> tuple[Any, int]:
        """Send a request with retries; return the JSON body and the attempts it took."""
        failures: list[str] = []
        for attempt in range(1, self.max_attempts + 1):
            response, problem = await self._send(method, path, **kwargs)
            if response is not None and response.is_success:
                return self._json_body(response, method, path, attempt), attempt
            if response is not None and not _retryable(response.status_code):
                raise RemoteAPIError(self.redact(_failure(method, self.shown_url + path, response,
                                                          self.hints)),
                                     status=response.status_code, attempts=attempt)
            failures.append(problem)
            if attempt < self.max_attempts:
                delay = self._delay(attempt, response)
                logger.warning("%s %s: %s; retry %d/%d in %.2fs", method, path, problem,
                               attempt, self.max_attempts - 1, delay)
                await asyncio.sleep(delay)
        status = response.status_code if response is not None else None
        raise RemoteAPIError(
            f"{method} {self.shown_url}{path} failed after {self.max_attempts} attempts: "
            + "; ".join(failures) + _hint(failures), status=status, attempts=self.max_attempts)

    async def _send(self, method: str, path: str, **kwargs: Any
                    ) -> tuple[httpx.Response | None, str]:
        state = self._state()
        async with state.slots:
            state.in_flight += 1
            try:
                response = await state.client().request(method, path, **kwargs)
            except httpx.TransportError as exc:
                return None, f"{type(exc).__name__}"
            finally:
                state.in_flight -= 1
        return response, f"HTTP {response.status_code}"

    def _json_body(self, response: httpx.Response, method: str, path: str, attempts: int) -> Any:
        try:
            return response.json()
        except ValueError:
            raise RemoteAPIError(self.redact(
                f"{method} {path}: HTTP {response.status_code} with a body that is not JSON: "
                f"{response.text[:300]!r}"), status=response.status_code, attempts=attempts) from None

    async def aclose(self) -> None:
        """Close this loop's client (others close with their loops)."""
        try:
            state = self._states.pop(asyncio.get_running_loop(), None)
        except RuntimeError:
            return
        if state is not None:
            for client in state.clients:
                await client.aclose()


def _with_url_credentials(url: str, headers: dict[str, str]) -> tuple[str, dict[str, str]]:
    """A ``user:password@`` in ``url`` as the Basic auth they stand for (a proxy's in front
    of a server), sent in ``Authorization`` and out of the URL (which is shown, logged and
    part of cache keys); refused with a key for that same header (an OpenAI-compatible
    API key): httpx sent the URL's Basic auth in its place, and the key was silently
    dropped. The error names the URL with its credentials as ``***``."""
    parts = urlsplit(url)
    user, at, host = parts.netloc.rpartition("@")
    if not at:
        return url, headers
    if any(k.lower() == "authorization" for k in headers):
        raise ConfigError(
            f"the endpoint {redact_url(url)} has a user and password in its URL, and an API "
            "key: both go in the one Authorization header, so one would be dropped. Take the "
            "user:password@ out of the URL (the key is sent), or drop the key (api_key=, "
            "OPENAI_API_KEY) where the server wants only the URL's Basic auth.")
    name, _, password = user.partition(":")
    token = base64.b64encode(f"{unquote(name)}:{unquote(password)}".encode()).decode()
    return urlunsplit(parts._replace(netloc=host)), {**headers, "authorization": f"Basic {token}"}


_STATUS_HINTS = {
    401: " (check the API key it was given)",
    403: " (check the API key it was given)",
    404: " (check the base URL and the path)",
}
#: Query keys whose values are credentials (shown as ***; `record.location` scrubs them).
SECRET_NAME = re.compile(r"secret|key|token|password|passwd|credential|sig|sas", re.IGNORECASE)


def redact_url(url: str) -> str:
    """``url`` safe to show: secret query values and a ``user:password`` as ``***`` (an
    object store's user is its access key id: half the credential), a web URL's user too
    (a token alone: ``https://TOKEN@host``)."""
    parts = urlsplit(url)
    user, at, host = parts.netloc.rpartition("@")
    if at and ":" in user:
        netloc = f"***:***@{host}"
    elif at and parts.scheme.lower() in ("http", "https"):
        netloc = f"***@{host}"
    else:
        netloc = parts.netloc  # an abfs container@account names no secret
    query = "&".join(f"{k}={'***' if SECRET_NAME.search(k) else quote(v, safe=':/,')}"
                     for k, v in parse_qsl(parts.query, keep_blank_values=True))
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def _failure(method: str, url: str, response: httpx.Response, hints: Mapping[int, str]) -> str:
    return (f"{method} {url}: HTTP {response.status_code} (not retried)"
            f"{hints.get(response.status_code, '')}: {response.text[:500]}")


def _hint(failures: list[str]) -> str:
    """What to do when every attempt failed the same way."""
    if all(f == "HTTP 429" for f in failures):
        return (" (the server kept refusing for its rate: fewer calls at once, max_in_flight=, "
                "or more tries, max_attempts=)")
    if all(f in ("ConnectError", "ConnectTimeout") for f in failures):
        return " (nothing answered there: is the server up, and the URL right?)"
    return ""


#: Seconds of history the pace is measured over (Cloud's limits are per minute).
WINDOW = 60.0
_DEFAULT_WAIT = 10.0  # when a 429 says nothing of how long


class RateLimited(Exception):
    """The server refused a request for its rate: try again after ``seconds``."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"rate limited: retry after {seconds:.0f} s")
        self.seconds = seconds

    @classmethod
    def of(cls, exc: BaseException) -> RateLimited | None:
        """``exc`` as a `RateLimited`, if it is an HTTP 429."""
        if isinstance(exc, RateLimited):
            return exc
        if isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code == 429:
            return cls(_wait_of(exc.response))
        return None

    @classmethod
    def raise_if(cls, exc: BaseException) -> None:
        limited = cls.of(exc)
        if limited is not None:
            raise limited from exc


class Pace:
    """Events the server took over the last `WINDOW`, and when it last said 429."""

    def __init__(self) -> None:
        self._taken: deque[tuple[float, int]] = deque()
        self.limited_at = 0.0
        self.retry_after = 0.0
        self.refusals = 0

    def saw(self, response: httpx.Response) -> None:
        """Every answer of the server (an httpx response hook)."""
        if response.status_code == 429:
            self.limited_at, self.retry_after = time.monotonic(), _wait_of(response)
            self.refusals += 1

    def took(self, events: int) -> None:
        now = time.monotonic()
        self._taken.append((now, events))
        while self._taken and self._taken[0][0] < now - WINDOW:
            self._taken.popleft()

    @property
    def limited(self) -> bool:
        """Whether the server refused anything for its rate in the last `WINDOW`."""
        return self.limited_at > 0 and time.monotonic() - self.limited_at < WINDOW

    def per_minute(self) -> float:
        """Events taken per minute over the window (since the first, if younger)."""
        if not self._taken:
            return 0.0
        span = max(time.monotonic() - self._taken[0][0], 1.0)
        return sum(n for _, n in self._taken) * 60.0 / min(max(span, 1.0), WINDOW)

    def note(self, left: int) -> str | None:
        """What a rate limit means for ``left`` task runs to go, or None when none applies."""
        if not self.limited:
            return None
        rate = self.per_minute()
        eta = f"~{_duration(60 * left / rate)} at the ~{rate:.0f} events/min it allows" \
            if rate else "how long is known once it takes some"
        return (f"the Prefect server limits the rate of requests (HTTP 429, Retry-After "
                f"{self.retry_after:.0f} s): {left} task runs to go, {eta}; nothing is dropped")


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _wait_of(response: httpx.Response) -> float:
    hinted = retry_after(response)
    return _DEFAULT_WAIT if hinted is None else hinted


__all__ = ["Endpoint", "RemoteAPIError"]
