"""prefect.yaml on a real stack: `patronus-tasks server up`, its nightly schedules creating
runs, a deployment run by a process worker, read back through the Prefect API, a server
log without tracebacks, then `server down`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    FlowRunFilter,
    FlowRunFilterId,
)
from prefect.deployments import run_deployment

from patronus_tasks.prefect.server.stack import SERVER_NICE, Stack, alive, auth

from .conftest import ROOT
from .prefect_servers import api_of, copy_database, free_port

# Handed out early (conftest.SLOWEST), and whole by one worker (`--dist loadfile`).
pytestmark = pytest.mark.heavy


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PREFECT_WORKER_QUERY_SECONDS"] = "2"  # the worker polls every 10 s by default
    return subprocess.run([sys.executable, "-m", "patronus_tasks", "server", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, prefect_template_db: Path) -> Iterator[Stack]:
    home = tmp_path_factory.mktemp("prefect-home")
    copy_database(prefect_template_db, home)  # a migrated database: spares ~20 s of start-up
    up = _cli("up", "--home", str(home), "--port", str(free_port()))
    assert up.returncode == 0, up.stdout + up.stderr
    started = Stack.load(home)
    assert started is not None and "Prefect UI:  http://127.0.0.1:" in up.stdout
    # The server records at a lower CPU priority than the worker running the rows.
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    assert os.getpriority(os.PRIO_PROCESS, started.server_pid) == min(mine + SERVER_NICE, 19)
    # Every thread of it (Linux nices one thread per call; lowered once up, it had threads).
    threads = [int(t) for t in os.listdir(f"/proc/{started.server_pid}/task")]
    assert {os.getpriority(os.PRIO_PROCESS, t) for t in threads} == {min(mine + SERVER_NICE, 19)}
    assert started.worker_pid and os.getpriority(os.PRIO_PROCESS, started.worker_pid) == mine
    try:
        yield started
    finally:
        down = _cli("down", "--home", str(home))
        assert down.returncode == 0, down.stderr
        assert not alive(started.server_pid) and not alive(started.worker_pid or 0)
        assert Stack.load(home) is None


@contextlib.contextmanager
def _client_of(stack: Stack) -> Iterator[None]:
    """This process a client of the stack meanwhile: its API, and the auth string it asks."""
    from prefect.settings import PREFECT_API_AUTH_STRING, temporary_settings

    with api_of(stack.api_url), temporary_settings({PREFECT_API_AUTH_STRING: auth.read(Path(stack.home))}):
        yield


async def _read_back(flow_run_id: Any) -> tuple[Any, Any, int, list[Any]]:
    async with get_client() as client:
        parent = await client.read_flow_run(flow_run_id)
        children = [fr for fr in await client.read_flow_runs()
                    if fr.parent_task_run_id is not None and fr.id != parent.id]
        child = children[0]
        runs = await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[child.id])))
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[child.id])))
        return parent, child, len(runs), artifacts


def test_deployment_runs_on_a_worker_and_reads_back(stack: Stack, tmp_path: Path) -> None:
    results = tmp_path / "results"
    with _client_of(stack):
        # One run: a post retried under load (its answer late) made a second one.
        flow_run = run_deployment(
            "text-to-sql-eval/text-to-sql-nightly", idempotency_key=str(uuid.uuid4()), timeout=240,
            poll_interval=1,
            parameters={"results_dir": str(results), "experiment_name": "deployed",
                        "max_concurrency": 4})
        parent, child, task_runs, artifacts = asyncio.run(_read_back(flow_run.id))
    assert parent.state.type.value == "COMPLETED", parent.state
    assert parent.name.startswith("deployed @ ")
    assert parent.parameters["experiment_name"] == "deployed"
    assert child.name.startswith("deployed @ ") and child.state.type.value == "COMPLETED"
    assert task_runs == 12 + 9 * 2  # every row's task, and both evaluators of 9 rows
    keys = {a.key for a in artifacts}  # one series: the deployment's, whatever the name
    series = "text-to-sql-nightly"  # the deployment's name says it all: a short key
    assert keys == {f"{series}-{k}" for k in ("summary", "report", "results", "progress",
                                               "vs-previous", "history", "charts", "baseline")}
    # The deployment's own flow run carries the verdict: its state's name, its tags (one
    # row's SQL fails by design: errors), the figures in its message.
    assert parent.state.name == child.state.name == "Completed"  # Prefect's: the lists filter by it
    assert "errors" in parent.tags and "errors" in child.tags
    assert parent.state.message.startswith(
        "Errors: 12 rows: result_matches_gold 6 of 9 judged rows passed (66.7%); 1 row's task failed")
    assert child.parameters["series"] == "text-to-sql-eval/text-to-sql-nightly/text-to-sql"
    assert child.parameters["rows"] == 12 and child.parameters["task"] == "perform_sql_query"
    path = results / "text-to-sql" / "deployed" / "results.parquet"
    assert pq.read_table(path).num_rows == 12 - 3 + 9 * 2 - 9 + 3
    assert (path.parent / "report.html").is_file()
    manifest = json.loads((path.parent / "manifest.json").read_text())
    assert manifest["flow_run_id"] == str(child.id)


async def _scheduled(deployment: str) -> list[Any]:
    async with get_client() as client:
        found = await client.read_deployment_by_name(deployment)
        return [r for r in await client.read_flow_runs(limit=200)
                if r.deployment_id == found.id and r.state and r.state.type.value == "SCHEDULED"]


def test_deployment_parameters_are_described_and_relative(stack: Stack) -> None:
    async def read() -> Any:
        async with get_client() as client:
            return await client.read_deployment_by_name("text-to-sql-eval/text-to-sql-nightly")

    with _client_of(stack):
        deployment = asyncio.run(read())
    schema = deployment.parameter_openapi_schema["properties"]
    assert set(schema) == {"dataset", "project", "experiment_name", "max_concurrency",
                           "results_dir", "fail_on_regression", "cache", "repeats", "min_f1",
                           "resume"}  # resume: a crashed night goes on from the run form
    for name, prop in schema.items():  # the run form explains every field
        assert len(prop.get("description", "")) > 15, name
    assert deployment.parameters["dataset"] == "datasets/text_to_sql.jsonl"
    assert schema["dataset"]["default"] == "datasets/text_to_sql.jsonl"
    # the gate's two rules from the run form or --param: true / "significant", or "worse"
    assert {"type": "boolean"} in schema["fail_on_regression"]["anyOf"]
    assert {"enum": ["significant", "worse"], "type": "string"} in schema["fail_on_regression"]["anyOf"]


def test_nightly_schedules_create_runs(stack: Stack) -> None:
    # The scheduler service creates the cron deployment's next runs (Prefect 3.8 on
    # SQLAlchemy 2.1 never did: pyproject caps it); the paused one gets none.
    deadline, runs = time.monotonic() + 90, []
    with _client_of(stack):
        while not runs and time.monotonic() < deadline:
            time.sleep(2)
            runs = asyncio.run(_scheduled("text-to-sql-eval/text-to-sql-nightly"))
        paused = asyncio.run(_scheduled("openai-task/openai-task-nightly"))
    assert runs, "no scheduled run for the nightly deployment within 90 s"
    assert all(r.expected_start_time.hour == 2 and r.expected_start_time.minute == 0 for r in runs)
    assert paused == []


def _state_of(flow_run_id: Any) -> Any:
    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id)


def test_a_review_suspends_the_run_and_takes_its_experiment_up_again(stack: Stack, tmp_path: Path) -> None:
    """On a deployment the review suspends the flow run (its process ends, the worker is
    free); resumed with the answer through Prefect's own call, the run starts again, takes
    the same experiment up (not run twice) and keeps the labels."""
    from prefect.flow_runs import resume_flow_run

    results, labels = tmp_path / "results", tmp_path / "labels.jsonl"
    dataset = tmp_path / "rag.jsonl"  # three of the bundled rows: the run's own part is short
    dataset.write_text("".join((ROOT / "datasets" / "rag_qa.jsonl").read_text().splitlines(True)[:3]))
    with _client_of(stack):
        # One run: a post retried under load (its answer late) made a second one.
        flow_run = run_deployment(
            "rag-eval/rag-nightly", idempotency_key=str(uuid.uuid4()), timeout=0, parameters={
                "dataset": str(dataset), "results_dir": str(results), "experiment_name": "reviewed",
                "judges": False, "review": 2, "review_evaluator": "answers", "labels": str(labels)})
        deadline = time.monotonic() + 180
        while (run := _state_of(flow_run.id)).state.name != "Suspended":
            assert time.monotonic() < deadline and not run.state.is_final(), run.state
            time.sleep(1)
        keys = run.state.state_details.run_input_keyset
        with get_client(sync_client=True) as client:
            schema = json.loads(client.read_flow_run_input(flow_run.id, keys["schema"]))
        fields = [n for n in schema["properties"] if n.startswith("label_")]
        assert len(fields) == 2
        resume_flow_run(flow_run.id, run_input={"reviewer": "Ann", fields[0]: "pass", fields[1]: "fail"})
        while not (run := _state_of(flow_run.id)).state.is_final():
            assert time.monotonic() < deadline, run.state
            time.sleep(1)
    assert run.state.is_completed(), run.state
    assert "Review: 2 of 2 reviewed" in (run.state.message or ""), run.state.message
    folders = [p.name for p in (results / "rag-qa").iterdir() if p.is_dir()]
    assert folders == ["reviewed"]  # the experiment taken up again, not run twice
    written = pq.read_table(results / "rag-qa" / "reviewed" / "labels.parquet").to_pylist()
    assert sorted((w["label"], w["reviewer"]) for w in written) == [("fail", "Ann"), ("pass", "Ann")]
    assert len(labels.read_text().splitlines()) == 2  # the calibration set grew


def test_a_suspended_review_nobody_answers_goes_on_at_its_deadline(stack: Stack, tmp_path: Path) -> None:
    """Nobody answers a suspended review: at its deadline the bundled review-timeout run
    resumes it with no answer, and the run goes on and completes (Prefect's own deadline,
    later, would have failed it)."""
    results = tmp_path / "results"
    dataset = tmp_path / "rag.jsonl"
    dataset.write_text("".join((ROOT / "datasets" / "rag_qa.jsonl").read_text().splitlines(True)[:3]))
    with _client_of(stack):
        # One run: a post retried under load (its answer late) made a second one.
        flow_run = run_deployment(
            "rag-eval/rag-nightly", idempotency_key=str(uuid.uuid4()), timeout=0, parameters={
                "dataset": str(dataset), "results_dir": str(results), "experiment_name": "unanswered",
                "judges": False, "review": 2, "review_evaluator": "answers", "review_timeout": 4,
                "labels": str(tmp_path / "labels.jsonl")})
        deadline = time.monotonic() + 240
        while not (run := _state_of(flow_run.id)).state.is_final():
            assert time.monotonic() < deadline, run.state
            time.sleep(1)
        with get_client(sync_client=True) as client:
            states = [s.name for s in client.read_flow_run_states(flow_run.id)]
    assert run.state.is_completed(), run.state
    assert "Suspended" in states and "Resuming" in states, states
    assert "Review: 0 of 2 reviewed; page 1 of 1: nobody answered within 4 s" in (run.state.message or ""), \
        run.state.message
    assert [p.name for p in (results / "rag-qa").iterdir() if p.is_dir()] == ["unanswered"]


def test_up_again_starts_a_dead_worker_and_leaves_a_running_stack_be(stack: Stack) -> None:
    """`server up` where the stack runs says so; where its worker died (killed, OOM), it
    starts the worker again where it ran, and `down` stops that one."""
    again = _cli("up", "--home", stack.home)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "already up" in again.stdout and Stack.load(Path(stack.home)) == stack
    os.kill(stack.worker_pid or 0, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while alive(stack.worker_pid or 0) and time.monotonic() < deadline:
        time.sleep(0.1)
    again = _cli("up", "--home", stack.home)
    assert again.returncode == 0, again.stdout + again.stderr
    restarted = Stack.load(Path(stack.home))
    assert restarted is not None and restarted.worker_pid not in (None, stack.worker_pid)
    assert alive(restarted.worker_pid or 0) and restarted.server_pid == stack.server_pid
    assert f"the worker had stopped: started again (pid {restarted.worker_pid}" in again.stdout
    assert os.readlink(f"/proc/{restarted.worker_pid}/cwd") == str(ROOT)  # where it ran
    stack.procs[:] = restarted.procs  # the fixture's `down` stops the new one


def test_server_log_has_no_traceback(stack: Stack) -> None:
    # Runs last in this module: after the stack started, deployed and ran a deployment.
    log = (Path(stack.home) / "server.log").read_text(errors="replace")
    problems = [entry for entry in re.split(r"\n(?=\d\d:\d\d:\d\d\.\d+ \||[A-Z]+: )", log)
                if ("Traceback" in entry or "ERROR" in entry) and not _sqlite_busy(entry)]
    assert not problems, "\n".join(problems)[-5000:]


def _sqlite_busy(entry: str) -> bool:
    # SQLite in WAL mode answers "database is locked" at once, busy timeout or not, when a
    # reader's transaction must become a writer's while another writes; Prefect logs it and
    # the worker's next heartbeat (30 s) goes through. Seen here only on a loaded machine
    # (load 10 on 2 cores, the whole suite and three other test runs).
    return "sqlite3.OperationalError) database is locked" in entry


def test_every_deployment_names_the_work_pool() -> None:
    # `prefect deploy --all` stops at the first deployment without one, after deploying the
    # ones before it: a merge that drops a `work_pool:` breaks `server up` for everyone.
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    missing = [d["name"] for d in spec["deployments"] if not d.get("work_pool")]
    assert missing == []
