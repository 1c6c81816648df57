"""Rows on Dask workers that cannot run them, or die under them: a clear error within
seconds naming what and the fix (never a hang), and after a worker is killed mid-run
every row in the results exactly once, the rows it wrote neither run nor written again."""

from __future__ import annotations

import importlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from patronus_tasks import ExperimentError, Row, evaluator, run_experiment, task

from .waits import until


class DiesWhenLoaded:
    """Unpickled, it ends the process that loads it (a step whose code crashes a worker)."""

    def __reduce__(self) -> Any:
        return (os._exit, (3,))


@task
def echo(row: Row) -> str:
    return str(row.sid)


@evaluator
def crashing_loader(evaluated_model_output: str, row: Row) -> bool:
    return row.get("_never") is DiesWhenLoaded()  # the evaluator's code holds the bomb


@pytest.fixture(scope="module")
def cluster() -> Any:
    from distributed import LocalCluster

    # Two worker processes (each restarted by its nanny when it dies), for the whole module.
    with LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=":0") as found:
        yield found


def _run(cluster: Any, results_dir: Path, name: str, **options: Any) -> Any:
    data = [{"sid": f"s{i:02d}"} for i in range(6)]
    options.setdefault("task", echo)
    return run_experiment("workers", data=data, backend="dask", dask_address=cluster.scheduler_address,
                          experiment_name=name, results_dir=results_dir, print_summary=False,
                          html_report=False, **options)


def test_a_step_the_workers_cannot_import_is_named_at_once(prefect_server: str, cluster: Any,
                                                           tmp_path: Path, results_dir: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # A helper module only this process has: imported here, then gone from the disk. The
    # step itself travels whole (decorated steps are sent by value); what it uses does not.
    (tmp_path / "only_here.py").write_text("def model(text):\n    return text.upper()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    only_here = importlib.import_module("only_here")
    (tmp_path / "only_here.py").unlink()

    @task
    def uses_helper(row: Row) -> str:
        return str(only_here.model(row.sid))

    # Said by the worker that tried (not by the probe's wait running out, whose message
    # differs): no clock in the test, which a loaded machine would fail.
    monkeypatch.setenv("PATRONUS_TASKS_WORKER_PROBE_SECONDS", "300")
    with pytest.raises(ExperimentError) as caught:
        _run(cluster, results_dir, "missing-module", task=uses_helper)
    said = str(caught.value)
    assert "cannot load the step 'uses_helper'" in said, said
    assert "No module named 'only_here'" in said and "install the module on every worker" in said
    sys.modules.pop("only_here", None)


def test_another_version_on_the_workers_is_refused(prefect_server: str, cluster: Any,
                                                   results_dir: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import patronus_tasks._version as version

    monkeypatch.setattr(version, "__version__", "0.0.0-here")
    with pytest.raises(ExperimentError, match=r"has patronus-tasks .* this process 0\.0\.0-here: "
                                              "install the same version on every worker"):
        _run(cluster, results_dir, "other-version")


def test_code_that_kills_the_workers_stops_the_run_with_a_reason(
        prefect_server: str, results_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dask
    from distributed import LocalCluster

    # Dask's KilledWorker, said as such (the probe's wait running out says "no task runner
    # worker ran the experiment's probe"): no clock in the test.
    monkeypatch.setenv("PATRONUS_TASKS_WORKER_PROBE_SECONDS", "300")
    crashing_loader.__dict__["bomb"] = DiesWhenLoaded()  # goes with the step to the workers
    # A cluster of its own, given up after two deaths (Dask's default is four): the
    # module's cluster waited for its nannies to bring its workers back after four, and
    # under load one nanny closed instead (seen beside a profiler sampling every process).
    with dask.config.set({"distributed.scheduler.allowed-failures": 1}), \
            LocalCluster(n_workers=1, threads_per_worker=2, dashboard_address=":0") as doomed:
        try:
            with pytest.raises(ExperimentError, match="the task runner's workers died loading "
                                                      "the experiment's code"):
                _run(doomed, results_dir, "dies", evaluators=[crashing_loader])
        finally:
            crashing_loader.__dict__.pop("bomb", None)


@task
def slow_model(row: Row) -> str:
    """Records each call in a file of its row, then takes a while."""
    with Path(row.calls, row.sid).open("a") as made:
        made.write("call\n")
    time.sleep(0.5)
    return str(row.sid)


def _read_written(out: Path, written: set[str]) -> bool:
    """The rows written so far, read while the workers write: a journal may become a
    part file between being listed and being read (then it is read again)."""
    from patronus_tasks.record.parquet import unfinished_tables

    try:
        written.update(str(s) for t in unfinished_tables(out) for s in t.column("sid").to_pylist())
    except FileNotFoundError:
        return False
    return True


def test_a_worker_killed_mid_run_leaves_every_row_exactly_once(prefect_server: str, cluster: Any,
                                                               results_dir: Path,
                                                               tmp_path: Path) -> None:
    import threading

    from distributed import Client

    calls = tmp_path / "calls"
    calls.mkdir()
    data = [{"sid": f"s{i:02d}", "calls": str(calls)} for i in range(40)]
    out = results_dir / "kill" / "killed"
    written: set[str] = set()
    with Client(cluster.scheduler_address) as client:
        pids = list(client.run(os.getpid).values())

        def kill_when_rows_are_written() -> None:
            until(lambda: len(list((out / "parts").glob("part-b*"))) >= 3, "rows written", 120)
            until(lambda: _read_written(out, written), "the rows written read", 30)
            os.kill(pids[0], signal.SIGKILL)

        killer = threading.Thread(target=kill_when_rows_are_written, daemon=True)
        killer.start()
        exp = run_experiment("kill", data=data, task=slow_model, backend="dask",
                             dask_address=cluster.scheduler_address, experiment_name="killed",
                             results_dir=results_dir, print_summary=False, html_report=False,
                             max_concurrency=2)
        killer.join(5)
    df = exp.to_dataframe()
    assert sorted(df["sid"]) == [f"s{i:02d}" for i in range(40)]  # each row exactly once
    assert exp.manifest["rows"] == 40 and exp.manifest["records"] == 40
    made = {p.name: len(p.read_text().splitlines()) for p in calls.iterdir()}
    assert set(made) == set(df["sid"])
    assert 0 < len(written) < 40  # killed mid-run, some rows written by then
    # A row written when its worker died is kept: not called again.
    assert all(made[sid] == 1 for sid in written), {s: made[s] for s in written}
    # Only rows in flight on the dead worker were called twice.
    assert sum(n - 1 for n in made.values()) <= 2 * 2
