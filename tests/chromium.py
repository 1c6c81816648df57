"""Headless Chromium (Debian's ``chromium``) driven through the DevTools protocol, to look at
pages as a person does: open, wait for something to show, read it, click, screenshot.

A small client over ``websockets`` (which comes with Prefect): one browser per `Browser`,
one page, JSON commands in order. Tests that use it skip, saying why, when there is no
``chromium`` on the machine (Debian: ``apt-get install chromium``).
"""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-unsafe-swiftshader", "--hide-scrollbars", "--remote-debugging-port=0"]


def chromium_or_skip() -> str:
    """The chromium executable; the test skips (saying how to get it) when there is none."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip("no chromium to look at pages with (Debian: apt-get install chromium)")
    return found


class Browser:
    """One headless Chromium and one page of it."""

    def __init__(self, width: int = 1400, height: int = 1000) -> None:
        self._profile = tempfile.mkdtemp(prefix="chromium-")
        self._proc = subprocess.Popen(
            [chromium_or_skip(), *FLAGS, f"--user-data-dir={self._profile}",
             f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port = self._port()
        page = next(t for t in httpx.get(f"http://127.0.0.1:{port}/json/list").json()
                    if t["type"] == "page")
        self._ws = connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=30)
        self._ids = itertools.count(1)
        self.send("Page.enable")
        self.send("Runtime.enable")

    def _port(self) -> int:
        marker = Path(self._profile, "DevToolsActivePort")
        deadline = time.monotonic() + 30
        while not marker.exists() or not marker.read_text().strip():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chromium did not start (exit {self._proc.poll()})")
            time.sleep(0.05)
        return int(marker.read_text().split()[0])

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command; its result (events meanwhile are passed over)."""
        msg_id = next(self._ids)
        self._ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self._ws.recv(timeout=120))
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return dict(reply.get("result", {}))

    def open(self, url: str) -> None:
        self.send("Page.navigate", url=url)

    def js(self, expression: str) -> Any:
        """The value of ``expression`` in the page (awaited when it is a promise)."""
        result = self.send("Runtime.evaluate", expression=expression, awaitPromise=True,
                           returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60) -> Any:
        """Poll ``expression`` until it is truthy (the page has shown what it is about)."""
        deadline, error = time.monotonic() + timeout, ""
        while True:
            try:  # while a page loads, what the expression reads may not be there yet
                value, error = self.js(expression), ""
            except RuntimeError as exc:
                value, error = None, f" (last: {exc})"
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"the page never showed: {expression}{error}")
            time.sleep(0.1)

    def screenshot(self, path: str | Path, full: bool = False) -> None:
        shot = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=full)
        Path(path).write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        try:
            self._ws.close()
        finally:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
