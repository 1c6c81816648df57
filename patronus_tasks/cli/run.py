"""``patronus-tasks run``: the experiment(s) a Python file defines, with a progress bar, the
command's gates given to every experiment and checked on every finished one."""

from __future__ import annotations

import importlib.util
import inspect
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from patronus_tasks.cli.common import EXIT_GATE, EXIT_OK, ResultsDir, err, say, usage
from patronus_tasks.console import printable
from patronus_tasks.exceptions import ConfigError, QualityGateError
from patronus_tasks.results.experiment import Experiment
from patronus_tasks.results.gates import failed_gates, failed_metric_gates, parse_thresholds
from patronus_tasks.results.summary import Summary
from patronus_tasks.run.observers import Observers, RunFacts, observing
from patronus_tasks.run.options import giving, stricter


def _import_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise usage(f"{path}: no such file")
    if path.suffix != ".py":
        raise usage(f"{path}: not a Python file (give the .py file that defines the flow)")
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
    from prefect import Flow  # here: the other commands start without Prefect

    path, _, name = target.partition(":")
    module = _import_file(Path(path))
    if name:
        fn = getattr(module, name, None)
        if not callable(fn):
            raise usage(f"{path} has no function {name!r}")
        return fn
    flows = [v for v in vars(module).values() if isinstance(v, Flow)]
    if len(flows) != 1:
        found = ", ".join(f.fn.__name__ for f in flows) or "none"
        raise usage(f"{path}: say which function to run as {path}:FUNCTION (flows found: {found})")
    return flows[0]


def _is_flow(fn: Callable[..., Any]) -> bool:
    from prefect import Flow

    return isinstance(fn, Flow)


def _check_api() -> None:
    """A Prefect API named (PREFECT_API_URL, a profile) that does not answer, said before
    anything runs: Prefect's engine failed first, with a long traceback and exit 1 (a gate's
    code). Only a connection that fails counts: an HTTP answer, whatever its status, is a
    server there (Prefect Cloud's workspaces answer with their own)."""
    import httpx
    from prefect.settings import get_current_settings

    api = get_current_settings().api
    if not api.url:
        return  # Prefect's built-in server, started for this process
    url = api.url
    # As Prefect's client verifies (a self-hosted server's own CA, or none asked for).
    verify: bool | str = False if api.tls_insecure_skip_verify else (api.ssl_cert_file or True)
    for attempt in range(3):
        try:
            httpx.get(f"{url.rstrip('/')}/health", timeout=5.0, verify=verify)
            return _check_auth(url, verify)
        except httpx.TransportError as exc:
            problem = f"{type(exc).__name__}: {exc}"
            time.sleep(0.5 * (attempt + 1))
    raise usage(f"the Prefect API at {url} does not answer ({problem}). Start a server there "
                "(patronus-tasks server up), point PREFECT_API_URL at one that runs, or unset "
                "PREFECT_API_URL to use Prefect's built-in server.")


def _check_auth(url: str, verify: bool | str) -> None:
    """A server that asks who you are (401), said before anything runs, with the fix:
    Prefect's engine failed first, with a long traceback. Asked as Prefect's client asks
    (its auth string, else its API key); ``/health`` answers anyone."""
    import base64

    import httpx
    from prefect.settings import get_current_settings

    from patronus_tasks.prefect.clients import refused_fix

    api, headers = get_current_settings().api, {}
    if api.auth_string is not None:
        token = base64.b64encode(api.auth_string.get_secret_value().encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    elif api.key is not None:
        headers["Authorization"] = f"Bearer {api.key.get_secret_value()}"
    try:
        code = httpx.get(f"{url.rstrip('/')}/admin/version", headers=headers, timeout=5.0,
                         verify=verify).status_code
    except httpx.HTTPError:
        return  # not answering now: Prefect's engine says so
    if code == 401:
        raise usage(refused_fix(url))


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
            raise usage(f"{getattr(fn, '__name__', fn)} takes no {'/'.join(names)} parameter "
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
                bars[spec.experiment_id] = progress.add_task(escape(printable(spec.experiment_name)),
                                                             total=len(spec.dataset))
            progress.update(bars[spec.experiment_id], completed=done)

        with observing(Observers(on_row=on_row, on_finished=finished.append)):
            yield finished


def run(target: Annotated[str, typer.Argument(help="PATH[:FUNCTION] of a Python file.")],
        data: Annotated[str | None, typer.Option(help="Dataset path passed to the function.")] = None,
        experiment_name: Annotated[str | None, typer.Option(
            help="Experiment name passed to the function (for a function taking it).")] = None,
        max_concurrency: Annotated[int | None, typer.Option(
            min=1, help="Calls in flight at once, passed to the function.")] = None,
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
        raise usage(str(exc)) from None
    fn = _entry(target)
    if _is_flow(fn):  # a plain function may run its experiments locally
        _check_api()
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
        raise usage(str(exc)) from None
    except QualityGateError as exc:
        if not finished:
            raise
        raised: QualityGateError | None = exc
    else:
        raised = None
    if not finished:
        raise usage(f"{target} ran no experiment")
    failures = _gate_failures(finished, thresholds, minimums, raised)
    for message in failures:
        say("gate failed", message)
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
