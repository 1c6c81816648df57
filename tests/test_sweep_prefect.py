"""A sweep on a real Prefect server: one flow run, each variant's experiment a subflow run
with its own task runs, tags and parameters; the matrix and the chart as artifacts, the
best variant in its state; a failing variant said; the HTML report in Chromium."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    FlowRunFilter,
    FlowRunFilterTags,
)

from patronus_tasks import Task, sweep
from patronus_tasks.prefect.events import NOT_PASSED_MARK

from .chromium import Browser, chromium_or_skip
from .conftest import RECORDED_WITHIN
from .sweep_model import loopback, right, rows, says_answer
from .waits import task_runs_with_states

# Two nightly sweeps in a flow run, each waiting for its records: ~30-45 s under load.
pytestmark = pytest.mark.heavy

#: A variant's name as an attacker would write it: Markdown and HTML must show it as text.
HOSTILE = "meh <img src=x onerror=alert(1)>|"


class Unknown(Task):
    """A model client whose set-up finds no such model: its variant fails, alone."""

    async def setup(self) -> None:
        raise RuntimeError("no such model: weird-9b")

    async def execute(self, evaluated_model_input: str, variant: Any) -> str:
        return "never"


@pytest.fixture(scope="module")
def swept(prefect_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    results = tmp_path_factory.mktemp("sweep") / "results"
    with loopback() as (_, answer):
        s = sweep("support", data=rows(6), task=answer, evaluators=[right, says_answer],
                  variants={"good": {"model": "good"}, HOSTILE: {"model": "meh"},
                            "weird": {"model": "weird", "task": Unknown("answer")}},
                  sweep_name="nightly", results_dir=results, max_concurrency=4,
                  prices={"good": (1.0, 2.0), "meh": (0.5, 1.0)}, print_summary=False)
        assert s.wait_recorded(RECORDED_WITHIN)
        yield s


async def _children(flow_run_id: str) -> list[Any]:
    async with get_client() as client:
        runs = await client.read_flow_runs(flow_run_filter=FlowRunFilter(
            tags=FlowRunFilterTags(all_=["sweep:nightly"])))
        children = []
        for run in runs:
            if run.parent_task_run_id is None:
                continue
            parent = await client.read_task_run(run.parent_task_run_id)
            if str(parent.flow_run_id) == flow_run_id:
                children.append(run)
        return children


def test_a_sweep_is_one_flow_run_its_variants_subflows_with_their_task_runs(swept: Any) -> None:
    assert swept.failed == {"weird": "RuntimeError: no such model: weird-9b"}
    sweep_id = swept.flow_run_id
    assert sweep_id is not None

    async def read() -> tuple[Any, list[Any], dict[str, list[Any]]]:
        async with get_client() as client:
            run = await client.read_flow_run(sweep_id)
            children = await _children(sweep_id)
            tasks = {c.id: await task_runs_with_states(client, str(c.id)) for c in children}
            return run, children, tasks

    run, children, tasks = asyncio.run(read())
    assert "sweep:nightly" in run.tags and run.state.is_completed()
    assert run.parameters["variants"] == ["good", HOSTILE, "weird"]
    assert run.parameters["baseline"] == "good"
    by_label = {c.parameters["tags"]["variant"]: c for c in children}
    assert set(by_label) == {"good", HOSTILE}  # the failed one made no flow run
    for label, child in by_label.items():
        assert {"sweep:nightly", f"variant:{label}"} <= set(child.tags)
        assert child.parameters["variant"] == {"model": label.split()[0]}
        assert child.state.is_completed()
        # A call per row and step (a verdict that did not pass is marked `NOT_PASSED_MARK`), and the
        # model call's span nested in each task's.
        names = [t.name.removeprefix(NOT_PASSED_MARK) for t in tasks[child.id]]
        steps = sorted(n for n in names if not n.startswith("chat "))
        assert steps == sorted(f"{step}-s{i}" for i in range(6)
                               for step in ("answer", "right", "says_answer"))
        assert sum(n.startswith("chat ") for n in names) == 6
    # Each variant keeps its own series: the next night compares it with its own last one.
    assert {c.parameters["series"] for c in children} == {"support/nightly/good",
                                                         f"support/nightly/{HOSTILE}"}


def _tables(markdown: str) -> list[list[list[str]]]:
    """Each Markdown table, its lines' cells (a ``\\|`` inside a cell is not a column)."""
    tables: list[list[list[str]]] = []
    lines = markdown.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("|"):
            continue
        if i == 0 or not lines[i - 1].startswith("|"):
            tables.append([])
        tables[-1].append(re.split(r"(?<!\\)\|", line)[1:-1])
    return tables


def test_the_sweep_flow_run_shows_the_matrix_the_chart_and_the_best(swept: Any) -> None:
    async def read() -> tuple[Any, list[Any]]:
        async with get_client() as client:
            run = await client.read_flow_run(swept.flow_run_id)
            found = await client.read_artifacts(artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[swept.flow_run_id])))
            return run, list(found)

    run, artifacts = asyncio.run(read())
    assert "best: good" in run.state.message and "failed: weird" in run.state.message
    assert "best:good" in run.tags and "variant-failed" in run.tags
    keyed = {a.key: a for a in artifacts if a.key}
    matrix = next(a for k, a in keyed.items() if "matrix" in k)
    text = str(matrix.data)
    tables = _tables(text)
    assert len(tables) >= 3 and all(len(t[0]) <= 9 for t in tables)
    assert "## right" in text and "## says_answer" in text and "## Failed variants" in text
    # The hostile name is a cell's text: its "|" escaped, so every row keeps its columns.
    assert all(len(line) == len(t[0]) for t in tables for line in t)
    assert "meh \\<img src=x onerror=alert(1)>\\|" in text and "meh <img" not in text  # text, no tag
    assert text.count("](/runs/flow-run/") == 2  # each variant's flow run linked
    pareto = next(a for k, a in keyed.items() if "pareto" in k)
    assert "data:image/png;base64," in str(pareto.data)


def test_the_sweep_report_shows_the_matrix_and_the_rows_side_by_side(swept: Any) -> None:
    chromium_or_skip()
    page = Path(str(swept.report_path))
    assert page.is_file()
    with Browser() as b:
        b.open(page.as_uri())
        b.wait_for("document.querySelectorAll('#rows tbody tr').length === 6")
        matrix = b.js("document.getElementById('matrix').innerText")
        assert "best: good" in matrix and HOSTILE in matrix  # as text, not as an image
        assert b.js("document.querySelectorAll('img[src=\"x\"]').length") == 0
        chart = b.js("[...document.querySelectorAll('#pareto img')].map(i => i.naturalWidth)")
        assert chart and chart[0] > 300
        heads = b.js("[...document.querySelectorAll('#rows th')].map(t => t.textContent)")
        assert heads == ["row", "good (baseline)", HOSTILE]
        b.js("document.getElementById('disagree').click()")  # meh misses questions 0 to 3
        b.wait_for("document.querySelectorAll('#rows tbody tr').length === 4")
        b.js("document.querySelectorAll('#rows td.cell')[1].click()")
        panel = b.wait_for("document.getElementById('panel').className === 'open' && "
                           "document.getElementById('panel-body').innerText")
        assert "no idea" in panel and "right: not passed" in panel
        assert "spans of task" in panel and "chat meh" in panel


def test_the_bundled_nightly_sweep_keeps_each_variant_s_own_series(prefect_server: str,
                                                                  tmp_path: Path) -> None:
    """flows/agent_sweep.py (prefect.yaml's agent-sweep-nightly), offline: its variants
    are local policies; run twice, each variant's second night is compared with its own
    first (not with the others', nor a first run again)."""
    import importlib.util
    import json

    from .conftest import ROOT

    spec = importlib.util.spec_from_file_location("agent_sweep", ROOT / "flows" / "agent_sweep.py")
    assert spec is not None and spec.loader is not None
    flows = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(flows)
    data = tmp_path / "few.jsonl"
    data.write_text("".join(line + "\n" for line in (
        ROOT / "datasets" / "agent_tasks.jsonl").read_text().splitlines()[:3]))
    nights = [flows.agent_sweep(dataset=str(data), results_dir=str(tmp_path / "results"),
                                return_state=True) for _ in range(2)]
    assert all(n.is_completed() and n.message.startswith("best: rules") for n in nights)
    second = sorted((tmp_path / "results" / "agent-sweep").glob("nightly_*-2/manifest.json"))
    assert len(second) == 3  # each policy's second night
    for path in second:
        manifest = json.loads(path.read_text())
        assert manifest["series"] == f"agent-sweep/nightly/{manifest['tags']['variant']}"
        assert manifest["verdict"]["name"] == "Unchanged", manifest["verdict"]
