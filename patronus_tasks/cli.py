"""The ``patronus-tasks`` command line: run, list, show, compare, export and report
experiments.

Exit codes: 0 success; 1 a quality gate failed (``--min-pass-rate``,
``--fail-on-regression``, ``--fail-on-worse``); 2 a usage error (bad arguments, unknown experiment, bad file).
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from patronus_tasks.exceptions import ConfigError, QualityGateError
from patronus_tasks.record.records import STATUS_ERROR
from patronus_tasks.results.compare import Comparison, compare_experiments
from patronus_tasks.results.experiment import Experiment
from patronus_tasks.results.gates import failed_gates, failed_metric_gates, parse_thresholds
from patronus_tasks.results.store import list_experiments, load_experiment
from patronus_tasks.results.summary import Summary
from patronus_tasks.results.verdict import ALPHA, Rule, rule_of, said
from patronus_tasks.run.observers import Observers, RunFacts, observing
from patronus_tasks.run.options import giving, stricter

if TYPE_CHECKING:  # the server commands import Prefect's stack when run
    from patronus_tasks.prefect.server.stack import ProcStatus
    from patronus_tasks.prefect.server.stack.processes import Stopped

EXIT_OK, EXIT_GATE, EXIT_USAGE = 0, 1, 2
app = typer.Typer(help="Run, list, show, compare, export and report patronus-tasks experiments.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
err = Console(stderr=True)
# A str, not a Path: a Path would fold the "//" of an object-store URL (s3://bucket/...).
ResultsDir = Annotated[str | None, typer.Option(
    "--results-dir", help="Results directory or object-store URL such as s3://bucket/prefix "
    "(default $PATRONUS_TASKS_RESULTS_DIR or ./results).")]


def _say(label: str, message: str) -> None:
    # Messages hold "[link 0]" and user text: never rich markup.
    err.print(f"{label}: {message}", style="red", markup=False, highlight=False)


def _usage(message: str) -> typer.Exit:
    _say("error", message)
    return typer.Exit(EXIT_USAGE)


def _load(name: str, results_dir: str | None) -> Experiment:
    try:
        return load_experiment(name, results_dir)
    except ConfigError as exc:
        raise _usage(str(exc)) from None


def _import_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise _usage(f"{path}: no such file")
    from patronus_tasks.prefect.server import hook as server_hook

    server_hook.install()  # a flow in the file may start Prefect's built-in server: ours
    sys.path.insert(0, str(path.resolve().parent))
    spec = importlib.util.spec_from_file_location(f"_patronus_run_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _entry(target: str) -> Callable[..., Any]:
    """``PATH[:FUNCTION]``: the named function, or the file's only Prefect flow."""
    from prefect import Flow

    path, _, name = target.partition(":")
    module = _import_file(Path(path))
    if name:
        fn = getattr(module, name, None)
        if not callable(fn):
            raise _usage(f"{path} has no function {name!r}")
        return fn
    flows = [v for v in vars(module).values() if isinstance(v, Flow)]
    if len(flows) != 1:
        found = ", ".join(f.fn.__name__ for f in flows) or "none"
        raise _usage(f"{path}: say which function to run as {path}:FUNCTION (flows found: {found})")
    return flows[0]


#: Options every experiment the function starts takes (`options.giving`) when the
#: function itself has no parameter of that name: a flow need not pass them on.
_GIVEN_TO_EXPERIMENTS = ("resume", "retry_errors")


def _call_kwargs(fn: Callable[..., Any], given: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The function's keyword arguments, and the options given to its experiments."""
    params = inspect.signature(getattr(fn, "fn", fn)).parameters
    kwargs, ambient = {}, {}
    for option, value in given.items():
        names = ("dataset", "data") if option == "data" else (option,)
        accepted = [n for n in names if n in params]
        if accepted:
            kwargs[accepted[0]] = value
        elif option in _GIVEN_TO_EXPERIMENTS:
            ambient[option] = value
        else:
            raise _usage(f"{getattr(fn, '__name__', fn)} takes no {'/'.join(names)} parameter "
                         f"for --{option.replace('_', '-')}")
    return kwargs, ambient


@contextmanager
def _progress_bar() -> Iterator[list[Experiment]]:
    """A progress bar per experiment while the block runs; yields the experiments run."""
    finished: list[Experiment] = []
    bars: dict[str, Any] = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err, transient=False) as progress:
        def on_row(spec: RunFacts, done: int) -> None:
            if spec.experiment_id not in bars:
                bars[spec.experiment_id] = progress.add_task(spec.experiment_name,
                                                             total=len(spec.dataset))
            progress.update(bars[spec.experiment_id], completed=done)

        with observing(Observers(on_row=on_row, on_finished=finished.append)):
            yield finished


@app.command()
def run(target: Annotated[str, typer.Argument(help="PATH[:FUNCTION] of a Python file.")],
        data: Annotated[str | None, typer.Option(help="Dataset path passed to the function.")] = None,
        experiment_name: Annotated[str | None, typer.Option()] = None,
        max_concurrency: Annotated[int | None, typer.Option(min=1)] = None,
        results_dir: ResultsDir = None,
        min_pass_rate: Annotated[list[str] | None, typer.Option(
            help="EVALUATOR=RATE; exit 1 when the pass rate is lower. Repeatable.")] = None,
        min_metric: Annotated[list[str] | None, typer.Option(
            help="METRIC=VALUE; exit 1 when the dataset-level metric is lower (or "
                 "missing). Repeatable.")] = None,
        resume: Annotated[bool, typer.Option(
            "--resume", help="Go on with the latest run of this experiment.")] = False,
        retry_errors: Annotated[bool, typer.Option(
            "--retry-errors", help="Re-run only the rows that failed.")] = False,
        cache: Annotated[bool, typer.Option(
            "--cache", help="Answer calls made before with the same inputs from the cache "
            "(for a function taking `cache`).")] = False,
        repeats: Annotated[int | None, typer.Option(
            min=1, help="Run every row this many times (for a function taking `repeats`).")]
        = None) -> None:
    """Run the experiment(s) a Python file defines, with a progress bar."""
    try:
        thresholds = parse_thresholds(min_pass_rate or [])
        minimums = parse_thresholds(min_metric or [], "--min-metric", rates=False)
    except ConfigError as exc:
        raise _usage(str(exc)) from None
    fn = _entry(target)
    given = {"data": data, "experiment_name": experiment_name,
             "max_concurrency": max_concurrency,
             "results_dir": str(results_dir) if results_dir else None,
             "resume": resume or None, "retry_errors": retry_errors or None,
             "cache": cache or None, "repeats": repeats}
    kwargs, ambient = _call_kwargs(fn, {k: v for k, v in given.items() if v is not None})
    try:
        # The gates go into every experiment: one that fails them fails its flow run.
        with giving(min_pass_rates=thresholds, min_metrics=minimums, **ambient), \
                _progress_bar() as finished:
            fn(**kwargs)
    except ConfigError as exc:
        raise _usage(str(exc)) from None
    except QualityGateError as exc:
        if not finished:
            raise
        raised: QualityGateError | None = exc
    else:
        raised = None
    if not finished:
        raise _usage(f"{target} ran no experiment")
    failures = _gate_failures(finished, thresholds, minimums, raised)
    for message in failures:
        _say("gate failed", message)
    raise typer.Exit(EXIT_GATE if failures else EXIT_OK)


def _gate_failures(finished: list[Experiment], thresholds: dict[str, float],
                   minimums: dict[str, float], raised: QualityGateError | None) -> list[str]:
    """What the gate error that stopped the function said (its experiment's gates, the
    command's among them), then every finished experiment's misses of the command's gates
    (a function may catch the error and go on), then gates no experiment that ran had."""
    messages = []
    if raised is not None:  # unpickled through a flow: no experiment; the last one raised it
        name = getattr(raised.experiment, "name", None) or finished[-1].name
        messages += [f"{name}: {failure}" for failure in raised.failures]
    summaries = [e.summary() for e in finished]  # each read once
    for e, summary in zip(finished, summaries, strict=True):
        rates = stricter({}, thresholds, {s.evaluator for s in summary.evaluators})
        mins = stricter({}, minimums, {m.name for m in summary.metrics})
        found = failed_gates(summary, rates) + failed_metric_gates(summary, mins)
        messages += [m for m in (f"{e.name}: {x}" for x in found) if m not in messages]
    return messages + _unmatched(summaries, thresholds, minimums, stopped=raised is not None)


def _unmatched(summaries: list[Summary], thresholds: dict[str, float],
               minimums: dict[str, float], stopped: bool) -> list[str]:
    """A gate naming an evaluator or metric that no experiment that ran had fails too."""
    evaluators = sorted({s.evaluator for summary in summaries for s in summary.evaluators})
    metrics = sorted({m.name for summary in summaries for m in summary.metrics})
    cut = " (the function stopped at the first failed gate)" if stopped else ""
    return ([f"{name}: no experiment that ran has this evaluator (evaluators: "
             f"{', '.join(evaluators) or 'none'}){cut}" for name in thresholds if name not in evaluators]
            + [f"{name}: no experiment that ran computed this metric (metrics: "
               f"{', '.join(metrics) or 'none'}){cut}" for name in minimums if name not in metrics])


def _pass_rates(e: Experiment) -> str:
    try:
        stats = e.summary().evaluators
    except FileNotFoundError:
        return "(no results)"
    return ", ".join(f"{s.evaluator} {'-' if s.pass_rate is None else f'{s.pass_rate:.0%}'}"
                     for s in stats)


@app.command("list")
def list_(results_dir: ResultsDir = None) -> None:
    """Past experiments: name, start time, status, rows, errors and pass rates."""
    runs = list_experiments(results_dir)
    if not runs:
        typer.echo("no experiments")
        return
    for e in runs:
        m = e.manifest
        typer.echo(f"{e.project}/{e.location.name}  {m.started_at[:19]}  {m.status}  "
                   f"rows={m.rows}  errors={m.task_errors + m.evaluator_errors}  "
                   f"{_pass_rates(e)}")


def _failure_lines(e: Experiment) -> list[str]:
    df = e.to_dataframe()
    bad = df[(df["status"] == STATUS_ERROR) | (df["pass"] == False)]  # noqa: E712
    lines = []
    for r in bad.itertuples():
        step = r.evaluator_name if isinstance(r.evaluator_name, str) else r.task_name
        if r.status == STATUS_ERROR:
            lines.append(f"  sid={r.sid} link={r.link_index} {step}: {r.error_type}: {r.error_message}")
        else:
            lines.append(f"  sid={r.sid} link={r.link_index} {step}: failed"
                         + (f" ({r.explanation})" if isinstance(r.explanation, str) else ""))
    return lines


@app.command()
def show(experiment: str, failures: Annotated[bool, typer.Option(
             "--failures", help="List rows that errored or failed an evaluator.")] = False,
         results_dir: ResultsDir = None) -> None:
    """An experiment's summary."""
    e = _load(experiment, results_dir)
    typer.echo(e.format_summary())
    if failures:
        lines = _failure_lines(e)
        typer.echo(f"\nFailures ({len(lines)}):" if lines else "\nNo failures.")
        for line in lines:
            typer.echo(line)


@app.command()
def compare(a: str, b: str, fail_on_regression: Annotated[bool, typer.Option(
                "--fail-on-regression", help="Exit 1 when an evaluator regressed "
                "significantly (p < 0.05), as fail_on_regression=True.")] = False,
            fail_on_worse: Annotated[bool, typer.Option(
                "--fail-on-worse", help="Exit 1 when an evaluator got worse by --drop's rule, "
                "as fail_on_regression='worse'.")] = False,
            drop: Annotated[float, typer.Option(
                "--drop", help="The fall in pass rate (or mean score) called worse (0.05: "
                "5 points); more rows worse than better is worse too.")] = 0.05,
            pair: Annotated[str | None, typer.Option(
                "--pair", help="With repeats: 'repeat' pairs runs by sample id and repeat, "
                "'mean' compares rows' means (default: 'repeat' when both ran the same "
                "repeats, else 'mean').")] = None,
            results_dir: ResultsDir = None) -> None:
    """Compare experiment B with baseline A, pairing rows by sample id; then their
    dataset-level metrics, tokens and cost."""
    try:
        result = compare_experiments(_load(a, results_dir), _load(b, results_dir), pair=pair)
    except ConfigError as exc:
        raise _usage(str(exc)) from None
    try:
        rule = rule_of(drop, False)
    except ConfigError as exc:
        raise _usage(str(exc)) from None
    # What got worse or better first, counts before p-values; then the figures.
    typer.echo("\n".join(said(e, rule, many_links=True) for e in result.evaluators) + "\n")
    typer.echo(result.format())
    failing = _compare_gates(result, rule, fail_on_regression, fail_on_worse)
    for message in failing:
        _say("gate failed", message)
    if failing:
        raise typer.Exit(EXIT_GATE)


def _compare_gates(result: Comparison, rule: Rule, significant: bool, worse: bool) -> list[str]:
    """The gates of an experiment's ``fail_on_regression`` (True, ``"worse"``): one row
    that flipped is no gate. Both may be asked; each is checked and said on its own."""
    failing = []
    for e in result.evaluators:
        where = f"{e.evaluator} [link {e.link_index}]"
        if significant and e.regressed_significantly(ALPHA):
            failing.append(f"{where} regressed significantly (p < {ALPHA})")
        if worse and rule.movement(e) == "worse":
            failing.append(f"{where} got worse")
    return failing


@app.command()
def export(experiment: str,
           format: Annotated[str, typer.Option("--format", help="csv or jsonl")] = "csv",
           output: Annotated[Path | None, typer.Option("--output", "-o")] = None,
           results_dir: ResultsDir = None) -> None:
    """Write an experiment's records as CSV or JSON Lines (to stdout without --output)."""
    if format not in ("csv", "jsonl"):
        raise _usage(f"--format must be csv or jsonl, not {format!r}")
    e = _load(experiment, results_dir)
    text = e.to_csv() if format == "csv" else e.to_json()
    if output is None:
        sys.stdout.write(text or "")
    else:
        output.write_text(text or "", encoding="utf-8")


@app.command()
def report(experiment: str,
           output: Annotated[str | None, typer.Option(
               "--output", "-o", help="Where to write it (default: report.html beside the "
               "results; with --against, report-vs-<B>.html there).")] = None,
           against: Annotated[str | None, typer.Option(
               "--against", help="Another run (the baseline), compared row by row.")] = None,
           results_dir: ResultsDir = None) -> None:
    """Write an experiment's HTML report: one self-contained page (charts, figures, every
    record to sort, filter and open); --against B adds the comparison with B."""
    from patronus_tasks.report import write_report

    e = _load(experiment, results_dir)
    baseline = _load(against, results_dir) if against else None
    try:
        where = write_report(e, baseline, output)  # default: report-vs-<B>.html with B
    except OSError as exc:
        raise _usage(f"could not write the report: {exc}") from None
    typer.echo(str(where))


def main() -> None:
    """Console entry point."""
    app()


server = typer.Typer(help="A Prefect stack on this machine: server (or Prefect's scaled topology: "
                     "PostgreSQL, Redis, several API processes, services apart), work pool, "
                     "deployments, worker.", no_args_is_help=True)
app.add_typer(server, name="server")
Home = Annotated[Path, typer.Option("--home", help="Where the stack's databases, logs and "
                                    "process ids live.")]


@server.command("up")
def server_up(home: Home = Path(".prefect"), port: int = 4200,
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
    deploy, start a worker."""
    from patronus_tasks.exceptions import PatronusTasksError
    from patronus_tasks.prefect.server import stack as _stack

    if production:
        postgres, redis = postgres or _stack.LOCAL, redis or _stack.LOCAL
    topology = _stack.Topology(postgres, redis, api_processes or (2 if production else 1))
    try:
        stack = _stack.up(Path.cwd(), home, port, topology=topology, deploy=deploy,
                          worker=worker, nice=nice)
    except PatronusTasksError as exc:
        raise _usage(str(exc)) from None
    typer.echo(f"Prefect UI:  {stack.ui_url}\nAPI:         {stack.api_url}")
    _print_status(_stack.status(home) or [])
    typer.echo(f"logs in {stack.home}\n"
               f"export PREFECT_API_URL={stack.api_url}   # to run flows against it")


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
        typer.echo("nothing to stop")


def _print_stopped(stopped: Stopped) -> None:
    how = (f"killed after {stopped.seconds:.0f} s (it did not stop when asked)" if stopped.killed
           else f"stopped in {stopped.seconds:.1f} s")
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
        typer.echo("no stack recorded")
        raise typer.Exit(1)
    if as_json:
        typer.echo(json.dumps([dataclasses.asdict(row) for row in found], indent=2))
    else:
        _print_status(found)
    if not all(row.running for row in found):
        raise typer.Exit(1)
