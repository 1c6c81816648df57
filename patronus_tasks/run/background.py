"""An event loop in a daemon thread, for work that outlives an experiment's own loop.

An experiment returns as soon as its rows are done and its results written; the task-run
records Prefect has not taken yet keep going here (`recorder`). Before the process
exits (and before this package stops its built-in server) `drain` waits for them,
saying how many are left; Ctrl-C stops that wait.
"""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import os
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TextIO

from patronus_tasks.console import printable

#: A line saying the same as the last one is said again after this long.
_REPEAT_SECONDS = 20.0
_PROGRESS_SECONDS = 5.0


class Pending(Protocol):
    """Work the process must not exit before (a recorder catching up)."""

    @property
    def done(self) -> bool: ...

    def describe(self) -> str: ...

    def wait(self, timeout: float) -> bool: ...


class _Loop:
    """The process's background loop, started on first use."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.pending: list[Pending] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self._lock = threading.Lock()

    def get(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self.loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="patronus-tasks-background",
                                 daemon=True).start()
                self.loop = loop
            return self.loop


_LOOP = _Loop()



def _forget_in_child() -> None:
    global _LOOP
    _LOOP = _Loop()  # a forked child has no background thread: it starts its own


os.register_at_fork(after_in_child=_forget_in_child)


def submit(coro: Coroutine[Any, Any, None], context: contextvars.Context | None = None) -> None:
    """Run ``coro`` on the background loop, in ``context`` (default: a copy of the
    caller's, so it sees the caller's Prefect settings)."""
    loop = _LOOP.get()
    context = context or contextvars.copy_context()

    def start() -> None:
        task = loop.create_task(coro, context=context)
        _LOOP.tasks.add(task)  # the loop keeps only weak references to its tasks
        task.add_done_callback(_LOOP.tasks.discard)

    loop.call_soon_threadsafe(start)


def loop() -> asyncio.AbstractEventLoop:
    """The background loop (started on first use)."""
    return _LOOP.get()


def keep_alive(work: Pending) -> None:
    """Do not let the process exit before ``work`` is done (see `drain`)."""
    with _LOOP._lock:
        _LOOP.pending = [p for p in _LOOP.pending if not p.done] + [work]


def unfinished() -> list[Pending]:
    with _LOOP._lock:
        return [p for p in _LOOP.pending if not p.done]


def drain(timeout: float | None = None) -> bool:
    """Wait for every unfinished piece of work, printing what is left every few seconds.

    Returns whether all of it finished; Ctrl-C (or ``timeout``) stops the wait.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    said, line = False, WaitLine("Waiting for {what} ({seconds:.0f} s so far; Ctrl-C stops "
                                 "waiting, the results are written already)")
    waited: list[Pending] = []
    try:
        while (left := unfinished()):
            waited += [p for p in left if p not in waited]
            if deadline is not None and time.monotonic() >= deadline:
                return False
            if said or not left[0].wait(1.0):
                line.say("; ".join(p.describe() for p in left))
                said = True
                left[0].wait(_PROGRESS_SECONDS)
    except KeyboardInterrupt:
        say("Stopped waiting: " + "; ".join(p.describe() for p in unfinished()))
        return False
    if said:
        say(_outcome(waited))
    return True


class WaitLine:
    """What a wait is waiting for, said when it changed, else `_REPEAT_SECONDS` after it
    was last said (the same line every 5 s looked like a hang), with the time so far:
    ``template`` has ``{what}`` and ``{seconds}``."""

    def __init__(self, template: str) -> None:
        self.template, self.start = template, time.monotonic()
        self.last, self.said_at = "", 0.0

    def say(self, what: str) -> None:
        now = time.monotonic()
        if what != self.last or now - self.said_at >= _REPEAT_SECONDS:
            say(self.template.format(what=what, seconds=now - self.start))
            self.last, self.said_at = what, now


def _outcome(waited: list[Pending]) -> str:
    if all(isinstance(p, Afterwards) for p in waited):  # nothing was recorded to Prefect
        return "Done: " + "; ".join(dict.fromkeys(p.what for p in waited if isinstance(p, Afterwards))) + "."
    lost = sum(int(getattr(p, "lost", 0) or 0) for p in waited)
    if not lost:
        return "Prefect has recorded every task run."
    return (f"Prefect did not record {lost} task runs (said above why); their rows are in the "
            "Parquet results.")


class Afterwards:
    """Work after an experiment's results (its HTML report, with no recorder process to do
    it), in a daemon thread the process waits for before it exits (`drain`)."""

    lost = 0

    def __init__(self, what: str, work: Callable[[], object]) -> None:
        self.what = what
        self._done = threading.Event()

        def run() -> None:
            try:
                work()
            finally:
                self._done.set()

        threading.Thread(target=run, name="patronus-tasks-afterwards", daemon=True).start()
        keep_alive(self)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def describe(self) -> str:
        return self.what

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)


#: The signal that stopped this process's rows, once one did (`api` turns SIGTERM into an
#: interrupt; in the rows' event loop it arrives as a cancellation, which names none).
stopped_by: list[str] = []


def say(text: str) -> None:
    """A line for the person running the experiment (stderr: stdout is theirs)."""
    console_print(f"patronus-tasks: {text}", sys.stderr)


def console_print(text: str, stream: TextIO) -> None:
    """``text`` on ``stream``, never failing the run: a worker that died leaves its flow
    run writing to a closed pipe, and a completed night ended Crashed on the summary's
    BrokenPipeError. The stream is then swapped for /dev/null (Python flushes it at exit,
    failing again with exit status 120). Control characters are shown escaped (`printable`)."""
    try:
        print(printable(text), file=stream, flush=True)
    except (OSError, ValueError) as exc:
        if isinstance(exc, ValueError) and not stream.closed:
            raise  # a text the stream cannot encode is not a gone reader
        null = open(os.devnull, "w")  # noqa: SIM115 - kept open for the process's life
        if stream is sys.stdout:
            sys.stdout = null
        elif stream is sys.stderr:
            sys.stderr = null


def _lighter_exit() -> None:
    """The interpreter's teardown without its full garbage-collector passes: after a run,
    they walk every object (~130k for a 10-row script) several times while the modules are
    cleared, 0.3-0.4 s of a script's exit (measured: 0.04-0.06 s once frozen). The garbage
    there is now is collected first, so its finalizers run as before; objects still in use
    are left for the OS to reclaim (files are still closed as their last reference goes)."""
    import gc

    gc.collect()
    gc.freeze()


# Run in reverse order at exit: the wait for the records first, then the freeze.
atexit.register(_lighter_exit)
atexit.register(drain)
