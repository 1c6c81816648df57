"""A server that limits the rate of requests (Prefect Cloud): its ``429``s, and the pace
it allows.

Prefect Cloud counts every event and log against per-minute limits and answers ``429
Too Many Requests`` with ``Retry-After`` past them. Prefect's client already waits that
long and tries again (a few times); what it still refuses is sent again once the server
allows, never dropped, and never sooner (`RateLimited`). `Pace` watches the answers to
say how long the catch-up will take at the pace the server allows.
"""

from __future__ import annotations

import email.utils
import time
from collections import deque

import httpx

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
            return cls(retry_after(exc.response))
        return None

    @classmethod
    def raise_if(cls, exc: BaseException) -> None:
        limited = cls.of(exc)
        if limited is not None:
            raise limited from exc


def retry_after(response: httpx.Response) -> float:
    """Seconds a response's ``Retry-After`` asks for (seconds or an HTTP date)."""
    value = response.headers.get("Retry-After", "").strip()
    if not value:
        return _DEFAULT_WAIT
    try:
        return max(0.0, float(value))
    except ValueError:
        when = email.utils.parsedate_to_datetime(value)
        return max(0.0, when.timestamp() - time.time()) if when else _DEFAULT_WAIT


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
            self.limited_at, self.retry_after = time.monotonic(), retry_after(response)
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
