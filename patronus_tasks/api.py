"""The public functions: set an experiment up, run it where its backend says, return it.

The top of the library: it picks the backend (`prefect/`, or local), bridges sync and async
callers, and turns SIGTERM into an interrupt.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import signal
import sys
import threading
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar

from typing_extensions import Unpack

from patronus_tasks.define.dataset import DataInput, aload_data
from patronus_tasks.exceptions import QualityGateError
from patronus_tasks.execute.run import run_kept
from patronus_tasks.execute.setup import make_spec, release_claim
from patronus_tasks.results.experiment import Experiment
from patronus_tasks.run import background as _background
from patronus_tasks.run import observers
from patronus_tasks.run.loop import InProcess
from patronus_tasks.run.options import RunOptions, split_run
from patronus_tasks.run.runner import LocalStepRunner
from patronus_tasks.run.spec import ExperimentSpec

if TYPE_CHECKING:  # imported only when a report is wanted, as in `_report_afterwards`
    from patronus_tasks.run.background import Afterwards

T = TypeVar("T")

async def _run(spec: ExperimentSpec) -> Experiment:
    if spec.backend != "local":
        from patronus_tasks.prefect.runs.orchestrate import run_on_prefect

        return await run_on_prefect(spec)
    return await run_kept(spec, LocalKeeper(spec))


class LocalKeeper:
    """``"local"``: the rows run here with no Prefect; nothing keeps the experiment but
    its files, and the gates checked on them are the verdict."""

    flow_run_id = tally = manifest_file = None

    def __init__(self, spec: ExperimentSpec) -> None:
        self.spec, self.backend = spec, InProcess(LocalStepRunner())

    def interrupted(self, exc: BaseException) -> None:
        pass  # the rows done are written: nothing else to end

    def experiment(self) -> Experiment:
        """The experiment, judged first against its baseline when one is pinned
        (``baseline=``) or accepted beside its results (its manifest keeps the verdict, and
        the HTML report's header states it)."""
        from patronus_tasks.record.manifest_file import note_verdict
        from patronus_tasks.results.baselines import judged_here
        from patronus_tasks.results.verdict import Rule

        note = judged_here(Experiment(self.spec.out_dir), self.spec.rule or Rule(), self.spec.baseline)
        if note is not None:
            note_verdict(self.spec.out_dir, note)
        return Experiment(self.spec.out_dir, _report_afterwards(self.spec))

    async def verdict(self, failures: list[str], calls: int) -> list[str]:
        return failures


def _report_afterwards(spec: ExperimentSpec) -> Afterwards | None:
    """The HTML report, written after the results in a thread (~1-3 s: matplotlib), which
    `Experiment.wait_recorded` and the process's exit wait for; None when not wanted."""
    if not spec.html_report:
        return None
    from patronus_tasks.report.build import report_after_run
    from patronus_tasks.run.background import Afterwards

    experiment = Experiment(spec.out_dir)
    return Afterwards(f"the HTML report of {spec.project_name}/{spec.experiment_name}",
                      lambda: report_after_run(experiment))


async def arun_experiment(project_name: str, *, data: DataInput | None = None,
                          **options: Unpack[RunOptions]) -> Experiment:
    """Run an experiment (async form of `run_experiment`)."""
    experiment_options, wanted = split_run(options)
    if "dataset" in experiment_options:  # remote datasets load here, in this loop
        experiment_options["dataset"] = await aload_data(experiment_options["dataset"])
    spec = make_spec(project_name, data=await aload_data(data), **experiment_options)
    _background.stopped_by.clear()  # an earlier run's signal is not this one's
    steps = spec.steps()
    try:
        for step in steps:  # look-ups and connections, before any row is run
            await step.setup()
        experiment = await _run(spec)
    except QualityGateError as exc:
        _finished(exc.experiment, wanted)  # type: ignore[arg-type]
        raise
    except BaseException:
        release_claim(spec.out_dir)  # a step's setup failed before any row: nothing written
        raise
    finally:
        for step in steps:
            await step.aclose()
    _finished(experiment, wanted)
    return experiment


def _finished(experiment: Experiment, wanted: dict[str, bool]) -> None:
    for observer in observers.current():
        if observer.on_finished is not None:
            observer.on_finished(experiment)
    if wanted["print_summary"]:
        _background.console_print(experiment.format_summary(display_hist=wanted["display_hist"]),
                                  sys.stdout)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    _background.stopped_by.append(signal.Signals(signum).name)
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM interrupts like Ctrl-C, so completed rows are flushed and the run marked."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_sync(coro: Coroutine[Any, Any, T]) -> T:
    try:
        asyncio.get_running_loop()
        running = True
    except RuntimeError:
        running = False  # not inside the except block: user tracebacks must not chain to it
    if not running:
        with _sigterm_as_interrupt():
            return asyncio.run(coro)
    # Called from running async code (a notebook, an async flow): use a loop of our own.
    ctx = contextvars.copy_context()
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(ctx.run, asyncio.run, coro).result()


def run_experiment(project_name: str, *, data: DataInput | None = None,
                   **options: Unpack[RunOptions]) -> Experiment:
    """Run an experiment: every row through the task and evaluators (or the ``chain``).

    The experiment is one Prefect flow run and every task and evaluator call its own task
    run, on ``PREFECT_API_URL`` or Prefect's built-in local server. It returns as soon as
    the rows are done and the results written; the task-run records Prefect has not taken
    yet follow in the background (`Experiment.wait_recorded`; the process waits for them
    before it exits, and a call made inside a flow run waits before it returns).

    ``backend``: where rows run: ``"prefect"`` (this process, recorded on Prefect),
    ``"local"`` (this process, no Prefect), ``"dask"`` (batches on a Dask cluster: a local
    one of two processes, or the scheduler at ``dask_address``; needs ``prefect-dask`` and
    a server in ``PREFECT_API_URL``) or any Prefect ``TaskRunner``.

    ``resume=True`` goes on with the latest run of ``experiment_name`` (or the run whose
    ``experiment_id`` is given): rows completed there are reused, missing and failed ones
    run (steps that completed inside failed rows are replayed, not called again);
    ``retry_errors=True`` re-runs only the rows that failed. ``fail_on_error`` (a row
    count, or a fraction as a float) and ``min_pass_rates`` ({evaluator: rate}) are
    gates: when one fails, the results are still written, the flow run ends Failed and
    `QualityGateError` is raised.
    Results stream to ``<results_dir>/<project>/<experiment>/results.parquet``.

    The options (`RunOptions`: ``task``, ``evaluators``, ``chain``, ``tags``,
    ``experiment_name``, ``max_concurrency`` (default 10), ``results_dir``, ``backend``,
    ``resume``, ``retry_errors``, ``experiment_id``, ``fail_on_error``,
    ``min_pass_rates``, ``dask_address``, ``dataset`` (the Patronus SDK's name of
    ``data``), ``reporters``, ``html_report`` (``report.html`` beside the results,
    default True), ``repeats`` (runs of every row: pass@k, pass^k), ``cache`` (the cache
    of step calls: None, True, False, a folder or URL, a `Cache`), ``prices`` ({model:
    (input, output) USD per million tokens}), ``metrics`` (dataset-level evaluators),
    ``min_metrics`` (their gates), ``print_summary`` (default True), ``display_hist`` (score
    histograms in that summary, default True)) are declared once in
    `patronus_tasks.run.options`; an unknown one is a `ConfigError`.
    """
    split_run(options)  # a mistake is a ConfigError here, before any loop starts
    return _run_sync(arun_experiment(project_name, data=data, **options))
