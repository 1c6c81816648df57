"""Processes on this host, read from the kernel (Linux's /proc; elsewhere what `os.kill`
tells): whether one runs, and the fields of its ``stat``. Used by the run's folder claims,
`list`'s "its process is gone", and the stack's processes."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def stat_fields(pid: int) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the name (state, ppid, pgrp, ...; the name
    may hold spaces and parentheses), or [] when they cannot be read."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return []


def alive(pid: int | None) -> bool:
    """Whether process ``pid`` runs. A zombie counts as gone (killed, its parent not yet
    done with it: a shell's background job; not every init reaps at once), though
    signals still reach it; a child of this process is reaped here."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's: there
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG) != (0, 0):
            return False  # a child of this process, reaped now
    return stat_fields(pid)[:1] != ["Z"]
