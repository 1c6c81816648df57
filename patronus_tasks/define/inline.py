"""Where a sync step's calls run: in a thread (safe for slow code) or inline (cheap).

Handing a call to a thread and back costs ~0.1-0.5 ms of the event loop's time under
load (queue hand-off, GIL switches): more than a cheap evaluator's own work, and paid
on every row. A step's ``inline`` option chooses:

- ``True``: every call runs in the event loop's thread (no hand-off; a slow call
  stalls the other rows while it runs);
- ``False``: every call runs in a thread;
- ``None`` (default): calls start in threads, timed; after `PROBE_CALLS` calls of at
  most `FAST_SECONDS` each, the step runs inline; one inline call over `SLOW_SECONDS`
  sends it back to threads for good. A step with a timeout always runs in threads,
  since an inline call cannot be interrupted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("patronus_tasks")
PROBE_CALLS, FAST_SECONDS, SLOW_SECONDS = 16, 0.001, 0.02


class InlinePolicy:
    """Decides, from measured call times, whether a sync step runs inline."""

    def __init__(self, name: str, inline: bool | None, has_timeout: bool,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.name = name
        self.clock = clock  # what calls are timed with (a test gives one it moves itself)
        self.inline = bool(inline)
        self._fixed = inline is not None
        self._settled = self._fixed or has_timeout
        self._fast_calls = 0

    def call(self, fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
        """Call ``fn`` (in whatever thread this runs), timing it for the decision."""
        if self._fixed or (self._settled and not self.inline):
            return fn(**kwargs)
        start = self.clock()
        try:
            return fn(**kwargs)
        finally:
            self._observe(self.clock() - start)

    def _observe(self, seconds: float) -> None:
        # Races between threads only miscount a probe: the decision stays sound.
        if self._settled:
            if self.inline and seconds > SLOW_SECONDS:
                self.inline = False
                logger.info("sync step %r took %.3f s inline: its calls run in threads from "
                            "now on", self.name, seconds)
        elif seconds > FAST_SECONDS:
            self._settled = True
        else:
            self._fast_calls += 1
            if self._fast_calls >= PROBE_CALLS:
                self.inline = self._settled = True
