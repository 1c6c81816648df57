"""What the Prefect UI shows of an experiment, read back through the Prefect API of a real
server: verdicts as task-run states, inputs, the flow run's parameters and final state,
and a series of runs comparing each with the previous one."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    ArtifactFilterKey,
    LogFilter,
    LogFilterFlowRunId,
    LogFilterTaskRunId,
)
from prefect.settings import PREFECT_LOGGING_TO_API_ENABLED, temporary_settings
from prefect.states import Completed, State

from patronus_tasks import (
    EvaluationResult,
    Parent,
    QualityGateError,
    Row,
    TaskResult,
    evaluator,
    run_experiment,
    task,
)
from patronus_tasks.prefect import verdict_state
from patronus_tasks.prefect.ui.artifacts import artifact_key, summary_rows
from patronus_tasks.report.cells import TABLE_BOX_PX, table_px
from patronus_tasks.results.compare import compare_experiments

from .conftest import RECORDED_WITHIN
from .waits import task_runs_with_states

LONG = "the rows differ because " + "of many reasons " * 30


@task
def echo(row: Row) -> str:
    if row.kind == "boom":
        raise ValueError("model down")
    return str(row.text)


@evaluator
def matches(task_result: TaskResult, evaluated_model_gold_answer: str, row: Row) -> EvaluationResult:
    if row.kind == "judge-breaks":
        raise RuntimeError("judge unavailable")
    same = task_result.evaluated_model_output == evaluated_model_gold_answer
    return EvaluationResult(pass_=same, score_raw=float(same), explanation=None if same else LONG)


DATA = [
    {"sid": "q01", "text": "a", "evaluated_model_gold_answer": "a", "kind": "ok"},
    {"sid": "q02", "text": "b", "evaluated_model_gold_answer": "B", "kind": "ok"},
    {"sid": "q03", "text": "c", "evaluated_model_gold_answer": "c", "kind": "boom"},
    {"sid": "q04", "text": "d", "evaluated_model_gold_answer": "d", "kind": "judge-breaks"},
]


async def _task_logs(task_run_ids: list[Any]) -> dict[str, list[str]]:
    async with get_client() as client:
        logs = await client.read_logs(LogFilter(task_run_id=LogFilterTaskRunId(any_=task_run_ids)))
    out: dict[str, list[str]] = {}
    for log in logs:
        out.setdefault(str(log.task_run_id), []).append(log.message)
    return out


async def _read(flow_run_id: str, last_log: str) -> tuple[Any, dict[str, Any], list[str]]:
    """The flow run, its task runs, and its logs once ``last_log`` is among them (Prefect
    ships logs every few seconds)."""
    async with get_client() as client:
        flow_run = await client.read_flow_run(flow_run_id)
        runs = await task_runs_with_states(client, flow_run_id)
        for _ in range(60):
            logs = [log.message for log in await client.read_logs(
                LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))]
            if last_log in logs:
                break
            await asyncio.sleep(0.5)
    return flow_run, {r.name: r for r in runs}, logs


def _shown(run: Any) -> dict[str, str]:
    """A task run's inputs other than its upstream run: name -> the value shown."""
    return {k: v[0].type for k, v in run.task_inputs.items() if k != "wait_for"}


def test_task_runs_say_their_verdict_and_the_flow_run_its_figures(
        prefect_server: str, results_dir: Path) -> None:
    with temporary_settings({PREFECT_LOGGING_TO_API_ENABLED: True}):  # off in the suite
        exp = run_experiment("ui-verdicts", data=DATA, task=echo, evaluators=matches,
                             experiment_name="v1", results_dir=results_dir,
                             print_summary=False, max_concurrency=2, tags={"suite": "ui"})
    assert exp.wait_recorded(RECORDED_WITHIN)
    flow_run, runs, logs = asyncio.run(_read(exp.manifest["flow_run_id"],
                                             f"results: {exp.results_path}"))
    states = {n: (r.state.type.value, r.state.name) for n, r in runs.items()}
    # A verdict that did not pass is marked in its name: the graph and the lists write it.
    assert states == {
        "echo-q01": ("COMPLETED", "Completed"), "matches-q01": ("COMPLETED", "Passed"),
        "echo-q02": ("COMPLETED", "Completed"), "(x) matches-q02": ("COMPLETED", "Not passed"),
        "echo-q03": ("FAILED", "Failed"),
        "echo-q04": ("COMPLETED", "Completed"), "matches-q04": ("FAILED", "Failed"),
    }
    runs["matches-q02"] = runs["(x) matches-q02"]
    assert runs["matches-q01"].state.message == "score 1"
    failed_verdict = runs["matches-q02"].state.message
    assert failed_verdict.startswith("score 0 · the rows differ because of many")
    assert failed_verdict.endswith("…") and len(failed_verdict) < 200
    assert runs["matches-q04"].state.message == "RuntimeError: judge unavailable"
    # A failed verdict or an error logs its whole story on its task run; a pass, nothing.
    logs_of = asyncio.run(_task_logs([r.id for r in runs.values()]))
    assert logs_of[str(runs["matches-q02"].id)] == [f"Not passed (score 0): {LONG}"]
    said, trace = logs_of[str(runs["matches-q04"].id)][0].split("\n", 1)  # a warning: it goes on
    assert said == ("evaluator failed on this row: RuntimeError: judge unavailable (recorded as "
                    "the row's error; the experiment goes on)")
    assert trace.startswith("Traceback (most recent call last):") and 'raise RuntimeError("judge' in trace
    assert trace.endswith("RuntimeError: judge unavailable")
    assert "ValueError: model down" in logs_of[str(runs["echo-q03"].id)][0]
    assert str(runs["matches-q01"].id) not in logs_of
    # A verdict that did not pass carries a tag of its own (the UI's tag filter lists it).
    verdict_tags = {n: sorted(set(r.tags) - {"project:ui-verdicts", "experiment:v1", "suite:ui"})
                    for n, r in runs.items()}
    assert verdict_tags == {n: ["verdict:not-passed"] if "matches-q02" in n else [] for n in runs}
    # Inputs: the sample id and the fields received, never the runner's internals.
    assert _shown(runs["matches-q02"]) == {
        "sid": "q02", "evaluated_model_output": "b", "evaluated_model_gold_answer": "B",
        "text": "b", "kind": "ok"}
    assert _shown(runs["echo-q01"]) == {"sid": "q01", "text": "a",
                                        "evaluated_model_gold_answer": "a", "kind": "ok"}
    # The flow run: real parameters, figures in its final state and last logs.
    assert flow_run.parameters == {
        "project": "ui-verdicts", "experiment_name": "v1", "dataset": "(in memory)",
        "dataset_sha256": exp.info.dataset.sha256, "rows": 4, "tags": {"suite": "ui"},
        "task": "echo", "evaluators": ["matches"], "max_concurrency": 2,
        "series": "ui-verdicts", "fail_on_regression": False}
    message = flow_run.state.message
    assert flow_run.state.is_completed() and flow_run.state.name == "Completed"  # said, tagged
    assert "errors" in flow_run.tags and "regressed" not in flow_run.tags
    # One pass rate, over the judged rows: q03's task failed (not judged), q04's evaluator
    # errored (judged, not passed); said where the rows errored.
    assert message.startswith("Errors: 4 rows: matches 1 of 3 judged rows passed (33.3%); 1 row's "
                              "task failed; 1 evaluation errored (not passed)")
    assert "task errors 1, evaluator errors 1" in message and str(exp.results_path) in message
    last = logs.index(f"results: {exp.results_path}")
    assert logs[last - 3: last + 2] == [
        "matches 1 of 3 judged rows passed (33.3%); 1 row's task failed; 1 evaluation errored "
        "(not passed)", "task errors 1, evaluator errors 1",
        "This is the first run of its series: nothing to compare with yet.",
        f"results: {exp.results_path}", f"Finished in state Completed({message!r})"]


async def _artifacts(series: str, kind: str) -> list[Any]:
    async with get_client() as client:
        return list(await client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[artifact_key(series, kind)]))))


@task
def answer(row: Row) -> str:
    return str(row.answer)


@evaluator
def right(task_result: TaskResult, evaluated_model_gold_answer: str) -> bool:
    return task_result.evaluated_model_output == evaluated_model_gold_answer


@flow(name="ui-nightly")
def nightly(wrong: int, fail_on_regression: bool = False) -> State:
    """Twenty questions, the first ``wrong`` answered wrongly; the flow run ends in the
    state named after the experiment's verdict."""
    data = [{"sid": f"s{i:02d}", "evaluated_model_gold_answer": "yes",
             "answer": "no" if i < wrong else "yes"} for i in range(20)]
    exp = run_experiment("ui-series", data=data, task=answer, evaluators=[right],
                         print_summary=False, fail_on_regression=fail_on_regression)
    return verdict_state(exp)


@pytest.mark.heavy
def test_runs_of_a_flow_form_a_series_compared_run_to_run(
        prefect_server: str, results_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATRONUS_TASKS_RESULTS_DIR", str(results_dir))
    first_state = nightly(wrong=0, return_state=True)
    second_state = nightly(wrong=1, return_state=True)
    first, second = first_state.result(), second_state.result()  # the manifests
    for night in (first, second):
        night["path"] = str(results_dir / "ui-series" / night["experiment_name"])
    with pytest.raises(QualityGateError) as gate:
        nightly(wrong=9, fail_on_regression=True)
    third = gate.value.experiment
    # The calling flow runs say the verdict first in their messages (their tags say it too);
    # one row worse than the night before is "worse", p-value or not.
    assert first_state.message.startswith("First run: ") and second_state.is_completed()
    assert second_state.message.startswith(  # the first night is the series' baseline
        f"Regressed since {second['experiment_name']}, against baseline {first['experiment_name']}: "
        "right worse: 1 worse / 0 better rows; 100.0% → 95.0% (-5.0 points); p=1")
    series = "ui-nightly/ui-series"
    assert third.info.series == series
    summaries = asyncio.run(_artifacts(series, "summary"))
    assert len(summaries) == 3  # one key for the series: its history is the nightly history
    flow_runs = {str(a.flow_run_id) for a in summaries}
    assert flow_runs == {first["flow_run_id"], second["flow_run_id"], third.manifest["flow_run_id"]}
    newest = max(summaries, key=lambda a: a.created)
    assert "right 11 of 20 rows passed (55.0%)" in (newest.description or "")
    # In the nights' order (their flow runs'): a night's post-run can post after the next
    # night's when the machine is loaded, so creation times do not tell.
    order = [first["flow_run_id"], second["flow_run_id"], third.manifest["flow_run_id"]]
    compared = sorted(asyncio.run(_artifacts(series, "vs-previous")),
                      key=lambda a: order.index(str(a.flow_run_id)))
    assert "first run of its series" in compared[0].data
    from patronus_tasks import Experiment

    expected = compare_experiments(Experiment(second["path"]), third).evaluators[0]
    assert expected.pass_diff == pytest.approx(-0.4)
    assert (expected.mcnemar_b, expected.mcnemar_c) == (8, 0)
    table = compared[2].data
    lo, hi = expected.pass_diff_ci
    assert table.split("\n")[2].startswith("**Worse**: right (8 worse / 0 better rows; 95.0% → 55.0%")
    assert (f"| right | worse | 8 / 0 | 95.0% → 55.0% | {expected.pass_diff:+.1%} \\[{lo:+.1%}, "
            f"{hi:+.1%}\\] | {expected.mcnemar_p:.3g} | 20 |") in table  # the counts before the p-value
    previous = f"([its flow run](/runs/flow-run/{second['flow_run_id']}))"
    assert previous in table  # the previous run, a link the UI opens
    assert not re.search(r"\[[^\]]*`[^\]]*\]\(", table)  # the UI shows backticks in links as they are
    regressed = re.findall(r"\[?(s\d\d)\]?(\(/runs/task-run/[0-9a-f-]+\))?",
                           table.split("got worse on:")[1])
    assert [sid for sid, _ in regressed] == [f"s{i:02d}" for i in range(1, 9)]  # s00: wrong both times
    assert "| right | worse | 1 / 0 |" in compared[1].data  # -5 points: worse, not significant
    asyncio.run(_assert_failed(third.manifest["flow_run_id"]))
    _assert_charts(series, third, nights=3)
    asyncio.run(_assert_parent_figures(third, first["experiment_name"], second["experiment_name"]))
    asyncio.run(_assert_tags(first["flow_run_id"], second["flow_run_id"], third))
    assert "## Against the baseline" in table and f"**Regressed since {second['experiment_name']}**" in table
    # The history: one table, the series' runs newest first (the UI lists a key's
    # versions by id only).
    history = max(asyncio.run(_artifacts(series, "history")), key=lambda a: a.created).data
    rows = history if isinstance(history, list) else json.loads(history)
    assert table_px(rows) <= TABLE_BOX_PX  # fits the UI's box at a 1,500 px window (Chromium)
    assert [(r["experiment"], r["right"], r["verdict"]) for r in rows] == [
        (third.name, "55.0% worse", "Gate failed"), (Experiment(second["path"]).name, "95.0% worse",
                                                     "Regressed"),
        (Experiment(first["path"]).name, "100.0%", "First run")]


async def _assert_tags(first: str, second: str, third: Any) -> None:
    """The verdict as tags on the experiments' flow runs and on the flow runs that called
    them: what every list of runs shows."""
    async with get_client() as client:
        runs = {name: await client.read_flow_run(run_id) for name, run_id in (
            ("first", first), ("second", second), ("third", third.manifest["flow_run_id"]))}
        parents = {name: await client.read_flow_run(
            (await client.read_task_run(run.parent_task_run_id)).flow_run_id)
            for name, run in runs.items()}
    for found in (runs, parents):
        assert not {"regressed", "gate-failed"} & set(found["first"].tags)
        assert found["second"].tags[0] == "regressed"  # first: Prefect's v2 UI shows the first that fit
        assert "gate-failed" not in found["second"].tags
        assert {"regressed", "gate-failed"} <= set(found["third"].tags)
    # Each evaluator's tag on the experiment's flow run; on the calling run the verdict's alone
    # (Prefect's v1 UI sorts tags and shows the last that fit: regressed:right pushed it out).
    assert "regressed:right" in runs["second"].tags and "regressed:right" not in parents["second"].tags
    assert runs["second"].state.message.startswith("Regressed since ")
    assert parents["second"].state.message.startswith("Regressed since ")
    assert parents["third"].state.is_failed()  # a failed gate still fails the calling run


def _pictures(markdown: str) -> list[tuple[str, bytes]]:
    return [(alt, base64.b64decode(data)) for alt, data
            in re.findall(r"!\[([^\]]*)\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)", markdown)]


def _assert_charts(series: str, exp: Any, nights: int) -> None:
    """The run's -charts artifact: every chart a PNG inside the markdown, the links, and the
    HTML report it links to written beside the results."""
    charts = max(asyncio.run(_artifacts(series, "charts")), key=lambda a: a.created)
    assert str(charts.flow_run_id) == exp.manifest["flow_run_id"]
    pictures = _pictures(charts.data)
    assert [alt for alt, _ in pictures] == [
        "pass rate per evaluator", "score distribution per evaluator",
        "against the previous run", "the series run by run"]
    assert all(png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5_000 for _, png in pictures)
    assert "[9 verdicts did not pass](/runs?tab=task-runs&tag=verdict%3Anot-passed" in charts.data
    report = exp.path / "report.html"  # a browser follows no file:// link from the UI: the command
    assert report.is_file() and f"`python -m webbrowser {report.resolve().as_uri()}`" in charts.data
    assert "(file:" not in charts.data
    assert len(asyncio.run(_artifacts(series, "history"))) == nights


async def _assert_parent_figures(exp: Any, first: str, second: str) -> None:
    """The flow run that called the experiment shows its figures: an artifact, and as its
    last log lines the figures, each evaluator against the previous run, the verdict."""
    async with get_client() as client:
        child = await client.read_flow_run(exp.manifest["flow_run_id"])
        parent = (await client.read_task_run(child.parent_task_run_id)).flow_run_id
        found = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[parent])))
        logs = [log.message for log in await client.read_logs(
            LogFilter(flow_run_id=LogFilterFlowRunId(any_=[parent])))]
    ours = [a for a in found if a.type == "markdown"]  # (Prefect keeps the failure's result too)
    assert len(ours) == 1 and "right 11 of 20 rows passed (55.0%)" in ours[0].data
    assert f"/runs/flow-run/{child.id}" in ours[0].data and len(_pictures(ours[0].data)) == 1
    title = f"ui-series/{exp.name}"
    mine = [i for i, line in enumerate(logs) if line.startswith(title)]
    assert [logs[i] for i in mine] == [
        f"{title}: right 11 of 20 rows passed (55.0%)", f"{title}: task errors 0, evaluator errors 0",
        f"{title}: vs previous run {exp.manifest['verdict']['lines'][2].split('vs previous run ')[1]}",
        f"{title}: vs baseline {exp.manifest['verdict']['lines'][3].split('vs baseline ')[1]}",
        f"{title}: verdict: Gate failed since {second}, against baseline {first} "
        "(regressed, regressed:right, gate-failed)"]
    assert "right worse: 8 worse / 0 better rows; 95.0% → 55.0% (-40.0 points); p=0.0078" in logs[mine[2]]
    assert f"vs baseline {first} (first run): right worse: 9 worse / 0 better rows" in logs[mine[3]]
    # Ours are the last lines but Prefect's own (the flow's failure, its end).
    assert all(not line.startswith("ui-series/") for line in logs[mine[-1] + 1:])
    assert mine == list(range(mine[0], mine[0] + 5))


async def _assert_failed(flow_run_id: str) -> None:
    async with get_client() as client:
        run = await client.read_flow_run(flow_run_id)
    assert run.state.is_failed() and run.state.message.startswith("Gate failed since ")
    assert ": quality gate failed: " in run.state.message
    assert ("right [link 0] regressed (significantly) against the previous run: right worse: "
            "8 worse / 0 better rows; 95.0% → 55.0% (-40.0 points); p=0.0078") in run.state.message
    assert "right 11 of 20 rows passed (55.0%)" in run.state.message


def test_tables_read_as_percentages_and_counts(prefect_server: str, results_dir: Path) -> None:
    exp = run_experiment("ui-tables", data=DATA, task=echo, evaluators=[matches],
                         experiment_name="t", results_dir=results_dir, print_summary=False)
    assert exp.wait_recorded(RECORDED_WITHIN)  # the artifacts follow the results
    table = asyncio.run(_artifacts("ui-tables", "summary"))[0].data
    rows = table if isinstance(table, list) else json.loads(table)
    assert rows == [{"evaluator": "matches", "pass rate": "33.3%", "passed": "1/3",
                     "mean score": "0.5 (0 to 1)", "results": 2, "errors": "1",
                     "task errors": 1, "skips": "0"}]
    assert table_px(rows) <= TABLE_BOX_PX  # fits the UI's box at a 1,500 px window (Chromium)
    report = asyncio.run(_artifacts("ui-tables", "report"))[0].data
    assert "| evaluator | pass rate | passed |" in report  # the summary as a table
    assert "| matches | 33.3% | 1/3 |" in report
    assert LONG[:55] in report and LONG not in report and "…" in report  # cut: v1 does not wrap
    assert exp.info.series == "ui-tables"


@task
def again(parent: Parent) -> str:
    return str(parent.task.evaluated_model_output)


def test_the_link_column_shows_only_for_a_chain(results_dir: Path) -> None:
    def rows(**chain: Any) -> list[dict[str, Any]]:
        exp = run_experiment("ui-links", data=DATA[:2], backend="local", results_dir=results_dir,
                             print_summary=False, **chain)
        return summary_rows(exp.summary())

    single = rows(task=echo, evaluators=[matches])
    assert "link" not in single[0] and single[0]["evaluator"] == "matches"
    chained = rows(chain=[{"task": echo, "evaluators": [matches]},
                          {"task": again, "evaluators": [matches]}])
    assert [(r["link"], r["evaluator"], r["pass rate"]) for r in chained] == [
        (0, "matches", "50.0%"), (1, "matches", "50.0%")]


def test_a_judge_stopped_by_its_timeout_is_shown_timed_out() -> None:
    from patronus_tasks.prefect.ui.display import _failed

    assert _failed("JudgeError", "evaluator 'j' timed out after 2 s (timeout_seconds): no verdict"
                   ).name == "TimedOut"
    assert _failed("JudgeError", "judge 'm' refused: 'no'").name == "Failed"


def test_a_second_run_of_a_name_is_tagged_and_linked_apart(results_dir: Path) -> None:
    """Two runs named try-1 (folders try-1 and try-1-2) carried one experiment tag, so the
    findings link of either listed both runs' findings (18 for 9)."""
    from patronus_tasks.execute.setup import make_spec
    from patronus_tasks.prefect.ui import links

    first = run_experiment("tags", data=DATA, evaluators=matches, experiment_name="try-1",
                           backend="local", results_dir=results_dir, print_summary=False,
                           html_report=False)
    spec = make_spec("tags", data=DATA, evaluators=matches, experiment_name="try-1",
                     results_dir=results_dir)
    assert spec.out_dir.name == "try-1-2" and "run:try-1-2" in spec.prefect_tags
    assert "experiment:try-1" in spec.prefect_tags
    second = run_experiment("tags", data=DATA, evaluators=matches, experiment_name="try-1",
                            backend="local", results_dir=results_dir, print_summary=False,
                            html_report=False)
    assert "tag=run%3Atry-1-3" in links.findings(second) and "run%3A" not in links.findings(first)


#: The tags shown (not counted in a "+N") in the row of the run named (%r): Prefect's two
#: UIs cut a run's tags to what fits (v2 keeps the first, v1 sorts them, keeps the last).
_VISIBLE_TAGS = """(() => {
  const name = [...document.querySelectorAll('a, span, div')].find(e => e.children.length == 0
      && e.textContent.trim() == %r);
  let row = name;
  while (row && !row.querySelector('[data-slot=tag-badge-group], .p-tag-wrapper')) row = row.parentElement;
  if (!row) return null;
  const group = row.querySelector('[data-slot=tag-badge-group], .p-tag-wrapper');
  const shown = [...group.querySelectorAll('[data-slot=tag-badge-group-item], .p-tag-wrapper__tag')]
    .filter(e => e.getBoundingClientRect().width > 0 && !e.closest('[data-slot=tag-badge-group-measure]')
                 && !/p-tag-wrapper__tag--(hidden|invisible)/.test(e.className))
    .map(e => e.innerText.trim());
  return shown.length || group.innerText.includes('+') ? shown : null;
})()"""


def test_a_regressed_night_shows_its_verdict_tag_on_the_deployment_page_at_1280_px(
        prefect_server: str, tmp_path: Path) -> None:
    """A nightly deployment's run tagged as a regressed night is (`add_tags` with
    `calling_tags`), on its deployment's page at 1,280 px in both of Prefect's UIs: the
    `regressed` tag is among those shown, not in the "+N" (it was at 1,280 and 1,500 px:
    v2 showed the deployment's tags first, v1 the last after sorting)."""
    from .chromium import Browser, chromium_or_skip
    from .test_security import _UI

    chromium_or_skip()
    deployment = asyncio.run(_a_regressed_night())
    ui = _UI(prefect_server)
    try:
        with Browser(1280, 1000) as b:
            for name, base in (("v2", "/v2"), ("v1", "")):
                b.open(f"{ui.url}{base}/deployments/deployment/{deployment}")
                shown = b.wait_for(_VISIBLE_TAGS % NIGHT)
                time.sleep(0.5)  # the group measures itself once drawn: read it again then
                shown = b.js(_VISIBLE_TAGS % NIGHT)
                b.screenshot(tmp_path / f"{name}-deployment-1280.png")
                assert "regressed" in shown, (name, shown)
    finally:
        ui.close()


#: A nightly's run name (`experiment_flow_run_name`).
NIGHT = "text-to-sql @ 11-28 02:00"


async def _a_regressed_night() -> str:
    """A deployment of the bundled nightly's tags and a run of it, Completed, tagged by the
    verdict of a regressed night with errors as the recorder tags the calling run."""
    from patronus_tasks.prefect.flowruns import add_tags
    from patronus_tasks.record.manifest import VerdictNote
    from patronus_tasks.results.verdict import calling_tags

    note = VerdictNote(name="Regressed", message="", tags=[
        "regressed", "regressed:result_matches_gold", "regressed:same_query", "errors"])
    async with get_client() as client:
        flow = await client.create_flow_from_name("text-to-sql-eval")  # the bundled flow's name
        deployment = await client.create_deployment(flow, f"nightly-{uuid.uuid4().hex[:8]}",
                                                    tags=["patronus-tasks", "eval:text-to-sql"])
        run = await client.create_flow_run_from_deployment(
            deployment, name=NIGHT, tags=["auto-scheduled"])
        await client.set_flow_run_state(run.id, Completed(), force=True)
        await add_tags(client, str(run.id), calling_tags(note))
    return str(deployment)
