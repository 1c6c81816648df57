"""Small real HTTP servers on 127.0.0.1 standing in for remote APIs in tests.

Each records the requests it gets (path, headers, JSON body) and answers from a
handler function, so tests check exactly what was sent over the wire.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = tuple[int, dict[str, str], Any]  # status, headers, JSON body (or bytes)


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class FakeServer:
    url: str
    requests: list[Recorded] = field(default_factory=list)


def _handler_class(server: FakeServer, handle: Callable[[Recorded], Reply]) -> type:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            req = Recorded(self.command, self.path, {k.lower(): v for k, v in self.headers.items()},
                           body)
            server.requests.append(req)
            status, headers, payload = handle(req)
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_PATCH = _serve

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def serve(handle: Callable[[Recorded], Reply]) -> Iterator[FakeServer]:
    """Run a server answering with ``handle`` on a free port of 127.0.0.1."""
    fake = FakeServer(url="")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_class(fake, handle))
    httpd.daemon_threads = True
    fake.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        httpd.shutdown()
        httpd.server_close()


def chat_completion(content: str, model: str = "gpt-4o") -> dict[str, Any]:
    """An OpenAI chat-completions response body carrying ``content``."""
    return {
        "id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def echo_chat(req: Recorded) -> Reply:
    """Answer a chat completion with ``[system] user`` of the request's messages."""
    messages = {m["role"]: m["content"] for m in req.body["messages"]}
    return 200, {}, chat_completion(f"[{messages.get('system', '')}] {messages['user']}",
                                    req.body.get("model", "gpt-4o"))
