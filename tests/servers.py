"""Small real HTTP servers on 127.0.0.1 standing in for remote APIs in tests.

Each records the requests it gets (path, headers, JSON body) and answers from a
handler function, so tests check exactly what was sent over the wire.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
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


def _body(raw: bytes) -> Any:
    """A request's body: its JSON, or the bytes as sent when it is none (protobuf, gzip)."""
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:  # UnicodeDecodeError too
        return raw


def _handler_class(server: FakeServer, handle: Callable[[Recorded], Reply]) -> type:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = _body(raw)
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
            # The client may have given up (a timeout under test): nothing to answer.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
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


class PatronusAPI:
    """A stand-in for the Patronus v1 API: evaluators, criteria, evaluations, and the
    platform (``whoami``, datasets in ``datasets``, projects, experiments, and the
    exported results, each accepted batch in ``exported``).

    ``faults`` is a list of what to do to the next ``/v1/evaluate`` requests, one item
    each: ``"429"`` (with ``Retry-After``), ``"500"``, ``"400"``, ``"garbage"`` (a body
    that is not JSON) or ``"hang"`` (answer only after ``hang_seconds``);
    ``export_faults`` the HTTP statuses to answer the next exports with (``"500"``...),
    ``export_rejects`` sample ids whose batches always fail.
    """

    def __init__(self) -> None:
        self.criteria: dict[str, dict[str, Any]] = {}
        self.datasets: dict[str, list[dict[str, Any]]] = {}
        self.projects: dict[str, str] = {}  # name -> id
        self.experiments: dict[str, dict[str, Any]] = {}
        self.exported: list[list[dict[str, Any]]] = []  # each accepted batch of results
        self.export_faults: list[str] = []  # like `faults`, for the export endpoint
        self.export_rejects: set[int] = set()  # a batch with these sample ids: always 500
        self.faults: list[str] = []
        self.hang_seconds = 3.0
        self.delay = 0.0
        self.in_flight = self.max_in_flight = 0
        self._lock = threading.Lock()

    def __call__(self, req: Recorded) -> Reply:
        path = req.path.split("?")[0]
        if path == "/v1/evaluators":
            return 200, {}, {"evaluators": [{"id": "ev-123", "name": "custom-large",
                                             "evaluator_family": "custom",
                                             "aliases": ["custom-large", "custom-large-2024"]}]}
        if path == "/v1/evaluator-criteria" and req.method == "GET":
            name = req.path.split("name=")[1].split("&")[0]
            found = self.criteria.get(name)
            return 200, {}, {"evaluator_criteria": [found] if found else []}
        if path == "/v1/evaluator-criteria":
            crit = {**req.body, "revision": 0}
            self.criteria[req.body["name"]] = crit
            return 200, {}, {"evaluator_criteria": crit}
        if path.endswith("/revision"):
            name = path.split("/")[-2]
            crit = {**self.criteria[name], "config": req.body["config"],
                    "revision": self.criteria[name]["revision"] + 1}
            self.criteria[name] = crit
            return 200, {}, {"evaluator_criteria": crit}
        if path == "/v1/evaluate":
            return self._evaluate(req)
        return self._platform(req, path)

    def _platform(self, req: Recorded, path: str) -> Reply:
        """Datasets, projects, experiments and exported results."""
        if path == "/v1/whoami":
            return 200, {}, {"caller": {"api_key": {"id": "key-1",
                                                    "account": {"id": "acc-7", "name": "Acme"}}}}
        if path.startswith("/v1/datasets/") and path.endswith("/data"):
            found = self.datasets.get(path.split("/")[3])
            return (200, {}, {"data": found}) if found is not None else (
                404, {}, {"detail": "dataset not found"})
        if path == "/v1/projects":
            pid = self.projects.setdefault(req.body["name"], f"proj-{len(self.projects) + 1}")
            return 200, {}, {"id": pid, "name": req.body["name"]}
        if path == "/v1/experiments":
            exp = {**req.body, "id": f"exp-{len(self.experiments) + 1}"}
            self.experiments[exp["id"]] = exp
            return 200, {}, {"experiment": exp}
        if path == "/v1/evaluation-results/batch":
            return self._export(req)
        return 404, {}, {"detail": "not found"}

    def _export(self, req: Recorded) -> Reply:
        with self._lock:
            fault = self.export_faults.pop(0) if self.export_faults else None
        results = req.body["evaluation_results"]
        if any(r.get("dataset_sample_id") in self.export_rejects for r in results):
            fault = "500"
        if fault is not None:
            return int(fault), {}, {"detail": f"fault {fault}"}
        if len(results) > 10:  # the real API's limit
            return 422, {}, {"detail": "at most 10 evaluation results per call"}
        with self._lock:
            self.exported.append(results)
        return 200, {}, {"evaluation_results": [
            {"id": f"r{i}", "app": None, "created_at": "2024-01-01T00:00:00Z",
             "evaluator_id": r["evaluator_id"]} for i, r in enumerate(results)]}

    def _evaluate(self, req: Recorded) -> Reply:
        with self._lock:
            fault = self.faults.pop(0) if self.faults else None
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            time.sleep(self.hang_seconds if fault == "hang" else self.delay)
            if fault == "429":
                return 429, {"retry-after": "0.1"}, {"detail": "slow down"}
            if fault in ("500", "400"):
                return int(fault), {}, {"detail": f"fault {fault}"}
            if fault == "garbage":
                return 200, {}, b"<html>oops</html>"
            return 200, {}, self._verdict(req.body)
        finally:
            with self._lock:
                self.in_flight -= 1

    @staticmethod
    def _verdict(body: dict[str, Any]) -> dict[str, Any]:
        ok = "poet" not in (body.get("evaluated_model_system_prompt") or "")
        spec = body["evaluators"][0]
        return {"results": [{
            "evaluator_id": "ev-123", "criteria": spec.get("criteria"), "status": "success",
            "error_message": None,
            "evaluation_result": {
                "id": "eval-1", "pass": ok, "score_raw": 1.0 if ok else 0.0,
                "explanation": "on point" if ok else "rambles", "evaluation_duration": "PT0.5S",
                "evaluation_metadata": {"positions": []}},
        }]}
