"""A real HTTP proxy on 127.0.0.1 in front of a real Prefect server, for what a test plays
with the posts of events: a server slow to take them (held), one that takes them and
loses them (a restart), one that limits their rate (Prefect Cloud's 429s); and for what a
test looks at or changes in them on their way (`Gate.on_events`), or a server slow to take
logs (`Gate.log_delay`); a busy database refusing flow runs (`Gate.busy_flow_runs`); a
server without a route (`Gate.hidden`); an event persister that has stored nothing yet
(`Gate.unstored`).

Everything else passes through untouched; the recorder process of the experiment under
test talks to the gate as to any Prefect API (``PREFECT_API_URL``).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

_HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


@dataclass
class Limit:
    """At most ``events`` per ``window`` seconds; past it, 429 with ``Retry-After``."""

    events: int
    window: float
    window_start: float = 0.0
    taken: int = 0


@dataclass
class Gate:
    """What happens to ``POST /api/events`` (the rest passes)."""

    upstream: str  # the real server's API URL
    url: str = ""
    held: bool = False  # answered 503 (down) until released
    lose_after: int | None = None  # posts after this many are answered 200 and dropped
    #: Posts forwarded (the server takes them) whose answer is lost: a 504 comes instead,
    #: as from a proxy whose upstream answered too late. The next ones, this many.
    lose_answers: int = 0
    answers_lost: int = 0
    #: Called before a lost answer's 504 goes out: a test waits there until the server
    #: recorded what was forwarded (the proxy's answer came too late, the server has it).
    before_lost_answer: Callable[[], None] | None = None
    limit: Limit | None = None
    #: Sees each post of events the gate forwards (its body) and returns what to forward.
    on_events: Callable[[bytes], bytes] | None = None
    log_delay: float = 0.0  # seconds each post of logs is held before it is forwarded
    posts: int = 0
    forwarded_events: int = 0
    refusals: list[float] = field(default_factory=list)  # when a 429 was answered
    after_refusal: list[float] = field(default_factory=list)  # seconds until the next post
    asked: list[float] = field(default_factory=list)  # each refusal's Retry-After
    retry_after: float = 0.0
    busy_flow_runs: int = 0  # posts of flow runs answered 503 (a busy database), the first ones
    flow_run_posts: list[float] = field(default_factory=list)  # when each came
    #: Paths (under /api) answered 404, as a server without such a route (Prefect Cloud
    #: has no ``/admin/settings``).
    hidden: set[str] = field(default_factory=set)
    #: ``POST /api/events/filter`` finds no event, as on a server whose event persister
    #: has not flushed yet (every 5 s by Prefect's default); counted in ``filters``.
    unstored: bool = False
    filters: int = 0
    creating: int = 0  # posts of flow runs forwarded and not answered yet
    most_creating: int = 0  # the most at once
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def release(self) -> None:
        self.held = False

    def decide(self, events: int) -> tuple[int, dict[str, str]] | None:
        """The answer for a post of ``events`` events, or None to forward it."""
        with self._lock:
            now = time.monotonic()
            if self.refusals and len(self.after_refusal) < len(self.refusals):
                self.after_refusal.append(now - self.refusals[-1])
            self.posts += 1
            if self.held:
                return 503, {}
            if self.lose_after is not None and self.posts > self.lose_after:
                return 200, {}
            if self.limit is not None and not self._within_limit(now, events):
                self.refusals.append(now)
                self.asked.append(self.retry_after)
                return 429, {"Retry-After": f"{self.retry_after:g}"}
            self.forwarded_events += events
            return None

    def answer_lost(self) -> bool:
        """A post of events was forwarded: whether its answer is lost (`lose_answers`)."""
        with self._lock:
            if self.answers_lost >= self.lose_answers:
                return False
            self.answers_lost += 1
            return True

    def flow_run_post(self) -> bool:
        """A post of a flow run came: whether to refuse it (busy), else it is forwarded."""
        with self._lock:
            self.flow_run_posts.append(time.monotonic())
            if len(self.flow_run_posts) <= self.busy_flow_runs:
                return True
            self.creating += 1
            self.most_creating = max(self.most_creating, self.creating)
            return False

    def flow_run_made(self) -> None:
        with self._lock:
            self.creating -= 1

    def _within_limit(self, now: float, events: int) -> bool:
        limit = self.limit
        assert limit is not None
        if now - limit.window_start >= limit.window:
            limit.window_start, limit.taken = now, 0
        if limit.taken + events > limit.events:
            self.retry_after = max(1.0, round(limit.window - (now - limit.window_start)))
            return False
        limit.taken += events
        return True


def _handler(gate: Gate, client: httpx.Client) -> type:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            decided, path = None, self.path.rstrip("/")
            if self.command == "POST" and path == "/api/events":
                decided = gate.decide(len(json.loads(body or b"[]")))
                if decided is None and gate.on_events is not None:
                    body = gate.on_events(body)
            if path.removeprefix("/api") in gate.hidden:
                decided = 404, {}
            if self.command == "POST" and path == "/api/events/filter" and gate.unstored:
                gate.filters += 1
                self._answer(200, {"content-type": "application/json"},
                             b'{"events": [], "total": 0, "next_page": null}')
                return
            if decided is not None:
                self._answer(decided[0], decided[1], b"{}")
                return
            if self.command == "POST" and path == "/api/logs":
                time.sleep(gate.log_delay)  # a server slow to take them
            creating = self.command == "POST" and path == "/api/flow_runs"
            if creating and gate.flow_run_post():
                self._answer(503, {}, b'{"exception_message":"Service Unavailable"}')
                return
            try:
                upstream = self._forward(body)
            finally:
                if creating:
                    gate.flow_run_made()
            if decided is None and self.command == "POST" and path == "/api/events" \
                    and gate.answer_lost():
                if gate.before_lost_answer is not None:
                    gate.before_lost_answer()
                self._answer(504, {}, b'{"exception_message":"Gateway Timeout"}')
                return
            self._answer(upstream.status_code, {k: v for k, v in upstream.headers.items()
                                                if k.lower() not in _HOP | {"content-encoding"}},
                         upstream.content)

        def _forward(self, body: bytes) -> httpx.Response:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            return client.request(self.command, gate.upstream.removesuffix("/api") + self.path,
                                  content=body, headers=headers)

        def _answer(self, status: int, headers: dict[str, str], data: bytes) -> None:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


@contextlib.contextmanager
def gate_for(upstream: str) -> Iterator[Gate]:
    """A gate in front of the Prefect API at ``upstream``, on a free port."""
    gate = Gate(upstream)
    with httpx.Client(timeout=60) as client:
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(gate, client))
        httpd.daemon_threads = True
        gate.url = f"http://127.0.0.1:{httpd.server_address[1]}/api"
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        try:
            yield gate
        finally:
            httpd.shutdown()
            httpd.server_close()
