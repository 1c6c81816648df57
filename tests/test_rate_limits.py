"""A server that limits the rate of events (Prefect Cloud answers 429 with Retry-After):
every record arrives, at the pace it allows, never sooner than it asks; and a user who
must spare such a server records only the calls that need a look (``record="failures"``).
A busy database (SQLite refusing a write that met another) is asked again soon.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client

from patronus_tasks import evaluator, run_experiment, task
from patronus_tasks.run import background

from .conftest import RECORDED_WITHIN
from .prefect_gate import Gate, Limit
from .test_recording import _count
from .waits import task_runs_with_states

ROWS = 100


@evaluator
def short(evaluated_model_output: str) -> bool:
    return len(evaluated_model_output) < 2


@evaluator
def digits(evaluated_model_output: str) -> bool:
    return evaluated_model_output.isdigit()


def _data(rows: int = ROWS) -> list[dict[str, str]]:
    return [{"evaluated_model_output": str(i)} for i in range(rows)]


def test_a_rate_limited_server_gets_every_record_at_its_pace(
        prefect_gate: Gate, results_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gate = prefect_gate
    gate.limit = Limit(events=60, window=2.0)  # 2 x 100 events: several windows
    exp = run_experiment("rate-limited", data=_data(), evaluators=[short, digits],
                         results_dir=results_dir, print_summary=False)
    # What the process says while it waits for Prefect at exit (the same wait, called now).
    assert background.drain(timeout=120)
    told = capsys.readouterr().err
    assert exp.wait_recorded(1)
    assert _count(exp.manifest["flow_run_id"]) == 2 * ROWS  # each once, none dropped
    assert gate.refusals and gate.forwarded_events == 2 * ROWS
    # Never sooner than the server asked (Retry-After: the rest of its window, >= 1 s),
    # and not twice as long either (Prefect's client sleeps it too before it answers).
    waits = list(zip(gate.after_refusal, gate.asked, strict=False))
    assert min(gate.after_refusal) >= 0.95, waits
    assert sum(after < 2 * asked for after, asked in waits) > len(waits) / 2, waits
    # What the wait says of the limit: the rate it allows once the server took some events
    # in the last window, before that that it is not known yet (beside two CPU hogs the
    # first line came before any was taken, and the run ended before the next: both forms
    # are pinned in `test_the_wait_says_the_rate_the_server_allows`).
    assert "HTTP 429" in told and "nothing is dropped" in told, told
    assert "events/min" in told or "how long is known once it takes some" in told, told


def test_the_wait_says_the_rate_the_server_allows() -> None:
    import httpx

    from patronus_tasks.http import Pace

    pace = Pace()
    assert pace.note(200) is None  # no limit met: nothing to say
    pace.saw(httpx.Response(429, headers={"Retry-After": "2"}))
    said = pace.note(200)
    assert said is not None and "Retry-After 2 s" in said and "200 task runs to go" in said
    assert "how long is known once it takes some" in said
    pace.took(60)  # taken within the last second: 60 a second, 3,600 a minute
    said = pace.note(200)
    assert said is not None and "at the ~3600 events/min it allows" in said and "~3 s" in said
    assert said.endswith("nothing is dropped")


def test_a_busy_database_is_asked_again_soon_and_flow_runs_are_made_one_at_a_time(
        prefect_gate: Gate, results_dir: Path) -> None:
    # A server on SQLite answers 503 without Retry-After to a flow run whose write met
    # another's: asked again within a second here (Prefect's client waits 2, 4 then 8 s).
    # Experiments started together make their flow runs one at a time (at once, all but
    # one were refused: six flow runs came 2-13 s late).
    gate = prefect_gate
    gate.busy_flow_runs = 3
    first = run_experiment("busy", data=_data(3), evaluators=[short], print_summary=False,
                           results_dir=results_dir / "first")
    # 120 s: once in ~10 suite runs the shared server stalls for a minute or more (seen
    # here at 2026-11-26 04:45, the run 398 s instead of ~220; unexplained, noted).
    assert first.wait_recorded(RECORDED_WITHIN)
    posts = gate.flow_run_posts
    assert len(posts) >= 3 + 1  # (the server itself may be busy too: more are fine)
    gaps = [later - earlier for earlier, later in itertools.pairwise(posts[:4])]
    assert max(gaps) < 1.5, gaps
    exps = [run_experiment("busy", data=_data(3), evaluators=[short], print_summary=False,
                           results_dir=results_dir / str(i)) for i in range(4)]
    assert all(exp.wait_recorded(RECORDED_WITHIN) for exp in exps)
    assert len({exp.manifest.flow_run_id for exp in [first, *exps]}) == 5
    assert gate.most_creating == 1


@task
def echo(evaluated_model_output: str) -> str:
    if evaluated_model_output == "13":
        raise RuntimeError("unlucky")
    return evaluated_model_output


async def _flow_run(flow_run_id: str) -> tuple[Any, list[Any], list[str]]:
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    async with get_client() as client:
        run = await client.read_flow_run(flow_run_id)
        runs = await task_runs_with_states(client, flow_run_id)
        logs = await client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    return run, runs, [log.message for log in logs]


def test_record_failures_only_makes_task_runs_of_what_needs_a_look(
        prefect_server: str, results_dir: Path) -> None:
    exp = run_experiment("failures-only", data=_data(20), task=echo, evaluators=[short],
                         record="failures", results_dir=results_dir, print_summary=False)
    assert exp.wait_recorded(RECORDED_WITHIN)
    run, runs, logs = asyncio.run(_flow_run(exp.manifest["flow_run_id"]))
    # 20 rows: "13" errors in its task; of the 19 left, 10 ("0".."9") pass `short`.
    assert sorted(r.name for r in runs) == sorted(  # a verdict that did not pass: its name marked
        ["echo-14"] + [f"(x) short-{i + 1}" for i in range(10, 20) if i != 13])
    assert {r.state.name for r in runs} == {"Failed", "Not passed"}
    assert not any(r.task_inputs.get("wait_for") for r in runs)  # their passing tasks are not there
    # the figures count all
    assert "short 10 of 19 judged rows passed (52.6%); 1 row's task failed" in (run.state.message or "")
    assert any("10 of 39 calls recorded as task runs" in line for line in logs)
    assert exp.manifest["prefect"]["task_runs"] == 10
