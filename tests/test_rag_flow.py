"""flows/rag_eval.py: several families of ready evaluators on the bundled RAG set, on a
real Prefect server; offline it says its judges were skipped, with an endpoint (a
scripted judge on 127.0.0.1) each judge call is a task run of its own."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest

from .conftest import RECORDED_WITHIN, ROOT
from .judge_server import completion
from .servers import Recorded, Reply, serve


def _flow_module() -> Any:
    spec = importlib.util.spec_from_file_location("rag_flow", ROOT / "flows" / "rag_eval.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def judge(req: Recorded) -> Reply:
    """Answers each RAG judge as a careful one would, from what its prompt holds."""
    prompt = req.body["messages"][1]["content"]
    if "factual claims" in prompt:
        wrong = "15th" in prompt or "home office" in prompt or "Only your manager" in prompt
        verdict = {"claims": [{"claim": "the answer", "supported": not wrong}], "explanation": "x"}
    elif "For each numbered passage" in prompt:
        count = len(re.findall(r"^\[\d+\] ", prompt, re.M))
        verdict = {"passages": [{"passage": str(i + 1), "relevant": i == 0} for i in range(count)],
                   "explanation": "x"}
    elif "Break the gold answer" in prompt:
        verdict = {"statements": [{"statement": "s", "attributed": True}], "explanation": "x"}
    else:
        verdict = {"choice": "D" if "15th" in prompt else "C", "explanation": "x"}
    return 200, {}, completion(json.dumps(verdict), model=req.body["model"])


@pytest.mark.heavy
def test_rag_flow_offline_then_with_judges(prefect_server: str, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    flow = _flow_module().rag_eval
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    offline = flow(results_dir=str(tmp_path), experiment_name="offline", return_state=True)
    assert offline.message.endswith("(LLM judges skipped)")
    assert "pii 9 of 10 rows passed (90.0%)" in offline.message
    assert "LLM judges skipped: OPENAI_BASE_URL is not set" in capsys.readouterr().out
    # The HTML report of a dataset with list-valued columns (the passages) is written too.
    assert (tmp_path / "rag-qa" / "offline" / "report.html").stat().st_size > 10_000

    with serve(judge) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        monkeypatch.setenv("OPENAI_MODEL", "local-judge")
        state = flow(results_dir=str(tmp_path), experiment_name="judged", return_state=True)
    manifest = state.result()
    assert "skipped" not in state.message
    assert "faithfulness 7 of 10 rows passed (70.0%)" in state.message  # three answers invent facts
    assert "factuality 9 of 10 rows passed (90.0%)" in state.message
    # every set is at least half relevant
    assert "context_relevance 10 of 10 rows passed (100.0%)" in state.message
    assert len(server.requests) == 40 and {r.body["model"] for r in server.requests} == {"local-judge"}

    async def task_runs() -> dict[str, str]:
        async with get_client() as client:
            for _ in range(60):  # a task run's state lands a little after the run itself
                runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(
                    id=FlowRunFilterId(any_=[manifest["flow_run_id"]])))
                if all(r.state is not None for r in runs):
                    break
                await asyncio.sleep(0.5)
        # The run's own column: see tests/test_prefect_run.py's _task_runs.
        return {r.name: r.state_name or "" for r in runs if not r.task_key.startswith("span-")}, [
            r for r in runs if r.task_key.startswith("span-")]

    from patronus_tasks.results import load_experiment

    assert load_experiment("judged", tmp_path).wait_recorded(RECORDED_WITHIN)
    runs, spans = asyncio.run(task_runs())
    assert len(runs) == 10 * 9  # the task and eight evaluators per row, each its own task run
    # each judge's model call a task run nested under its evaluator's
    assert len(spans) == 40 and {s.name.rsplit("-", 1)[0] for s in spans} == {"chat local-judge"}
    assert runs["(x) faithfulness-r09"] == "Not passed" and runs["faithfulness-r01"] == "Passed"
    assert runs["context_recall-r05"] == "Passed" and runs["(x) answers-r07"] == "Not passed"

    # The next night the judges' endpoint is down (nothing listens): every judge's verdict
    # is missing. With the gate asked for, the night fails, saying it could not be checked
    # (it was "Unchanged", Completed).
    monkeypatch.setenv("OPENAI_BASE_URL", f"http://127.0.0.1:{_closed_port()}/v1")
    down = flow(results_dir=str(tmp_path), experiment_name="down", fail_on_regression="worse",
                return_state=True)
    assert down.is_failed(), down.message
    assert "could not be checked: no verdict this run from" in down.message
    assert "faithfulness" in down.message


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
