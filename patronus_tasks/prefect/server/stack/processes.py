"""The stack's processes: each started in a session of its own, recorded, found and
stopped by its process id."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from patronus_tasks.exceptions import ExperimentError
from patronus_tasks.procs import alive, stat_fields


@dataclass
class Proc:
    """One process of the stack, or (``pid`` None) a server it uses but did not start.

    ``url`` is what it serves, never with a password (`redact`); ``argv`` how it was
    started (never a secret: those go through the environment), so that a local
    PostgreSQL or Redis can be started again as it was (`restart`)."""

    role: str
    pid: int | None = None
    url: str = ""
    argv: list[str] = field(default_factory=list)
    log: str = ""
    #: PostgreSQL stops at once (and cleanly) on SIGINT; on SIGTERM it would wait for
    #: every client to go. Signalled alone: its own children must not get SIGINT.
    stop_signal: int = signal.SIGTERM
    signal_group: bool = True
    nice: int = 0  # steps below normal CPU priority
    #: The boot and start time of the process `spawn` started (`identity`): a pid alive
    #: with another is another process (after a reboot, or the pid reused), never ours
    #: to report running or to signal. "": not known (a stack recorded before it).
    started: str = ""

    @property
    def external(self) -> bool:
        return self.pid is None

    def is_ours(self) -> bool:
        """The recorded pid is still the process started as this one."""
        return not self.started or self.pid is None or identity(self.pid) == self.started

    def running(self) -> bool:
        return alive(self.pid) and self.is_ours()


def identity(pid: int) -> str:
    """``pid``'s boot and start time (Linux's /proc: they tell a reused pid apart), or ""."""
    fields = stat_fields(pid)
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""
    return f"{boot}:{fields[19]}" if len(fields) > 19 else ""


def spawn(proc: Proc, env: dict[str, str], cwd: Path, nice: int = 0) -> Proc:
    """Start ``proc.argv`` (its output appended to ``proc.log``) and record its pid."""
    proc.nice = nice
    with Path(proc.log).open("ab") as out:
        child = subprocess.Popen(proc.argv, env=env, cwd=cwd, stdout=out,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True, preexec_fn=_niceness(nice))
    proc.pid = child.pid
    proc.started = identity(child.pid)
    return proc


def _niceness(nice: int) -> Callable[[], None] | None:
    if nice <= 0 or not hasattr(os, "nice"):
        return None

    def lower() -> None:  # runs in the child, after its setsid, before it starts
        os.nice(nice)
        # Linux's autogroups (on by default on most distributions) share the CPU between
        # sessions before nice values count: each process started in a session of its own
        # got as much as the whole experiment, whatever its nice (on the production stack
        # the rows ran at 0.23 of a plain loop, five niced groups against one). The
        # session's own group is lowered too.
        with contextlib.suppress(OSError):
            Path("/proc/self/autogroup").write_text(str(nice))

    return lower


def lower(procs: list[Proc], nice: int) -> None:
    """Lower these running processes' CPU priority (and their children's) by ``nice``, as
    `spawn` would have: done once they answer. Started niced, the stack's server was not
    up within 180 s on a machine with a CPU hog on each core (its start-up's ~5 s of CPU
    waited behind everything); up, it records below the rows' priority all the same."""
    if nice <= 0 or not hasattr(os, "setpriority"):
        return
    target = min(os.getpriority(os.PRIO_PROCESS, 0) + nice, 19)
    for proc in procs:
        if proc.pid is None or proc.external:
            continue
        for pid in (proc.pid, *children(proc.pid)):
            renice(pid, target)
        with contextlib.suppress(OSError):  # its session's group too (see `_niceness`)
            Path(f"/proc/{proc.pid}/autogroup").write_text(str(nice))
        proc.nice = nice


def renice(pid: int, value: int) -> None:
    """Every thread of ``pid`` at priority ``value``: Linux nices one thread per call (the
    pid alone left 7 of a server's 8 threads at their priority, /proc's task list), so
    each, again until none is new; threads started later inherit it."""
    done: set[int] = set()
    while threads := _threads(pid) - done:
        for tid in threads:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, tid, value)
        done |= threads


def _threads(pid: int) -> set[int]:
    """The process's threads' ids (Linux's /proc), else its own id."""
    try:
        return {int(tid) for tid in os.listdir(f"/proc/{pid}/task")}
    except OSError:
        return {pid}


@dataclass(frozen=True)
class Stopped:
    """How a process stopped: after how long, and whether it had to be killed."""

    proc: Proc
    seconds: float
    killed: bool
    was_running: bool = True  # False: it had stopped already (nothing was signalled)


def stop(proc: Proc, grace: float = 15.0) -> Stopped:
    """Ask ``proc`` to stop, kill its whole process group if still up after ``grace``."""
    began = time.monotonic()
    if proc.pid is None or (alive(proc.pid) and not proc.is_ours()):  # its pid another's now
        return Stopped(proc, 0.0, False, was_running=False)
    # Dead, its group maybe not (a worker killed, its flow run going on): signalled too.
    was_running = alive(proc.pid) or bool(group(proc.pid))
    with contextlib.suppress(ProcessLookupError):
        (os.killpg if proc.signal_group else os.kill)(proc.pid, proc.stop_signal)
    while alive(proc.pid) and time.monotonic() < began + grace:
        time.sleep(0.1)
    killed = alive(proc.pid)
    # Signalled as a group, the rest of it gets the rest of the grace too: a worker exits
    # in 0.6 s, while the flow run it started still writes its rows and its interrupted
    # state (killed at once, its run stayed Running for ever, its rows unflushed).
    while proc.signal_group and group(proc.pid) and time.monotonic() < began + grace:
        time.sleep(0.1)
    # What is left of its group: all of it after ``grace``, or the children of one that
    # died (a killed PostgreSQL's backends would keep its shared memory from a new one).
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    return Stopped(proc, time.monotonic() - began, killed, was_running)


def group(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` (Linux's /proc; elsewhere none known)."""
    found: list[int] = []
    for entry in Path("/proc").glob("[0-9]*"):
        fields = stat_fields(int(entry.name))  # state, ppid, pgrp, ...
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def children(pid: int) -> list[int]:
    """The process ids of ``pid``'s children (Linux; elsewhere none are known)."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


def command_line(pid: int) -> str:
    """``pid``'s command line, or "" when it cannot be read."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def port_taken(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something already listens on ``host:port`` (an IPv4 or IPv6 address)."""
    return answers(host, port, timeout=1)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def answers(host: str, port: int, timeout: float = 2.0) -> bool:
    """Whether a TCP server accepts connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_for(ready: Callable[[], bool], proc: Proc, timeout: float, what: str) -> None:
    """Wait until ``ready()``; a clear error if ``proc`` exits or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(proc.pid):
            raise ExperimentError(f"{what} exited while starting; see {proc.log}:\n"
                                  + _tail(proc.log))
        if ready():
            return
        time.sleep(0.2)
    raise ExperimentError(f"{what} was not ready within {timeout:.0f} s; see {proc.log}")


def _tail(log: str, chars: int = 1500) -> str:
    try:
        return Path(log).read_text(errors="replace")[-chars:]
    except OSError:
        return ""
