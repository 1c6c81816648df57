"""Log records emitted inside a task or evaluator, attached to that call's task run.

While a call runs, `CURRENT` holds where its logs go (its recorder and task run id); the
context is copied into the thread a sync step runs in, so records from any thread of the
call are found. `capture` installs, while experiments run, a handler on the root logger
(``logging``, and Prefect's run loggers, which propagate to it) that hands such records
to the recorder, which sends them in batches and drops what is past its bound (counted):
a flood of logs costs the rows a bounded buffer, never a wait. Records of Prefect's own
run loggers (``get_run_logger()``) are marked so Prefect does not send them a second time,
attached to the flow run only.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any, Protocol

from patronus_tasks.prefect import internal


class LogSink(Protocol):
    def log(self, record: dict[str, Any]) -> None: ...


CURRENT: ContextVar[tuple[LogSink, str] | None] = ContextVar("patronus_tasks_call", default=None)
_PREFECT_RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")
_formatter = logging.Formatter()


class _Handler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        current = CURRENT.get()
        if current is None:
            return
        sink, task_run_id = current
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + _formatter.formatException(record.exc_info)
        sink.log({"name": record.name, "level": record.levelno, "message": message,
                  "timestamp": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(),
                  "task_run_id": task_run_id})


class _OursOnly(logging.Filter):
    """On Prefect's run loggers: a record of a call is sent by us, not by Prefect."""

    def filter(self, record: logging.LogRecord) -> bool:
        if CURRENT.get() is not None:
            internal.keep_from_api(record)
        return True


class _Capture:
    def __init__(self) -> None:
        self.users = 0
        self.lock = threading.Lock()
        self.handler, self.filter = _Handler(), _OursOnly()

    def enter(self) -> None:
        with self.lock:
            self.users += 1
            if self.users == 1:
                logging.getLogger().addHandler(self.handler)
                for name in _PREFECT_RUN_LOGGERS:
                    logging.getLogger(name).addFilter(self.filter)

    def exit(self) -> None:
        with self.lock:
            self.users -= 1
            if self.users == 0:
                logging.getLogger().removeHandler(self.handler)
                for name in _PREFECT_RUN_LOGGERS:
                    logging.getLogger(name).removeFilter(self.filter)


_CAPTURE = _Capture()


@contextlib.contextmanager
def capture() -> Iterator[None]:
    """Attach calls' log records to their task runs while the block runs."""
    _CAPTURE.enter()
    try:
        yield
    finally:
        _CAPTURE.exit()
