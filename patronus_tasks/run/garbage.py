"""Python's garbage collector while rows run: fewer passes over the objects in flight.

At high concurrency an experiment keeps hundreds of calls in flight, each holding its
request, its coroutine frames and its records; CPython's collector (a pass over the
youngest objects every 700 allocations, the older generations every 10 of those) walks
them again and again. Measured on a 2-core machine at C=256 (bench/README.md): 2.4-2.7 s
of a 16-18 s run's CPU went to collections, and the rows' process is what bounds the
rows there. With the youngest generation's threshold at `YOUNG` (and the older ones
left as they are) collections took ~1 s, the rows' CPU 0.25-0.35 ms less per row.
Nothing else changes: cycles are still collected, only in fewer passes over more young
objects (a few MB at most).

The threshold is raised while a row loop runs (several at once share it) and set back
when the last one ends, with one full collection after rows that ran over
`COLLECT_AFTER` seconds; a threshold the user set above `YOUNG` is kept.
``PATRONUS_TASKS_GC=default`` leaves Python's collector as it is.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import time
from collections.abc import Iterator

#: The youngest generation's threshold while rows run (Python's default: 700).
YOUNG = 7000
#: Seconds of rows after which a full collection follows them.
COLLECT_AFTER = 5.0
ENV = "PATRONUS_TASKS_GC"


class _Raised:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0
        self.saved: tuple[int, int, int] | None = None
        self.since = 0.0  # when the threshold was raised

    def enter(self) -> None:
        with self.lock:
            self.users += 1
            if self.users == 1 and gc.get_threshold()[0] < YOUNG:
                self.since = time.monotonic()
                self.saved = gc.get_threshold()
                gc.set_threshold(YOUNG, *self.saved[1:])

    def exit(self) -> None:
        with self.lock:
            self.users -= 1
            if self.users == 0 and self.saved is not None:
                if gc.get_threshold()[0] == YOUNG:  # unless changed since by someone else
                    gc.set_threshold(*self.saved)
                self.saved = None
                if time.monotonic() - self.since > COLLECT_AFTER:
                    # What the fewer passes left, collected before the results are merged:
                    # 1,000,000 rows peaked at 840-955 MB without it, 747 with it, 588-620
                    # with Python's threshold (bench/million.py). A full pass costs ~35 ms:
                    # not for short runs.
                    gc.collect()


_RAISED = _Raised()


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    """The youngest generation's threshold at `YOUNG` while the block runs."""
    if os.environ.get(ENV, "").strip().lower() == "default":
        yield
        return
    _RAISED.enter()
    try:
        yield
    finally:
        _RAISED.exit()
