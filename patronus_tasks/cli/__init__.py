"""The ``patronus-tasks`` command line: run, list, show, compare, accept, export, report
and review experiments.

Exit codes: 0 success; 1 a quality gate failed (``--min-pass-rate``,
``--fail-on-regression``, ``--fail-on-worse``); 2 a usage error (bad arguments, unknown experiment, bad file).

Each command lives in a module of its own (`run`, `browse`, `server`) and is registered
here, in the order ``--help`` lists them.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from patronus_tasks.cli import browse, review, run, server
from patronus_tasks.cli.common import EXIT_GATE, EXIT_OK, EXIT_USAGE, app, usage
from patronus_tasks.exceptions import ConfigError


def _add(fn: Callable[..., Any], name: str | None = None) -> None:
    """A command, its docstring's first paragraph on one line in the list of commands
    (typer keeps the docstring's line breaks there: "...then their" broke mid-sentence)."""
    summary = " ".join(inspect.cleandoc(fn.__doc__ or "").split("\n\n")[0].split())
    app.command(name, short_help=summary)(_said(fn))


def _said(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with a `ConfigError` (a damaged results file, a bad option) said in one
    line, exit 2, never a traceback."""
    @functools.wraps(fn)
    def command(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ConfigError as exc:
            raise usage(str(exc)) from None
    return command


for _fn, _name in ((run.run, None), (browse.list_, "list"), (browse.show, None),
                   (browse.compare, None), (browse.accept, None), (browse.export, None),
                   (browse.report, None), (review.review, None)):
    _add(_fn, _name)
app.add_typer(server.server, name="server")

__all__ = ["EXIT_GATE", "EXIT_OK", "EXIT_USAGE", "app", "browse", "main", "review", "run", "server"]


def main() -> None:
    """Console entry point."""
    app()
