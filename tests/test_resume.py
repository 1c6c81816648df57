"""Nothing lost: resume after SIGKILL without asking the model twice, retry only errors,
gates, and interrupts."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from patronus_tasks import ConfigError, QualityGateError, Row, evaluator, run_experiment, task
from patronus_tasks.results import load_experiment

from .conftest import RECORDED_WITHIN, ROOT
from .servers import FakeServer, Recorded, Reply, chat_completion, serve
from .waits import sids_written, until

SCRIPT = """
import sys
from patronus_tasks import evaluator, run_experiment
from patronus_tasks.openai import ChatTask, openai_endpoint

url, results, resume = sys.argv[1], sys.argv[2], sys.argv[3] == "resume"
chat = ChatTask("m", endpoint=openai_endpoint(url, max_attempts=1))

@evaluator
def answered(evaluated_model_output: str) -> bool:
    return evaluated_model_output.startswith("answer")

run_experiment("resumable", data=[{"evaluated_model_input": f"q{i}"} for i in range(30)],
               task=chat, evaluators=[answered], experiment_name="long-run", resume=resume,
               backend="local", results_dir=results, max_concurrency=4)
"""


class CountingModel:
    """A chat model that counts requests per input and stalls while ``stall`` is set."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()
        self.stall = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, req: Recorded) -> Reply:
        question = req.body["messages"][-1]["content"]
        with self.lock:
            self.seen[question] += 1
        if self.stall.is_set() and int(question[1:]) >= 10:
            time.sleep(600)  # the rows the kill interrupts
        return 200, {}, chat_completion(f"answer to {question}")


@pytest.fixture
def model() -> Iterator[tuple[FakeServer, CountingModel]]:
    counting = CountingModel()
    with serve(counting) as server:
        yield server, counting


def _run(url: str, results: Path | str, mode: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", SCRIPT, url, str(results), mode], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def killed_mid_run(url: str, results: Path | str, counting: CountingModel) -> None:
    """Start the run, SIGKILL it once rows q0..q9 are written (q10.. hang)."""
    counting.stall.set()
    proc = _run(url, results, "fresh")
    until(lambda: len(sids_written(results, "resumable", "long-run")) >= 10
          or proc.poll() is not None, "rows q0..q9 written")
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL, proc.stderr.read() if proc.stderr else ""


def test_sigkill_then_resume_asks_nothing_twice(model: tuple[FakeServer, CountingModel],
                                                 tmp_path: Path) -> None:
    server, counting = model
    killed_mid_run(server.url, tmp_path, counting)
    out_dir = tmp_path / "resumable" / "long-run"
    assert not (out_dir / "results.parquet").exists()
    before = load_experiment(out_dir).to_dataframe()
    done_before = set(before["evaluated_model_input"])
    assert {f"q{i}" for i in range(10)} <= done_before
    # Its manifest says running (it never wrote its end); `list` sees its process gone.
    from typer.testing import CliRunner

    from patronus_tasks.cli import app

    listed = CliRunner().invoke(app, ["list", "--results-dir", str(tmp_path)]).stdout
    assert "long-run" in listed and "stopped (its process is gone: killed?)" in listed, listed
    counting.stall.clear()
    resumed = _run(server.url, tmp_path, "resume")
    assert resumed.wait(120) == 0, resumed.stderr.read().decode()[-2000:] if resumed.stderr else ""
    df = load_experiment(out_dir).to_dataframe()
    assert sorted(df["sid"], key=int) == [str(i) for i in range(1, 31)]  # each row once
    assert df["pass"].all()
    for question in done_before:
        assert counting.seen[question] == 1, question  # never requested twice
    assert not (out_dir / "previous.parquet").exists()
    manifest = json.loads((out_dir / "manifest.json").read_text())
    assert manifest["status"] == "completed" and manifest["rows"] == 30


def test_retry_errors_reruns_only_failed_steps(results_dir: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    calls: Counter[str] = Counter()
    broken = {"3", "5"}

    @task
    def work(row: Row) -> str:
        calls[f"task-{row.sid}"] += 1
        return f"out-{row.sid}"

    @evaluator
    def judge(row: Row, evaluated_model_output: str) -> bool:
        calls[f"judge-{row.sid}"] += 1
        if row.sid in broken:
            raise RuntimeError("judge down")
        return True

    kwargs = dict(data=[{"x": i} for i in range(6)], task=work, evaluators=[judge],
                  experiment_name="flaky-judge", backend="local", results_dir=results_dir,
                  print_summary=False)
    nothing = run_experiment("retry", resume=True, **kwargs)  # type: ignore[arg-type]
    assert ("nothing to resume: no earlier run of retry/flaky-judge under" in capsys.readouterr().err)
    shutil.rmtree(nothing.path)
    calls.clear()
    first = run_experiment("retry", **kwargs)  # type: ignore[arg-type]
    assert first.manifest["evaluator_errors"] == 2
    broken.clear()
    again = run_experiment("retry", retry_errors=True, **kwargs)  # type: ignore[arg-type]
    said = capsys.readouterr().err
    assert f"retrying the rows that failed in {first.path}: 4 of 6 rows reused, 2 to run" in said
    assert again.path == first.path and again.manifest["evaluator_errors"] == 0
    assert again.manifest["experiment_id"] == first.manifest["experiment_id"]
    assert all(calls[f"task-{i}"] == 1 for i in range(1, 7))  # no task output asked twice
    assert calls["judge-3"] == calls["judge-5"] == 2 and calls["judge-1"] == 1
    df = again.to_dataframe()
    assert len(df) == 6 and df["pass"].all()
    by_id = run_experiment("retry", experiment_id=first.manifest["experiment_id"], **kwargs)  # type: ignore[arg-type]
    assert by_id.path == first.path and sum(calls.values()) == 6 + 8  # nothing left to run
    with pytest.raises(ConfigError, match="no experiment with id"):
        run_experiment("retry", experiment_id="nope", **kwargs)  # type: ignore[arg-type]


def test_resume_without_the_runs_name_is_refused(results_dir: Path) -> None:
    """Unnamed, every run is a new exp-<time>: a resume would run (and pay for) every row."""
    @evaluator
    def ok(row: Row) -> bool:
        return True

    for flag in ("resume", "retry_errors"):
        with pytest.raises(ConfigError, match=f"{flag}=True needs the run to go on with: give "
                                              "its experiment_name="):
            run_experiment("ds", data=[{"x": 1}], evaluators=[ok], backend="local",
                           results_dir=results_dir, print_summary=False, **{flag: True})


def test_resume_refuses_a_different_dataset(results_dir: Path) -> None:
    @evaluator
    def ok(row: Row) -> bool:
        return True

    run_experiment("ds", data=[{"x": 1}], evaluators=[ok], experiment_name="e",
                   backend="local", results_dir=results_dir, print_summary=False)
    with pytest.raises(ConfigError, match="dataset changed"):
        run_experiment("ds", data=[{"x": 2}], evaluators=[ok], experiment_name="e", resume=True,
                       backend="local", results_dir=results_dir, print_summary=False)


@pytest.mark.parametrize(
    ("gate", "fails"),
    [
        ({"fail_on_error": 0}, True),
        ({"fail_on_error": 1}, False),
        ({"fail_on_error": 0.2}, True),
        ({"fail_on_error": 0.5}, False),
        ({"min_pass_rates": {"judge": 0.5}}, False),
        ({"min_pass_rates": {"judge": 0.8}}, True),
    ],
)
def test_gates(results_dir: Path, gate: dict[str, object], fails: bool) -> None:
    @evaluator
    def judge(row: Row) -> bool:
        if row.sid == "4":
            raise RuntimeError("broken")
        return row.sid != "1"

    kwargs = dict(data=[{"x": i} for i in range(4)], evaluators=[judge], backend="local",
                  results_dir=results_dir, print_summary=False, **gate)
    if not fails:
        run_experiment("gates", **kwargs)  # type: ignore[arg-type]
        return
    with pytest.raises(QualityGateError) as err:
        run_experiment("gates", **kwargs)  # type: ignore[arg-type]
    assert err.value.experiment.results_path.exists()  # what was done is written
    assert err.value.failures and all(isinstance(m, str) for m in err.value.failures)


def test_gate_fails_the_prefect_flow_run(prefect_server: str, results_dir: Path) -> None:
    import asyncio

    from prefect.client.orchestration import get_client

    @evaluator
    def never(row: Row) -> bool:
        return False

    with pytest.raises(QualityGateError, match=r"never \[link 0\]: pass rate 0\.0% is below 50\.0%") as gate:
        run_experiment("gated", data=[{"x": 1}], evaluators=[never], results_dir=results_dir,
                       min_pass_rates={"never": 0.5}, print_summary=False)
    assert gate.value.experiment.wait_recorded(RECORDED_WITHIN)  # the flow run's end follows the results
    manifest = json.loads(next(results_dir.rglob("manifest.json")).read_text())

    async def state() -> str:
        async with get_client() as client:
            run = await client.read_flow_run(manifest["flow_run_id"])
            return run.state.type.value

    assert asyncio.run(state()) == "FAILED" and manifest["status"] == "completed"


def _manifest(out_dir: Path) -> dict[str, object]:
    try:
        return dict(json.loads((out_dir / "manifest.json").read_text()))
    except (OSError, ValueError):  # not written yet
        return {}


INTERRUPTED = """
import sys, time
from patronus_tasks import evaluator, run_experiment

@evaluator
def slow(row) -> bool:
    if int(row.sid) > 3:
        sys.stdout.write("started\\n")  # one write: two threads printing may interleave
        sys.stdout.flush()
        time.sleep(600)
    return True

run_experiment("interrupts", data=[{"x": i} for i in range(8)], evaluators=[slow],
               experiment_name="sigterm", results_dir=sys.argv[1], max_concurrency=2)
"""


def test_sigterm_flushes_and_marks_the_flow_run_cancelled(tmp_path: Path,
                                                          prefect_server: str) -> None:
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "home")}  # on the shared server
    proc = subprocess.Popen([sys.executable, "-c", INTERRUPTED, str(tmp_path / "r")], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    if not proc.stdout.readline().startswith("started"):  # it ended first: say why
        proc.wait(60)
        pytest.fail(f"the experiment ended before its slow row (exit {proc.returncode}):\n"
                    f"{proc.stderr.read()[-3000:]}")
    out_dir = tmp_path / "r" / "interrupts" / "sigterm"
    until(lambda: len(sids_written(out_dir)) >= 3 and _manifest(out_dir).get("flow_run_id"),
          "rows 1-3 written and the flow run made")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) != 0
    manifest = json.loads((out_dir / "manifest.json").read_text())
    assert manifest["status"] == "interrupted"
    assert sorted(load_experiment(out_dir).to_dataframe()["sid"]) == ["1", "2", "3"]
    # Said where the rows are and how to go on; `show` calls it what it is.
    said = proc.stderr.read()
    assert f"interrupted after 3 of 8 rows; those are kept in {out_dir}. Go on with resume=True" in said
    shown = load_experiment(out_dir).format_summary()
    assert shown.startswith("Experiment interrupts/sigterm (interrupted: 3 of 8 rows)")
    assert f"Results: {out_dir} (interrupted: its rows done are in parts/" in shown
    from typer.testing import CliRunner

    from patronus_tasks.cli import app

    listed = CliRunner().invoke(app, ["list", "--results-dir", str(tmp_path / "r")]).stdout
    assert "interrupts/sigterm" in listed and "interrupted  rows=3 of 8  errors=0" in listed
    count = subprocess.run(
        [sys.executable, "-c", "import asyncio, sys\n"
         "from prefect.client.orchestration import get_client\n"
         "async def main():\n"
         "    async with get_client() as c:\n"
         "        state = (await c.read_flow_run(sys.argv[1])).state\n"
         "        print(state.message)\n"
         "        print(state.type.value)\n"
         "asyncio.run(main())", manifest["flow_run_id"]],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert count.stdout.strip().splitlines()[-1] == "CANCELLED", count.stderr[-2000:]
    # said as a person says it (it was "interrupted: CancelledError()")
    assert "interrupted: stopped by SIGTERM after 3 of 8 rows" in count.stdout, count.stdout


def test_a_new_run_never_writes_into_a_stopped_runs_folder(results_dir: Path) -> None:
    """A run killed halfway (manifest and parts, no results.parquet) keeps its folder: the
    same name run again without resume goes to name-2 (it was written into the stopped
    run's folder, 60 records for 40 rows)."""
    rows = [{"evaluated_model_input": f"q{i}"} for i in range(3)]

    @task
    def answer_a(evaluated_model_input: str) -> str:
        return "a"

    @evaluator
    def ok(evaluated_model_output: str) -> bool:
        return True

    def run() -> Path:
        return run_experiment("p", data=rows, task=answer_a, evaluators=[ok],
                              experiment_name="again", backend="local",
                              results_dir=results_dir, print_summary=False,
                              html_report=False).location.local
    first = run()
    (first / "parts").mkdir(exist_ok=True)  # as a killed run leaves it: its rows in parts/
    (first / "results.parquet").rename(first / "parts" / "part-000000.parquet")
    second = run()
    assert second.name == "again-2" and len(load_experiment(second).to_dataframe()) == 3
    assert len(load_experiment(first).to_dataframe()) == 3  # the stopped run's rows, alone


def test_runs_of_one_name_started_at_once_claim_a_folder_each(tmp_path: Path) -> None:
    from patronus_tasks.execute.setup import CLAIM_FILE, _free_dir
    from patronus_tasks.procs import alive
    from patronus_tasks.record.location import Location

    root = Location.of(tmp_path)
    first, second = _free_dir(root, "p", "n"), _free_dir(root, "p", "n")
    assert (first.name, second.name) == ("n", "n-2")  # the first's claim holds (its process runs)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (tmp_path / "p" / "n-2" / CLAIM_FILE).write_text(str(gone.pid))  # a setup that failed
    assert _free_dir(root, "p", "n").name == "n-2"  # taken again
    assert _free_dir(root, "p", "n").name == "n-3"  # and n-2 is ours now: held
    elsewhere = tmp_path / "p" / "n-3" / CLAIM_FILE  # another host's claim (a shared folder)
    elsewhere.write_text(f"{gone.pid}@another-host")
    assert _free_dir(root, "p", "n").name == "n-4"  # never taken over from here
    # A zombie that is not ours (a shell's background job, its shell not done with it):
    # signals still reach it, yet it is gone.
    shell = subprocess.Popen(["sh", "-c", "sleep 0 & echo $!; exec sleep 30"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert shell.stdout is not None
        zombie = int(shell.stdout.readline())
        until(lambda: not alive(zombie), "the shell's ended job counted gone", 10)
        os.kill(zombie, 0)  # still there for signals: a zombie, not reaped here
    finally:
        shell.kill()
        shell.wait()


def test_a_setup_that_fails_gives_its_folder_back(results_dir: Path) -> None:
    """A run whose setup failed (a bad option) kept its claimed folder: the corrected
    retry went to name-2, and a resume then stopped at the empty folder ("nothing to
    resume")."""
    from patronus_tasks.execute.setup import _runs_of
    from patronus_tasks.record.location import Location

    @evaluator
    def ok(evaluated_model_output: str) -> bool:
        return True

    options: dict[str, Any] = {"evaluators": [ok], "experiment_name": "nightly",
                               "backend": "local", "results_dir": results_dir,
                               "print_summary": False, "html_report": False}
    data = [{"evaluated_model_output": "a"}]
    with pytest.raises(ConfigError):
        run_experiment("p", data=data, metadata={"x": object()}, **options)
    assert run_experiment("p", data=data, **options).location.name == "nightly"
    held = results_dir / "p" / "nightly-2"  # claimed, nothing written yet (a run starting)
    held.mkdir()
    (held / ".claimed").write_text(f"{os.getpid()}@{socket.gethostname()}")
    third = run_experiment("p", data=data, **options)
    assert third.location.name == "nightly-3"
    found = _runs_of(Location.of(results_dir), "p", "nightly")
    assert [f.name for f in found] == ["nightly", "nightly-3"]  # the gap is no end
