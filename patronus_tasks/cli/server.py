"""``patronus-tasks server``: a Prefect stack on this machine (up, down, status, env).
Prefect's stack is imported when a command runs, not when the command line starts."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated
from urllib.parse import urlsplit

import typer

from patronus_tasks.cli.common import usage

if TYPE_CHECKING:
    from patronus_tasks.prefect.server.stack import ProcStatus, Stack
    from patronus_tasks.prefect.server.stack.processes import Proc, Stopped

server = typer.Typer(help="A Prefect stack on this machine: server (or Prefect's scaled topology: "
                     "PostgreSQL, Redis, several API processes, services apart), work pool, "
                     "deployments, worker.", no_args_is_help=True)
Home = Annotated[Path, typer.Option("--home", help="Where the stack's databases, logs and "
                                    "process ids live.")]


@server.command("up")
def server_up(home: Home = Path(".prefect"), port: int = 4200,
              host: Annotated[str, typer.Option(
                  help="Where the API listens: 127.0.0.1 (this machine only), or an address "
                  "of this host (0.0.0.0: every one) for other machines, then behind a TLS "
                  "proxy. It asks for its auth string either way.")] = "127.0.0.1",
              postgres: Annotated[str | None, typer.Option(
                  help="Keep Prefect's state in PostgreSQL: `local` (a server started here, "
                  "its data in --home) or a URL (postgresql+asyncpg://user:pass@host:5432/db). "
                  "Default: SQLite in --home.")] = None,
              redis: Annotated[str | None, typer.Option(
                  help="Carry Prefect's events through Redis (prefect-redis), the background "
                  "services in processes of their own: `local` or a URL (redis://host:6379/0). "
                  "Needs --postgres.")] = None,
              api_processes: Annotated[int | None, typer.Option(
                  help="API server processes on --port (more than 1 needs --postgres and "
                  "--redis). Default 1; 2 with --production.")] = None,
              production: Annotated[bool, typer.Option(
                  "--production", help="Prefect's scaled topology on this machine: "
                  "--postgres local --redis local --api-processes 2 (each may be given "
                  "too).")] = False,
              deploy: Annotated[bool, typer.Option(help="Deploy prefect.yaml.")] = True,
              worker: Annotated[bool, typer.Option(help="Start a process worker.")] = True,
              nice: Annotated[int, typer.Option(
                  help="Run the server side this many steps below normal CPU priority, so "
                  "recording rows never slows the rows (0: same priority).")] = 10) -> None:
    """Start a Prefect server on 127.0.0.1 (or its scaled topology), create the pool,
    deploy, start a worker. Its API asks for an auth string (made at the first start, kept
    in --home; `server env` prints it), CSRF protection on. Where a stack is up already:
    says so, and starts its worker again if it stopped."""
    from patronus_tasks.exceptions import PatronusTasksError
    from patronus_tasks.prefect.server import stack as _stack

    if production:
        postgres, redis = postgres or _stack.LOCAL, redis or _stack.LOCAL
    topology = _stack.Topology(postgres, redis, api_processes or (2 if production else 1))
    try:
        again = _stack.up_again(home, Path.cwd())
        if again is not None:  # a stack is recorded there: up already, or its worker again
            _print_again(again, home)
            return
        stack = _stack.up(Path.cwd(), home, port, topology=topology, deploy=deploy,
                          worker=worker, nice=nice, host=host)
    except PatronusTasksError as exc:
        raise usage(str(exc)) from None
    _print_up(stack, host)


def _print_up(stack: Stack, host: str) -> None:
    import shlex

    from patronus_tasks.prefect.server import stack as _stack
    from patronus_tasks.prefect.server.stack import auth

    typer.echo(f"Prefect UI:  {stack.ui_url}   (its login asks for the auth string)\n"
               f"API:         {stack.api_url}   (asks for the auth string, kept in "
               f"{Path(stack.home) / auth.AUTH_FILE})")
    _print_status(_stack.status(Path(stack.home)) or [])
    if not auth.is_loopback(host):
        typer.echo(f"listening on {host}:{urlsplit(stack.api_url).port} in plain HTTP: put TLS in "
                   "front (a reverse proxy) before other machines use it; the README's "
                   "\"Across hosts\" says how")
    typer.echo(f"logs in {stack.home}\n"
               f"eval \"$(patronus-tasks server env --home {shlex.quote(stack.home)})\"   "
               "# PREFECT_API_URL and its auth string, to run flows against it")


def _print_again(started: list[Proc], home: Path) -> None:
    from patronus_tasks.prefect.server import stack as _stack

    for proc in started:
        typer.echo(f"the worker had stopped: started again (pid {proc.pid}, log {proc.log})")
    if not started:
        typer.echo(f"already up (recorded in {home.resolve()}; `server down` stops it):")
    _print_status(_stack.status(home) or [])


def _print_status(rows: list[ProcStatus]) -> None:
    for row in rows:
        pid = "-" if row.pid is None else str(row.pid)
        state = ("running" if row.running else "stopped") if row.pid is not None else \
            ("answers" if row.running else "does not answer")
        typer.echo(f"  {row.role:<12} {pid:>8}  {state:<15} {row.url}".rstrip())


@server.command("down")
def server_down(home: Home = Path(".prefect")) -> None:
    """Stop every process that `server up` started, each by its process id."""
    from patronus_tasks.prefect.server import stack as _stack

    stack = _stack.down(home, on_stopped=_print_stopped)
    if stack is None:
        typer.echo(f"nothing to stop: no stack recorded in {home.resolve()} (--home: where "
                   "`server up` ran)")


def _print_stopped(stopped: Stopped) -> None:
    how = ("was not running (nothing signalled)" if not stopped.was_running
           else f"killed after {stopped.seconds:.0f} s (it did not stop when asked)"
           if stopped.killed else f"stopped in {stopped.seconds:.1f} s")
    typer.echo(f"  {stopped.proc.role:<12} {stopped.proc.pid:>8}  {how}")


@server.command("status")
def server_status(home: Home = Path(".prefect"), as_json: Annotated[bool, typer.Option(
        "--json", help="One JSON list: role, pid, running, url.")] = False) -> None:
    """Every process of the stack: role, pid, running or not, URL. Exit 1 when one is
    not running (or no stack is recorded)."""
    import dataclasses
    import json

    from patronus_tasks.prefect.server import stack as _stack

    found = _stack.status(home)
    if found is None:
        typer.echo(f"no stack recorded in {home.resolve()} (--home: where `server up` ran)")
        raise typer.Exit(1)
    if as_json:
        typer.echo(json.dumps([dataclasses.asdict(row) for row in found], indent=2))
    else:
        _print_status(found)
    if not all(row.running for row in found):
        raise typer.Exit(1)


@server.command("env")
def server_env(home: Home = Path(".prefect")) -> None:
    """Print the shell lines a Prefect client needs: it prints a secret.

    The lines export PREFECT_API_URL and PREFECT_API_AUTH_STRING, the API's auth string:
    whoever has it runs commands through the stack's worker. Run it as
    `eval "$(patronus-tasks server env)"`, and keep its output out of logs and tickets."""
    import shlex

    from patronus_tasks.exceptions import PatronusTasksError
    from patronus_tasks.prefect.server.stack import Stack, auth

    stack = Stack.load(home.resolve())
    if stack is None:
        typer.echo(f"no stack recorded in {home.resolve()} (--home: where `server up` ran)",
                   err=True)
        raise typer.Exit(1)
    try:
        secret = auth.read(home.resolve())
    except PatronusTasksError as exc:
        raise usage(str(exc)) from None
    typer.echo(f"export PREFECT_API_URL={shlex.quote(stack.api_url)}")
    if secret is None:
        typer.echo(f"# the stack in {stack.home} was started before `server up` gave it an "
                   "auth string: `server down` and `server up` start it with one", err=True)
        return
    typer.echo(f"export PREFECT_API_AUTH_STRING={shlex.quote(secret)}")
