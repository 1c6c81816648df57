"""What the commands share: the application, its exit codes, how errors are said, the
``--results-dir`` option, loading an experiment by name."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from patronus_tasks.console import printable
from patronus_tasks.exceptions import ConfigError
from patronus_tasks.results.experiment import Experiment
from patronus_tasks.results.store import load_experiment, load_pair

EXIT_OK, EXIT_GATE, EXIT_USAGE = 0, 1, 2
app = typer.Typer(help="Run, list, show, compare, export and report patronus-tasks experiments.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
err = Console(stderr=True)
# A str, not a Path: a Path would fold the "//" of an object-store URL (s3://bucket/...).
ResultsDir = Annotated[str | None, typer.Option(
    "--results-dir", help="Results directory or object-store URL such as s3://bucket/prefix "
    "(default $PATRONUS_TASKS_RESULTS_DIR or ./results).")]

#: An experiment named on the command line (`load`).
ExperimentArg = Annotated[str, typer.Argument(
    help="An experiment's name (its latest run), its run folder's name, or a path.")]


def say(label: str, message: str) -> None:
    # Messages hold "[link 0]" and user text: never rich markup, nor a terminal's controls.
    err.print(printable(f"{label}: {message}"), style="red", markup=False, highlight=False)


def echo(text: str) -> None:
    """A line of output that may hold untrusted text (names, outputs, explanations)."""
    typer.echo(printable(text))


def usage(message: str) -> typer.Exit:
    say("error", message)
    return typer.Exit(EXIT_USAGE)


def load(name: str, results_dir: str | None) -> Experiment:
    try:
        return load_experiment(name, results_dir)
    except ConfigError as exc:
        raise usage(str(exc)) from None


def load_two(a: str, b: str, results_dir: str | None) -> tuple[Experiment, Experiment]:
    """Two runs to compare (`load_pair`: ``nightly nightly-2`` are its first and second)."""
    try:
        ea, eb = load_pair(a, b, results_dir)
    except ConfigError as exc:
        raise usage(str(exc)) from None
    if ea.location == eb.location:
        say("note", f"{a} and {b} are the same run ({ea.location}): to compare another, give "
            "its folder (`patronus-tasks list` shows them)")
    return ea, eb
