"""The recorder process: an experiment process's flow runs and task runs, kept on Prefect.

Started by `recording` as ``python -m patronus_tasks.prefect.recorder.main``
with the experiment process's Prefect settings. It reads `protocol` messages on stdin
and answers on its original stdout (anything printed goes to stderr). Per experiment
(`Session`): it creates the flow run, records the calls through a `TaskRunRecorder`,
moves the progress artifact, and once the rows are done publishes the artifacts and the
comparison (computed by the experiment's process: `postrun`), waits for the task runs,
and sets the final state. At the end of stdin
(the experiment's process is gone) it finishes what it was handed, marking an
experiment whose rows were not done Crashed, and exits; ``stop`` ends it at once.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import gc
import importlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from types import ModuleType
from typing import IO, TYPE_CHECKING, Any

from patronus_tasks.exceptions import ExperimentError
from patronus_tasks.prefect import clients, flowruns, internal, settings
from patronus_tasks.prefect.clients import get_client, refused, refused_fix
from patronus_tasks.prefect.protocol import (
    CallItem,
    Closing,
    FromRecorder,
    Opening,
    Progress,
    ToRecorder,
)
from patronus_tasks.prefect.recorder import sweeps as _sweeps
from patronus_tasks.prefect.recorder.channel import read_frame, write_frame
from patronus_tasks.prefect.recorder.taskruns import MAX_BUFFERED_BYTES, Limits, TaskRunRecorder
from patronus_tasks.prefect.server import hook as server_hook
from patronus_tasks.prefect.states import cancelled, completed, crashed
from patronus_tasks.prefect.ui import asking
from patronus_tasks.prefect.ui.progress import ProgressArtifact
from patronus_tasks.prefect.ui.writes import Verdict, Write, apply
from patronus_tasks.run import background as _background

if TYPE_CHECKING:
    from patronus_tasks.prefect.internal import ApiClient

logger = logging.getLogger("patronus_tasks.records")
_PROGRESS_EVERY = 1.0  # seconds between moves of the progress artifact
_ORPHANED = "the experiment's process ended before its rows were done"


class Service:
    """Every experiment this process records, and the channel back to their process."""

    def __init__(self, answers: IO[bytes]) -> None:
        self.answers = answers
        self.sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        # (asyncio's locks bind to the loop that first waits on them: made here, used there)
        self.publishing = asyncio.Lock()  # one experiment's post-run at a time
        #: One flow run created at a time once the server has answered: on SQLite, flow
        #: runs created at once made it refuse all but one (503, "database is locked"); 6
        #: experiments started together had their flow runs 2-13 s late (Prefect's client
        #: waits 2, 4, 8 s...). Not before: tries against a server that answers nothing
        #: (~1.5 s each) would wait for each other's.
        self.creating = asyncio.Lock()
        self.answered = False
        self.orphan = False  # the experiment's process is gone
        self._tasks: set[asyncio.Task[None]] = set()

    def tell(self, message: FromRecorder) -> None:
        """Answer the experiment's process (gone: nobody is listening, the work goes on)."""
        with self._lock:
            if self.orphan:
                return
            try:
                write_frame(self.answers, message)
            except (OSError, ValueError):
                self.orphan = True

    def start(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``work`` on this loop, held until done (a loop keeps only weak references)."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def take(self, message: ToRecorder) -> None:
        """A message from the experiment's process (on the background loop)."""
        if message[0] == "open":
            session = self.sessions[message[1].key] = Session(self, message[1])
            session.begin()
        elif message[0] == "calls":
            for key, item in message[1]:
                self.sessions[key].take(item)
            for key, rows in message[2].items():
                self.sessions[key].rows_done = rows
        elif message[0] == "close":
            self.sessions[message[1].key].end(message[1])
        elif message[0] in ("write", "computed"):
            self.sessions[message[1]].computed.put_nowait(message[2])

    def orphaned(self) -> None:
        """The experiment's process is gone: end what it left running."""
        self.orphan = True
        for session in list(self.sessions.values()):
            session.computed.put_nowait(None)  # a post-run it was computing: done here
            if session.closing is None:
                session.end(Closing(session.o.key, "interrupted", why=_ORPHANED))

    def buffered(self) -> int:
        return sum(s.buffered() for s in list(self.sessions.values()))

    def unfinished(self) -> int:
        return sum(not s.finished.is_set() for s in list(self.sessions.values()))


class Session:
    """One experiment: its flow run, its recorder, its end."""

    def __init__(self, service: Service, opening: Opening) -> None:
        self.service, self.o = service, opening
        self.waiting: list[CallItem] = []  # calls before the flow run exists
        self.recorder: TaskRunRecorder | None = None
        self.flow_run_id: str | None = None
        self.parent_task_run: str | None = None
        self.series = opening.series or opening.project
        self.rows_done = 0
        self.calls = 0  # calls handed over to be recorded
        self.closing: Closing | None = None
        self.finished = threading.Event()
        self._opened: asyncio.Task[None] | None = None
        #: What the experiment's process computed of the post-run (`_postrun`); None: gone.
        self.computed: asyncio.Queue[Write | Verdict | str | None] = asyncio.Queue()

    async def opened(self) -> None:
        """Once its flow run is made (or could not be)."""
        if self._opened is not None:
            await asyncio.shield(self._opened)

    def begin(self) -> None:
        self._opened = self.service.start(self._open())

    async def _open(self) -> None:
        self.o = await _sweeps.with_parent(self.service.sessions, self.o)
        created = await _until_created(self.o, self.service)
        if created is None:
            return
        self.flow_run_id, self.parent_task_run = created.flow_run_id, created.parent_task_run
        self.series = created.series
        _say_built_in_server()
        if self.o.kind == "sweep":  # no calls of its own: its variants' flow runs have them
            self.service.tell(("flow_run", self.o.key, (self.flow_run_id, _url(self.flow_run_id),
                                                        self.series)))
            return
        self.recorder = TaskRunRecorder(self.flow_run_id, list(self.o.tags),
                                        on_progress=self._progress, label=self.o.title,
                                        persisting=_persisting(self.o),
                                        limits=Limits(stall_seconds=settings.stall_seconds())
                                        ).start()
        for item in self.waiting:
            self._feed(item)
        self.waiting = []
        self.service.tell(("flow_run", self.o.key,
                           (self.flow_run_id, _url(self.flow_run_id), self.series)))
        self.service.start(self._show_progress())

    def take(self, item: CallItem) -> None:
        self.calls += item[0] == "finished"
        if self.recorder is None:
            self.waiting.append(item)
        else:
            self._feed(item)

    def _feed(self, item: CallItem) -> None:
        assert self.recorder is not None
        if item[0] == "finished":
            self.recorder.finished(*item[1:])
        elif item[0] == "running":
            self.recorder.running(*item[1:])
        else:
            self.recorder.log(item[1])

    def buffered(self) -> int:
        return self.recorder.buffered if self.recorder is not None else 1_000 * len(self.waiting)

    def _progress(self, recorder: TaskRunRecorder) -> None:
        self.service.tell(("progress", self.o.key, _progress_of(recorder)))

    async def _show_progress(self) -> None:
        assert self.flow_run_id is not None
        shown = ProgressArtifact(self.series, self.o.rows, self.flow_run_id)
        async with get_client() as client:
            while True:
                rows = self.rows_done
                await _quietly(shown.show(rows, client), "move the progress artifact")
                if self.closing is not None and rows == self.rows_done:
                    return
                await asyncio.sleep(_PROGRESS_EVERY)

    def end(self, closing: Closing) -> None:
        self.closing = closing
        self.service.start(self._end(closing))

    async def _end(self, closing: Closing) -> None:
        assert self._opened is not None
        await self._opened
        try:
            if self.o.kind == "sweep" and self.flow_run_id is not None:
                await _quietly(_sweeps.end(self, closing), "end the sweep's flow run")
                return
            if self.recorder is None or self.flow_run_id is None:
                self.service.tell(("verdict", self.o.key, []))
                return
            self.recorder.close()
            async with get_client() as client:
                verdict = await self._verdict(client, closing)
                await self.recorder.until_recorded()
                await _quietly(self._settle(client, closing, verdict), "set the final state")
        finally:
            progress = _progress_of(self.recorder)
            if self.recorder is None:  # no flow run: none of its calls was recorded
                progress.expected = progress.lost = self.calls
            self.service.tell(("done", self.o.key, progress))
            self.finished.set()

    async def _verdict(self, client: ApiClient, closing: Closing) -> Verdict:
        """The final state: Cancelled or Crashed when the rows did not finish, else the
        verdict on the published results (told at once: a gate may be waiting for it)."""
        if closing.status == "interrupted":
            kind = crashed if closing.why == _ORPHANED else cancelled
            return Verdict(kind(f"interrupted: {closing.why}"))
        verdict = Verdict(completed("the figures could not be published"))
        async with self.service.publishing:  # the next run of a series compares with this one
            try:
                await _until_answering(client)
                asked = await asking.ask(self.series, client, self.o.baseline)
                verdict = await self._postrun(client, closing, asked)
            except Exception as exc:
                logger.error("could not publish the results of %s on Prefect: %s", self.o.title,
                             " ".join(str(exc).split())[:300])
        said = verdict.note if verdict.note is not None else verdict.failures
        self.service.tell(("verdict", self.o.key, said))
        return verdict

    async def _postrun(self, client: ApiClient, closing: Closing, asked: asking.Asked) -> Verdict:
        """The post-run computed by the experiment's process, which has the results'
        modules loaded (this process would load them: ~1.4 s of CPU, measured, the end of
        a small run), each change applied here as it comes; computed here when that process
        is gone (what it had applied is not made again)."""
        applied = 0
        parent = self.o.parent.flow_run_id if self.o.parent else None
        self.service.tell(("postrun", self.o.key, (asked, parent, clients.ui_path())))
        while not self.service.orphan and (item := await self.computed.get()) is not None:
            if isinstance(item, str):  # its computing failed: said as this process's error
                raise RuntimeError(item)
            if isinstance(item, Verdict):
                return item
            await apply(client, item)
            applied += 1
        postrun = await _postrun_module()
        assert self.flow_run_id is not None
        plan = postrun.Plan.of(self.o, self.flow_run_id, self.series)
        return await postrun.applying(
            client, lambda emit: postrun.compute(plan, closing, asked, _after(applied, emit)))

    async def _settle(self, client: ApiClient, closing: Closing, verdict: Verdict) -> None:
        assert self.flow_run_id is not None and self.recorder is not None
        lines = list(verdict.lines)
        if self.o.record == "failures":
            lines.append((logging.INFO, f"{self.recorder.expected} of {closing.calls} calls "
                          "recorded as task runs (record='failures': errors and failed verdicts)"))
        elif self.o.record == "calls":
            lines.append((logging.INFO, "every call recorded as a task run, not the spans "
                          "inside them (record='calls')"))
        if _BUILT_IN.said:
            lines.insert(0, (logging.INFO, _BUILT_IN.said))
        final = logging.INFO if verdict.state.is_completed() else logging.ERROR
        lines.append((final, f"Finished in state {verdict.state}"))  # as Prefect's engine says
        await _quietly(flowruns.log(client, self.flow_run_id, lines), "log the figures")
        await flowruns.finish(client, self.flow_run_id, verdict.state, self.parent_task_run)


async def _until_created(opening: Opening, service: Service) -> flowruns.Created | None:
    """Create the experiment's flow run, trying again while the server does not answer
    (starting, restarting) for up to `settings.unanswered_seconds`; None (said why) if it
    never did. One try at a time once the server has answered (`Service.creating`)."""
    deadline, wait = time.monotonic() + settings.unanswered_seconds(), 0.5
    while True:
        try:
            one_at_a_time = service.creating if service.answered else contextlib.nullcontext()
            async with one_at_a_time, get_client() as client:
                created = await flowruns.create(client, opening)
            service.answered = True
            return created
        except ExperimentError as exc:  # the built-in server did not start: it says why
            logger.error("%s", exc)
            return None
        except Exception as exc:
            if refused(exc):  # it answers, and will not without the auth string
                logger.error("%s: %s is not recorded on Prefect (its results are written)",
                             refused_fix(clients.api_url()), opening.title)
                return None
            if time.monotonic() + wait > deadline:
                logger.error("%s", _unanswered(opening, exc))
                return None
        await asyncio.sleep(wait)
        wait = min(wait * 2, 8.0)


def _unanswered(opening: Opening, exc: Exception) -> str:
    """Why the flow run could not be made, in this package's terms, with the fix."""
    from patronus_tasks.http import redact_url

    url = redact_url(clients.api_url() or "")
    brief = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
    return (f"the Prefect API at {url} did not answer for {settings.unanswered_seconds():g} s ({brief}): "
            f"{opening.title} is not recorded on Prefect (its results are written). Start a "
            "server there (`patronus-tasks server up`), point PREFECT_API_URL at one that runs, "
            "or unset PREFECT_API_URL to use Prefect's built-in server.")


def _persisting(opening: Opening) -> bool:
    """Whether the server stores events: known for a built-in server (the experiment's
    process's, or ours), else taken to (the recorder finds out if not)."""
    if opening.persisting is not None:
        return opening.persisting
    server = server_hook.built_in()
    return server is None or bool(server.persisting)


class _BuiltIn:
    said: str | None = None  # what was said of this process's built-in server


_BUILT_IN = _BuiltIn()


def _say_built_in_server() -> None:
    """Once, when this process runs the built-in server: say so where the user reads."""
    note = server_hook.startup_note()
    if note:
        _BUILT_IN.said = note
        print(f"patronus-tasks: {note}", file=sys.stderr, flush=True)


#: What computing a post-run here needs (pandas, pyarrow, the report, matplotlib: 1.5-3.5
#: s of imports, measured under load 10): loaded only when the experiment's process,
#: which computes it otherwise, is gone.
_POSTRUN_MODULE = "patronus_tasks.prefect.ui.postrun"


async def _postrun_module() -> ModuleType:
    """The post-run module, loaded in a thread (the loop goes on posting meanwhile)."""
    return await asyncio.to_thread(importlib.import_module, _POSTRUN_MODULE)


#: The garbage collector's thresholds while Prefect's client loads: Python's (700
#: allocations) ran ~1,400 young and a dozen full passes over ~1M new objects of the
#: post-run's modules, 7-10% of their ~1.1 s of CPU (measured).
_LOADING_GC = (50_000, 20, 100)


def _preload(names: tuple[str, ...]) -> None:
    """Load modules in a thread from the process's start, while it makes the flow run and
    posts the first calls (I/O, mostly: they lose a few ms to the import's hold on the
    GIL). The collector runs less often meanwhile, then as before, what they made left
    out of its passes."""
    before = gc.get_threshold()
    gc.set_threshold(*_LOADING_GC)

    def load() -> None:
        try:
            for name in names:
                importlib.import_module(name)
        except Exception as exc:  # said again, if it matters, where it is used
            logger.warning("could not load %s ahead of its use: %s", name, exc)
        finally:
            gc.freeze()  # modules live as long as the process: never collected
            gc.set_threshold(*before)

    threading.Thread(target=load, name="patronus-tasks-preload", daemon=True).start()


def _after(applied: int, emit: Callable[[Write], None]) -> Callable[[Write], None]:
    """``emit`` past the first ``applied`` writes (the post-run makes them in one order)."""
    seen = [0]

    def emit_rest(write: Write) -> None:
        seen[0] += 1
        if seen[0] > applied:
            emit(write)

    return emit_rest


def _progress_of(recorder: TaskRunRecorder | None) -> Progress:
    if recorder is None:
        return Progress(ended=True)
    return Progress(expected=recorder.expected, recorded=recorder.recorded, lost=recorder.lost,
                    logs_dropped=recorder.logs_dropped, ended=recorder.ended,
                    notes=list(recorder.notes))


def _url(flow_run_id: str) -> str | None:
    ui = clients.ui_url()
    return f"{ui}/runs/flow-run/{flow_run_id}" if ui else None


async def _until_answering(client: ApiClient) -> None:
    """Wait (up to `settings.unanswered_seconds`) for a server that does not answer now: one
    restarting as a run ends got none of its artifacts before, publishing at once."""
    deadline, wait = time.monotonic() + settings.unanswered_seconds(), 0.5
    while not await internal.answers(client) and time.monotonic() + wait < deadline:
        await asyncio.sleep(wait)
        wait = min(wait * 2, 4.0)


async def _quietly(work: Coroutine[Any, Any, Any], what: str) -> None:
    try:
        await work
    except Exception as exc:
        logger.warning("could not %s on Prefect: %s", what, " ".join(str(exc).split())[:300])


def _hold_while_full(service: Service) -> None:
    """Read no more while the events waiting here are over their bound: the experiment's
    process then waits with its calls (its rows go no faster than the server records)."""
    while service.buffered() >= MAX_BUFFERED_BYTES:
        time.sleep(0.05)


#: Prefect's client, when the environment does not give every client setting: its
#: first use waits for the thread loading it.
_PREFECT_CLIENT = "prefect.client.orchestration"


def main() -> None:
    server_hook.install()  # the built-in server, if this process starts one, is ours
    lean = clients.use_environment(os.environ)  # Prefect is not imported, then
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # print() of any library goes to stderr, not into the channel
    service = Service(answers)
    if not lean:
        _preload((_PREFECT_CLIENT,))
    loop = _background.loop()
    source = sys.stdin.buffer
    while True:
        try:
            message: ToRecorder = read_frame(source)
        except EOFError:
            break
        if message[0] == "stop":
            os._exit(0)  # the experiment's process stopped waiting: so do we
        loop.call_soon_threadsafe(service.take, message)
        _hold_while_full(service)
    loop.call_soon_threadsafe(service.orphaned)
    while service.unfinished():  # each ends within its recorder's time limits
        time.sleep(0.02)
    _exit()


def _exit() -> None:
    """End the process once its work is done, the interpreter's teardown left out: with
    Prefect, pandas, pyarrow and matplotlib loaded, it took 0.8-4.7 s after the last exit
    hook (measured under load 10-14), which the experiment's process waited out before it
    exited. The exit hooks still run (one stops a built-in server this process started),
    then the streams are flushed."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
