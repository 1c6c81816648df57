"""The experiment's side of recording on Prefect: calls handed to a recorder process.

Recording a call costs Python work (building, serialising and posting its event, then
asking the server what it holds): in the rows' process it took ~1.7-2.4 ms of CPU per
row and, on a thread sharing the GIL with the rows' event loop, delayed the rows by more
than that. So the rows' process only appends each call to a queue; a writer thread
sends them in batches (one pickle per ~20 ms) through a pipe to a recorder process
(`recorder.main`), which does all the Prefect work: it creates the flow run, records the
calls as task runs, publishes the artifacts and the comparison, and sets the final
state. The rows' process never imports Prefect for it (~1.5 s), nor waits for a server.

One recorder process serves every experiment of this process with the same Prefect
settings (a new one starts when they change). The process does not exit before the
recordings are done (`background.drain`: it says what it waits for; Ctrl-C stops the
wait). If this process is killed, the recorder finishes what it was handed and marks the
flow run Crashed; if the recorder dies, what it had not recorded is counted lost.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import datetime as dt
import hashlib
import importlib
import logging
import os
import pickle
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from patronus_tasks.prefect import settings
from patronus_tasks.prefect.events import Call, State
from patronus_tasks.prefect.protocol import (
    CallItem,
    Closing,
    FromRecorder,
    Opening,
    Outgoing,
    Progress,
    ToRecorder,
)
from patronus_tasks.prefect.recorder.channel import read_frame, write_frame
from patronus_tasks.prefect.server import hook as server_hook
from patronus_tasks.record.manifest import VerdictNote
from patronus_tasks.run import background as _background

if TYPE_CHECKING:
    from patronus_tasks.prefect.ui.asking import Asked
    from patronus_tasks.prefect.ui.writes import Verdict
    from patronus_tasks.run.loop import RunTotals

logger = logging.getLogger("patronus_tasks.records")
#: Calls waiting to be sent to the recorder process, at most: past it, rows wait.
MAX_WAITING = 50_000
_SEND_EVERY = 0.02  # seconds between the writer's batches
#: Environment variables the recorder process's work depends on: another value of any of
#: them needs another recorder process.
_SETTINGS_PREFIXES = ("PREFECT_", "AWS_", "AZURE_", "GOOGLE_", "PATRONUS_TASKS_RECORDER_")


class Recording:
    """One experiment's recording, as the rows' process sees it: where its calls go, and
    how far Prefect is with them (told by the recorder process)."""

    def __init__(self, process: RecorderProcess, opening: Opening,
                 on_progress: Callable[[Recording], None] | None = None) -> None:
        self.process, self.opening, self.key = process, opening, opening.key
        self.run_key = opening.key  # the calls' task-run ids derive from it
        self.label = opening.title
        self.on_progress = on_progress
        self.expected = 0  # calls handed on to be recorded
        self.progress = Progress()
        self.flow_run_id: str | None = None
        self.flow_run_url: str | None = None
        self.series: str | None = None  # the series it is compared in, once known
        self.tally: RunTotals | None = None  # the rows' totals, for the progress artifact
        self.verdict: list[str] | None = None  # gates that failed, said once published
        self.verdict_note: VerdictNote | None = None  # the verdict, as Prefect shows it
        self._verdict_said = threading.Event()
        self._done = threading.Event()
        self.closing: Closing | None = None

    # -- the rows' side (the experiment's event loop) ------------------------------------

    @property
    def rows_done(self) -> int:
        return self.tally.rows if self.tally is not None else 0

    def running(self, call: Call, run_count: int) -> None:
        self.process.queue.append(("i", self.key, ("running", call, run_count)))

    def finished(self, call: Call, state: State, run_count: int, end: dt.datetime) -> None:
        self.expected += 1
        self.process.queue.append(("i", self.key, ("finished", call, state, run_count, end)))

    def log(self, record: dict[str, Any]) -> None:
        self.process.queue.append(("i", self.key, ("log", record)))

    async def backpressure(self) -> None:
        """Wait while more than `MAX_WAITING` calls wait to be sent (the recorder process
        holds back when the server lags: then rows go no faster than it records)."""
        while len(self.process.queue) > MAX_WAITING and not self._done.is_set():
            await asyncio.sleep(0.05)

    def close(self, closing: Closing) -> None:
        """The rows are done (or interrupted): the recorder process takes it from here,
        asking this process to compute the post-run (`compute`), whose modules start
        loading now, while it asks the server what the post-run needs."""
        self.closing = closing
        self.process.send(("c", closing))
        if closing.status == "completed" and closing.sweep is None:
            threading.Thread(target=_load_postrun, name="patronus-tasks-postrun-load",
                             daemon=True).start()

    def compute(self, asked: Asked, parent: str | None, ui_path: str) -> None:
        """The post-run, computed here (a thread): this process has the results' modules
        loaded, the recorder process would load them. Each change it makes goes to the
        recorder process as made, which applies it; then the verdict, or the error."""
        try:
            from patronus_tasks.prefect.ui import links, postrun

            assert self.closing is not None and self.flow_run_id is not None
            plan = dataclasses.replace(postrun.Plan.of(self.opening, self.flow_run_id,
                                                       self.series or self.opening.project),
                                       parent=parent)  # a sweep's is known there only
            with links.prefix_given(ui_path):
                verdict: Verdict | str = postrun.compute(
                    plan, self.closing, asked,
                    lambda write: self.process.send(("write", self.key, write)))
        except Exception as exc:
            verdict = f"{type(exc).__name__}: {exc}"
        self.process.send(("computed", self.key, verdict))

    # -- what the recorder process says ----------------------------------------------------

    @property
    def recorded(self) -> int:
        return self.progress.recorded

    @property
    def lost(self) -> int:
        return self.progress.lost

    @property
    def logs_dropped(self) -> int:
        return self.progress.logs_dropped

    @property
    def ended(self) -> bool:
        return self.progress.ended

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def told(self, message: FromRecorder) -> None:
        """A message of the recorder process about this recording."""
        if message[0] == "flow_run":
            self.flow_run_id, self.flow_run_url, self.series = message[2]
        elif message[0] == "postrun":
            threading.Thread(target=self.compute, args=message[2], daemon=True,
                             name="patronus-tasks-postrun").start()
            return
        elif message[0] == "verdict":
            said = message[2]
            note: VerdictNote | None = pickle.loads(said) if isinstance(said, bytes) else None
            self.verdict_note = note
            self.verdict = list(note.failures if note is not None else said if isinstance(said, list) else [])
            self._noted()
            self._verdict_said.set()
            return
        else:
            self.progress = message[2]
        self._noted()
        if message[0] == "done":
            self._verdict_said.set()
            self._done.set()

    def gone(self, why: str) -> None:
        """The recorder process is gone: what it had not recorded is lost."""
        if self.done:
            return
        self.progress.lost = self.expected - self.progress.recorded
        self.progress.ended = True
        logger.error("recording %s on Prefect stopped (%s): %d of %d task runs are not recorded "
                     "(their rows are in the Parquet results)", self.label, why, self.lost,
                     self.expected)
        self._noted()
        self._verdict_said.set()
        self._done.set()

    def _noted(self) -> None:
        if self.on_progress is not None:
            try:
                self.on_progress(self)
            except Exception as exc:
                logger.warning("could not note Prefect's progress: %s", exc)

    # -- waiting ---------------------------------------------------------------------------

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the flow run has its task runs and final state; True if so."""
        return self._done.wait(timeout)

    def wait_verdict(self, timeout: float | None = None) -> list[str] | None:
        """The gates that failed, once the recorder process has compared this run with the
        previous one of its series (None: it could not say)."""
        self._verdict_said.wait(timeout)
        return self.verdict

    async def until_recorded(self, report: Callable[[Recording], None] | None = None,
                             every: float = 5.0) -> None:
        while not await asyncio.to_thread(self._done.wait, every):
            if report is not None:
                report(self)

    def describe(self) -> str:
        left = self.expected - self.recorded - self.lost
        notes = "; ".join(self.progress.notes)
        what = (f"Prefect to record {left} of {self.expected} task runs of {self.label}" if left
                else f"the flow run of {self.label} to finish (its artifacts and final state)")
        return what + (f" ({notes})" if notes else "")


class RecorderProcess:
    """A recorder process (`recorder.main`) and the threads that talk to it."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.queue: deque[Outgoing] = deque()  # messages to send, in order
        self.recordings: dict[str, Recording] = {}
        self._wake = threading.Event()
        self._opened: set[str] = set()  # recordings whose opening was sent
        self._closing = False
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "patronus_tasks.prefect.recorder"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
            process_group=0)  # Ctrl-C in a terminal interrupts the rows, not their recording
        threading.Thread(target=self._write, name="patronus-tasks-recorder-writer",
                         daemon=True).start()
        threading.Thread(target=self._read, name="patronus-tasks-recorder-reader",
                         daemon=True).start()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None and not self._closing

    def open(self, opening: Opening, on_progress: Callable[[Recording], None] | None) -> Recording:
        recording = Recording(self, opening, on_progress)
        self.recordings[opening.key] = recording
        self.send(("o", opening))
        _background.keep_alive(recording)
        return recording

    def send(self, message: Outgoing) -> None:
        """Queue a message (not a call: those go straight into `queue`) and send it soon."""
        self.queue.append(message)
        self._wake.set()

    def _write(self) -> None:
        stdin = self.proc.stdin
        assert stdin is not None
        try:
            while not (self._closing and not self.queue):
                self._wake.wait(_SEND_EVERY)
                self._wake.clear()
                self._send_waiting(stdin)
        except (BrokenPipeError, OSError, ValueError):
            return  # the process is gone: the reader says so
        with contextlib.suppress(OSError, ValueError):
            stdin.close()

    def _send_waiting(self, stdin: IO[bytes]) -> None:
        calls: list[tuple[str, CallItem]] = []
        while self.queue:
            message = self.queue.popleft()
            if message[0] == "i":
                calls.append((message[1], message[2]))
                continue
            self._send_calls(stdin, calls)
            calls = []
            if message[0] == "o":
                _send(stdin, ("open", message[1]))
                self._opened.add(message[1].key)
            else:
                _send(stdin, ("close", message[1]) if message[0] == "c" else message)
        self._send_calls(stdin, calls)

    def _send_calls(self, stdin: IO[bytes], calls: list[tuple[str, CallItem]]) -> None:
        rows = {r.key: r.rows_done for r in list(self.recordings.values())
                if r.key in self._opened and not r.done}
        if calls or rows:
            _send(stdin, ("calls", calls, rows))

    def _read(self) -> None:
        stdout = self.proc.stdout
        assert stdout is not None
        try:
            while True:
                message: FromRecorder = read_frame(stdout)
                recording = self.recordings.get(message[1])
                if recording is not None:
                    recording.told(message)
        except (EOFError, OSError, ValueError):
            pass
        code = self.proc.wait()
        for recording in list(self.recordings.values()):
            recording.gone(f"the recorder process exited with code {code}")

    def close(self, stop: bool = False) -> None:
        """No more experiments: the process ends once its recordings are done (``stop``:
        at once, what it has not recorded being lost)."""
        if stop:
            self.queue.append(("stop",))
        self._closing = True
        self._wake.set()

    def idle(self) -> bool:
        return all(r.done for r in self.recordings.values())



def _load_postrun() -> None:
    """The post-run's modules (the charts' matplotlib), loaded ahead of its computing."""
    with contextlib.suppress(Exception):  # said where it is computed, if it matters
        for name in ("patronus_tasks.prefect.ui.postrun", "matplotlib.figure",
                     "matplotlib.backends.backend_agg"):
            importlib.import_module(name)


def _send(stdin: IO[bytes], message: ToRecorder) -> None:
    write_frame(stdin, message)

class _Processes:
    """This process's recorder processes: the current one, and earlier ones finishing."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.current: RecorderProcess | None = None
        self.retired: list[RecorderProcess] = []
        self.registered = False

    def get(self) -> RecorderProcess:
        env = recorder_env()
        with self.lock:
            current = self.current
            if current is None or not current.alive or _settings(current.env) != _settings(env):
                if current is not None:
                    self.retired.append(current)
                current = self.current = RecorderProcess(env)
                self._register()
            self._close_idle()
            return current

    def _close_idle(self) -> None:
        for process in [p for p in self.retired if p.idle()]:
            process.close()
            self.retired.remove(process)

    def _register(self) -> None:
        if not self.registered:
            atexit.register(self.shutdown)
            self.registered = True

    def shutdown(self) -> None:
        """At exit: wait for the recordings (`background.drain`), then end the processes."""
        finished = _background.drain()
        with self.lock:
            processes = [p for p in [self.current, *self.retired] if p is not None]
            self.current, self.retired = None, []
        for process in processes:
            process.close(stop=not finished)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.proc.wait(timeout=10)


_PROCESSES = _Processes()


def _forget_in_child() -> None:
    global _PROCESSES
    _PROCESSES = _Processes()  # a forked child has no recorder threads: it starts its own


os.register_at_fork(after_in_child=_forget_in_child)


def open_recording(opening: Opening,
                   on_progress: Callable[[Recording], None] | None = None) -> Recording:
    """Start recording an experiment (its flow run is created by the recorder process)."""
    return _PROCESSES.get().open(opening, on_progress)


def _settings(env: dict[str, str]) -> str:
    found = sorted((k, v) for k, v in env.items() if k.startswith(_SETTINGS_PREFIXES))
    return hashlib.sha256(repr(found).encode()).hexdigest()


def recorder_env() -> dict[str, str]:
    """The recorder process's environment: ours, this process's Prefect settings if it
    has loaded Prefect (a test's or a user's temporary settings), the built-in server this
    process runs if any (a user's flow started it), and where this package is."""
    for patience in (settings.unanswered_seconds, settings.stall_seconds):
        patience()  # a bad value is a ConfigError here, not a recorder process that dies
    env = dict(os.environ)
    if "prefect.settings" in sys.modules:
        from prefect.settings import get_current_settings

        env.update(get_current_settings().to_environment_variables(exclude_unset=True))
    server = server_hook.built_in()
    if server is not None:
        env["PREFECT_API_URL"] = server.api_url
    root = str(Path(__file__).resolve().parents[3])  # the folder holding patronus_tasks/
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env
