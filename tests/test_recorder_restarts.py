"""A recorder against servers of its own: one without its event persister, one killed and
restarted mid-run."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prefect.client.orchestration import get_client

from patronus_tasks import Row, evaluator, run_experiment, task
from patronus_tasks.prefect import internal
from patronus_tasks.prefect.recorder.taskruns import Limits, TaskRunRecorder

from .prefect_gate import gate_for
from .prefect_servers import api_of
from .test_recorder import _new_flow_run, _record
from .test_recording import _count
from .waits import until


@contextlib.contextmanager
def _server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, template: Path,
            *services_off: str) -> Iterator[Any]:
    """A real Prefect server of its own (these services off), as the API meanwhile."""
    from .prefect_servers import start_server

    for service in services_off:
        monkeypatch.setenv(f"PREFECT_SERVER_SERVICES_{service}_ENABLED", "false")
    server = start_server(tmp_path / "home", template)
    try:
        with api_of(server.api_url):
            yield server
    finally:
        server.stop()


@evaluator
def short(evaluated_model_output: str) -> bool:
    return len(evaluated_model_output) < 4


def _record_without_persister(grace: float) -> tuple[str, TaskRunRecorder]:
    async def record() -> tuple[str, TaskRunRecorder]:
        flow_run_id = await _new_flow_run("no-persister")
        limits = Limits(max_ahead=100, persister_grace_seconds=grace)
        recorder = TaskRunRecorder(flow_run_id, [], limits=limits).start()
        _record(recorder, "evaluator-short", 300)
        recorder.close()
        return flow_run_id, recorder

    return asyncio.run(record())


@pytest.mark.heavy
def test_without_the_event_persister_task_runs_alone_count(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefect_template_db: Path) -> None:
    # A server whose event persister is off stores no event: waiting for stored events
    # would never end. Its settings say so: the recorder counts task runs alone from the
    # start, no grace waited out (here longer than the wait).
    with _server(tmp_path, monkeypatch, prefect_template_db, "EVENT_PERSISTER") as server:
        flow_run_id, recorder = _record_without_persister(grace=600)
        assert recorder.wait(90) and recorder.recorded == 300
        assert _count(flow_run_id) == 300
        assert not recorder.backlog.persisting
        # A server that does not tell its settings (as Prefect Cloud): the recorder
        # concludes it after the grace, from the task runs recorded and no event stored.
        with gate_for(server.api_url) as gate, api_of(gate.url):
            gate.hidden.add("/admin/settings")
            _, recorder = _record_without_persister(grace=3.0)
            assert recorder.wait(90) and recorder.recorded == 300
            assert not recorder.backlog.persisting


@task
async def paced(row: Row) -> str:
    await asyncio.sleep(0.05)
    return f"out {row.sid}"


@pytest.mark.heavy
def test_a_server_killed_and_restarted_mid_run_loses_nothing(
        tmp_path: Path, results_dir: Path, monkeypatch: pytest.MonkeyPatch,
        prefect_template_db: Path) -> None:
    # Killed with events in its broker (taken, not yet recorded), restarted on the same
    # database: what it lost is sent again, with the same ids, and nothing doubles.
    import contextvars


    # The recorder process sends the run's tail, lost at the kill, again once nothing was
    # recorded for its stall: 3 s here (15 s by default).
    monkeypatch.setenv("PATRONUS_TASKS_RECORDER_STALL_SECONDS", "3")
    with _server(tmp_path, monkeypatch, prefect_template_db) as server:
        done: dict[str, Any] = {}

        def experiment() -> None:
            done["exp"] = run_experiment(
                "restart", data=[{"x": i} for i in range(240)], task=paced, evaluators=[short],
                results_dir=results_dir, print_summary=False, max_concurrency=4)

        runner = threading.Thread(target=contextvars.copy_context().run, args=(experiment,))
        runner.start()
        until(lambda: _recorded_so_far(server.api_url) >= 120, "120 task runs recorded")
        server.kill()
        server.start()
        runner.join(180)
        exp = done["exp"]
        assert exp.wait_recorded(180)
        flow_run_id = exp.manifest["flow_run_id"]
        assert _count(flow_run_id) == 480  # every call once, in its final state
        assert _count_all(flow_run_id) == 480  # and no other task run
        # Its post-run waited for the server to answer again: artifacts, then the state.
        state, keys = asyncio.run(_published(flow_run_id))
        assert state == "COMPLETED" and any(k.endswith("-summary") for k in keys), (state, keys)


def _recorded_so_far(api_url: str) -> int:
    """Task runs on the server so far, of any flow run (the experiment's is not known yet)."""
    try:
        return int(httpx.post(f"{api_url}/task_runs/count", json={}, timeout=5).json())
    except httpx.HTTPError:
        return 0


def _count_all(flow_run_id: str) -> int:
    """Task runs of the flow run, in any state."""
    async def count() -> int:
        async with get_client() as client:
            return await internal.count_task_runs(
                client, {"flow_runs": {"id": {"any_": [flow_run_id]}}})

    return asyncio.run(count())


async def _published(flow_run_id: str) -> tuple[str, list[str]]:
    """The flow run's state type and the keys of its artifacts."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    async with get_client() as client:
        run = await client.read_flow_run(flow_run_id)
        artifacts = await client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    return run.state.type.value if run.state else "", [a.key or "" for a in artifacts]
