"""One experiment on every backend: the same results, and on Prefect the same task runs.

Retries, a timeout, a task returning `None`, an error, a chained task reading its parent,
a gate and `retry_errors` behave the same in-process, on Prefect and on Dask. A script
without ``if __name__ == "__main__":`` runs its experiment once on Dask, and never again in
a worker process that imports it.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from prefect.client.orchestration import get_client

from patronus_tasks import QualityGateError, run_experiment

from .conftest import RECORDED_WITHIN
from .shared_steps import answer, follow_up_traced, size, upper_judge
from .waits import task_runs_with_states

KINDS = ["ok", "flaky", "broken", "skip", "hang", "ok", "ok", "flaky"]
#: Columns that differ from run to run whatever the backend: wall times, tracebacks
#: (file paths and frames of the process that ran the call), and the data's `run` column.
VARYING = ["evaluation_duration_s", "task_duration_s", "error_traceback", "run", "task_started_at",
           "evaluation_started_at", "task_spans", "evaluation_spans"]


def _run(backend: str, results_dir: Path, **options: Any) -> Any:
    data = [{"kind": k, "text": f"t{i}", "run": backend} for i, k in enumerate(KINDS)]
    return run_experiment("backends", data=data, experiment_name=f"same-{backend}",
                          chain=[{"task": answer, "evaluators": [upper_judge, size]},
                                 {"task": follow_up_traced}],
                          backend=backend, results_dir=results_dir / backend,
                          print_summary=False, max_concurrency=3, **options)


def _spans(exp: Any) -> list[tuple[Any, ...]]:
    """Where each span ran and what it was (ids and times differ from run to run)."""
    df = exp.spans()
    return sorted(zip(df.sid, df.link_index, df.step, df.name, df.kind, df.output,
                      df.attributes, strict=True))


def _comparable(exp: Any) -> pd.DataFrame:
    df = exp.to_dataframe().drop(columns=VARYING, errors="ignore")
    keys = ["sid", "link_index", "evaluator_name"]
    return df.sort_values(keys, na_position="first").reset_index(drop=True)


async def _task_runs(flow_run_id: str) -> dict[str, tuple[str, str, int]]:
    """Each call's task run: state type, state name, run count (Dask's batch task runs,
    which hold its calls, left out)."""
    async with get_client() as client:
        runs = await task_runs_with_states(client, flow_run_id)
    return {r.name: (r.state.type.value, r.state.name, r.run_count) for r in runs
            if not r.name.startswith("batch-")}


def _gated(backend: str, results_dir: Path, **options: Any) -> Any:
    with pytest.raises(QualityGateError) as caught:
        _run(backend, results_dir, fail_on_error=0, **options)
    assert "errored" in str(caught.value)
    return caught.value.experiment


@pytest.mark.heavy
def test_one_experiment_behaves_the_same_on_every_backend(prefect_server: str,
                                                          results_dir: Path) -> None:
    # Dask through a scheduler's address (one cluster for both runs, of one worker process:
    # each takes seconds to start); test_object_store.py covers the local cluster made for
    # you, its two worker processes and what each of them writes.
    from distributed import LocalCluster

    frames, records, again, spans = {}, {}, {}, {}
    with LocalCluster(n_workers=1, threads_per_worker=2, dashboard_address=":0") as cluster:
        for backend in ("local", "prefect", "dask"):
            where = {"dask_address": cluster.scheduler_address} if backend == "dask" else {}
            exp = _gated(backend, results_dir, **where)
            frames[backend], spans[backend] = _comparable(exp), _spans(exp)
            retried = _run(backend, results_dir, retry_errors=True, **where)
            assert retried.path == exp.path
            again[backend] = _comparable(retried)
            if backend != "local":
                assert exp.wait_recorded(RECORDED_WITHIN) and retried.wait_recorded(RECORDED_WITHIN)
                records[backend] = (asyncio.run(_task_runs(exp.manifest["flow_run_id"])),
                                    asyncio.run(_task_runs(retried.manifest["flow_run_id"])))
    pd.testing.assert_frame_equal(frames["prefect"], frames["local"])
    pd.testing.assert_frame_equal(frames["dask"], frames["local"])
    pd.testing.assert_frame_equal(again["prefect"], again["local"])
    pd.testing.assert_frame_equal(again["dask"], again["local"])
    assert records["dask"] == records["prefect"]
    # the chained task's span, the same on every backend; on Prefect a task run nested in it
    assert spans["dask"] == spans["prefect"] == spans["local"]
    assert [(s[0], s[3]) for s in spans["local"]] == [
        (sid, "read_parent") for sid in ("1", "2", "5", "6", "7", "8")]
    first, retry = records["prefect"]
    assert first["read_parent-1"] == ("COMPLETED", "Completed", 1)
    assert first["answer-2"] == ("COMPLETED", "Completed", 2)  # one retry used
    assert first["answer-3"] == ("FAILED", "Failed", 3)
    assert first["upper_judge-5"][:2] == ("FAILED", "TimedOut")
    assert "follow_up_traced-1-link1" in first and "follow_up_traced-4-link1" not in first  # None stops
    # retry_errors calls again only what failed: the broken task, the timed-out judge.
    assert set(retry) == {"answer-3", "upper_judge-5"}
    df = frames["local"]
    assert df.loc[df.sid == "4", "status"].tolist() == ["skipped"]
    assert df.loc[df.sid == "3", "error_type"].tolist() == ["ValueError"]


#: A plain script as users write it: steps at module level, the experiment at top level
#: (no `if __name__ == "__main__":`), a helper from a module beside it. Each run of the
#: script's top level and each model call appends a line to CALLS_LOG.
GUARDLESS = """
import os
from pathlib import Path

from helpers import shout
from patronus_tasks import Row, TaskResult, evaluator, run_experiment, task

LOG = Path(os.environ["CALLS_LOG"])
with LOG.open("a") as f:
    f.write(f"script {os.getpid()}\\n")


@task
def answer(row: Row) -> str:
    with LOG.open("a") as f:
        f.write(f"call {row.sid} {os.getpid()}\\n")
    return shout(row.text)


@evaluator
def loud(task_result: TaskResult) -> bool:
    return task_result.evaluated_model_output.isupper()


exp = run_experiment("guardless", data=[{"text": f"t{i}"} for i in range(6)], task=answer,
                     evaluators=[loud], experiment_name="plain", backend=os.environ["BACKEND"],
                     results_dir=os.environ["RESULTS"], print_summary=False)
print("passed", int(exp.to_dataframe()["pass"].sum()))
"""


def _run_script(tmp_path: Path, text: str, backend: str) -> tuple[Any, list[list[str]]]:
    """Run ``text`` as ``scripts/plain.py`` from another folder; its output and log lines."""
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "plain.py").write_text(text)
    (scripts / "helpers.py").write_text("def shout(text):\n    return text.upper()\n")
    log = tmp_path / "calls.log"
    env = {**os.environ, "CALLS_LOG": str(log), "RESULTS": str(tmp_path / "results"),
           "BACKEND": backend}
    out = subprocess.run([sys.executable, str(scripts / "plain.py")], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    return out, [line.split() for line in log.read_text().splitlines()]


@pytest.mark.heavy
def test_a_script_without_a_main_guard_runs_its_experiment_once_on_dask(
        prefect_server: str, tmp_path: Path) -> None:
    # Dask's LocalCluster spawned workers that imported the script again: it ran once more
    # in each, experiment included, before "Nanny failed to start".
    out, lines = _run_script(tmp_path, GUARDLESS, "dask")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "passed 6" in out.stdout  # the script's step and its helper ran on the workers
    runs = [pid for kind, pid, *_ in lines if kind == "script"]
    calls = [(sid, pid) for kind, sid, *pid in lines if kind == "call"]
    assert len(runs) == 1  # the script's top level ran once: here, not in the workers
    assert sorted(sid for sid, _ in calls) == [str(i) for i in range(1, 7)]  # each call once
    assert not {runs[0]} & {pid[0] for _, pid in calls}  # in worker processes
    assert [p.name for p in (tmp_path / "results" / "guardless").iterdir()] == ["plain"]


def test_no_experiment_starts_in_a_worker_process_importing_the_script(tmp_path: Path) -> None:
    """What a worker that multiprocessing spawns (as Dask's `LocalCluster` does for a cluster
    of one's own) does with a script without the guard: it stops at a `ConfigError` saying
    what to add, before its experiment starts again."""
    spawns = GUARDLESS + (
        "import multiprocessing\n"
        "worker = multiprocessing.get_context('spawn').Process(target=os.getpid)\n"
        "worker.start()\nworker.join()\nprint('worker exit code', worker.exitcode)\n")
    out, lines = _run_script(tmp_path, spawns, "local")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "passed 6" in out.stdout and "worker exit code 1" in out.stdout
    assert "ConfigError: an experiment was started while a worker process imports" in out.stderr
    assert 'under `if __name__ == "__main__":` in that script' in out.stderr
    kinds = [kind for kind, *_ in lines]
    assert kinds.count("script") == 2  # the worker's import of the script stopped at the call
    assert kinds.count("call") == 6  # the first run's calls only
    assert [p.name for p in (tmp_path / "results" / "guardless").iterdir()] == ["plain"]


class _Collect:
    """A reporter that keeps what it is sent."""

    name = "collect"

    def __init__(self) -> None:
        self.records: list[Any] = []

    async def start(self, spec: Any) -> None:
        pass

    async def add(self, records: list[Any]) -> None:
        self.records += records

    async def finish(self, manifest: Any) -> dict[str, Any]:
        return {"records": len(self.records), "status": manifest.status}

    def cancel(self) -> None:
        pass


def test_any_prefect_task_runner_runs_the_rows_and_shows_them_as_batches_end(
        prefect_server: str, results_dir: Path) -> None:
    """A `TaskRunner` given as ``backend`` runs the rows in batches through the same row
    loop as Dask's; each batch's rows reach the progress and the reporters once it ends."""
    from prefect.task_runners import ThreadPoolTaskRunner

    from .shared_steps import said_row, where

    progress: list[tuple[int, int]] = []
    reporter = _Collect()
    exp = run_experiment("runner", data=[{"n": i} for i in range(6)], task=where,
                         evaluators=[said_row], backend=ThreadPoolTaskRunner(max_workers=2),
                         results_dir=results_dir, print_summary=False, reporters=[reporter],
                         on_progress=lambda done, rows: progress.append((done, rows)))
    assert exp.to_dataframe()["pass"].tolist() == [True] * 6
    assert progress[-1] == (6, 6) and len(progress) == 6
    assert sorted(int(r.sid) for r in reporter.records) == list(range(1, 7))
    assert exp.manifest["rows"] == 6 and exp.manifest["reports"]["collect"] == {
        "records": 6, "status": "completed"}  # finish() is given the run's manifest
    assert exp.wait_recorded(RECORDED_WITHIN)
    names = set(asyncio.run(_task_runs(exp.manifest["flow_run_id"])))
    assert names == {f"{step}-{i}" for step in ("where", "said_row") for i in range(1, 7)}
