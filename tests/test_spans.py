"""Spans inside tasks and evaluators: recorded with the results, in spans.parquet, kept by
the cache and by a resume; a crash closes them as failed. Local backend: no server."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import pytest

from patronus_tasks import evaluator, run_experiment, span, task, traced
from patronus_tasks.trace import MAX_VALUE_CHARS, Trace

from .conftest import RECORDED_WITHIN

ROWS = [{"sid": "a", "evaluated_model_input": "alpha"},
        {"sid": "b", "evaluated_model_input": "beta"}]


def _run(results_dir: Path, task_: Any, evaluators: list[Any] | None = None, **options: Any) -> Any:
    return run_experiment("spans", data=ROWS, task=task_, evaluators=evaluators or [], backend="local",
                          results_dir=results_dir, print_summary=False, html_report=False,
                          **options)


@traced(kind="tool")
def search(query: str, limit: int = 2) -> list[str]:
    return [f"{query}-{i}" for i in range(limit)]


@traced(kind="retrieval")
async def fetch_doc(doc: str) -> str:
    await asyncio.sleep(0)
    return doc.upper()


@task
async def agent(evaluated_model_input: str) -> str:
    with span("plan", kind="agent", goal=evaluated_model_input) as s:
        hits = await asyncio.to_thread(search, evaluated_model_input)  # a thread: parent kept
        docs = await asyncio.gather(*(fetch_doc(h) for h in hits))
        s.set(output=docs, steps=3)
    return " ".join(docs)


@evaluator
def used_two_docs(trace: Trace) -> bool:
    return len(trace.find(kind="retrieval")) == 2 and trace.tool_calls()[0].name == "search"


def test_spans_nest_across_threads_and_gather_and_land_in_spans_parquet(results_dir: Path) -> None:
    ex = _run(results_dir, agent, [used_two_docs])
    df = ex.to_dataframe()
    assert df["pass"].tolist() == [True, True]  # the evaluator read the task's spans
    spans = ex.spans()
    a = spans[spans["sid"] == "a"].set_index("name", drop=False)
    assert sorted(a["name"]) == ["fetch_doc", "fetch_doc", "plan", "search"]
    plan = a.loc["plan"]
    assert plan["kind"] == "agent" and pd.isna(plan["parent_id"]) and plan["step"] == "agent"
    assert json.loads(plan["attributes"]) == {"goal": "alpha", "steps": 3}
    assert json.loads(plan["output"]) == ["ALPHA-0", "ALPHA-1"]
    assert a.loc["search", "parent_id"] == plan["span_id"]
    assert set(a.loc["fetch_doc", "parent_id"]) == {plan["span_id"]}
    # as given (the SDK's @traced too): the default `limit` nobody passed is left out
    assert json.loads(a.loc["search", "arguments"]) == {"query": "alpha"}
    assert (a["ended_at"] >= a["started_at"]).all() and a["error"].isna().all()
    # the same rows in DuckDB, as a user queries the file
    path = str(ex.location.local / "spans.parquet")
    assert duckdb.sql(f"select count(*) from '{path}' where kind = 'retrieval'").fetchall() == [(4,)]
    _an_earlier_releases_file_reads_as_todays(ex, spans)


def _an_earlier_releases_file_reads_as_todays(ex: Any, spans: pd.DataFrame) -> None:
    """spans.parquet as releases before wrote it (``sample_id``; ``start`` and ``end`` as
    timestamps) reads with today's names and types."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    path = ex.location.local / "spans.parquet"
    table = pq.read_table(path)
    old = {"sid": "sample_id", "started_at": "start", "ended_at": "end"}
    for new, name in old.items():
        column = table[new]
        if new != "sid":
            column = pc.cast(pc.round(pc.multiply(column, 1e6)), pa.int64()).cast(
                pa.timestamp("us", tz="UTC"))
        table = table.set_column(table.column_names.index(new), name, column)
    pq.write_table(table, path)
    again = ex.spans()
    assert list(again.columns) == list(spans.columns) and again["sid"].tolist() == spans["sid"].tolist()
    assert again["started_at"].dtype == "float64"
    assert ((again["started_at"] - spans["started_at"]).abs() < 1e-5).all()


class Forecasts:
    """Tools in a class, as agents are built."""

    @traced(kind="tool", source="met-office")
    def get_weather(self, city: str) -> str:
        """Today's weather in a city."""
        return f"sunny in {city}"

    @traced()  # not a tool: named as the SDK names spans, qualified
    def plan(self, goal: str) -> str:
        return goal


def make_converter() -> Any:
    """A tool made by a factory (a closure)."""
    @traced(kind="tool")
    async def convert(amount: float, to: str) -> str:
        """Convert an amount of money."""
        return f"{amount} {to}"
    return convert


#: What a dataset expects: the tools by the names a model calls them.
EXPECTED_CALLS = [{"name": "get_weather", "arguments": {"city": "Paris"}},
                  {"name": "convert", "arguments": {"amount": 3, "to": "EUR"}}]


def test_a_tool_in_a_class_or_a_factory_is_named_as_the_model_calls_it(results_dir: Path) -> None:
    from patronus_tasks.evaluators import tool_calls_match
    from patronus_tasks.record.otel import span_attributes

    kit, convert = Forecasts(), make_converter()

    @task
    async def direct(evaluated_model_input: str) -> str:
        kit.plan(evaluated_model_input)
        return kit.get_weather("Paris") + await convert(3, to="EUR")

    ex = _run(results_dir, direct, [tool_calls_match(EXPECTED_CALLS)])
    assert ex.to_dataframe()["pass"].tolist() == [True, True]
    spans = ex.spans().query("sid == 'a'").set_index("name")
    assert sorted(spans.index) == ["Forecasts.plan", "convert", "get_weather"]
    assert json.loads(spans.loc["get_weather", "arguments"]) == {"city": "Paris"}  # no self
    assert json.loads(spans.loc["get_weather", "attributes"]) == {"source": "met-office"}
    # OpenTelemetry's gen_ai.tool.name is the same name
    from patronus_tasks.trace import load_spans
    tools = [s for s in load_spans(ex.to_dataframe()["task_spans"].iloc[0]) or [] if s.kind == "tool"]
    assert [span_attributes(s)["gen_ai.tool.name"] for s in tools] == ["get_weather", "convert"]


def test_errors_caps_and_a_span_left_open_by_a_crash(results_dir: Path) -> None:
    @traced(name="lookup", kind="tool")
    def failing(key: str) -> str:
        raise KeyError(key)

    @task
    def crashing(evaluated_model_input: str) -> str:
        span("left-open", kind="custom").__enter__()  # never closed
        with span("big") as s:
            s.set(output="x" * (MAX_VALUE_CHARS * 2))
        if evaluated_model_input == "alpha":
            failing(evaluated_model_input)
        return "ok"

    ex = _run(results_dir, crashing)
    df = ex.to_dataframe().set_index("sid")
    assert df.loc["a", "status"] == "error" and df.loc["b", "status"] == "ok"
    spans = ex.spans()
    a = spans[spans["sid"] == "a"].set_index("name")
    assert a.loc["lookup", "error"] == "KeyError: 'alpha'"
    assert a.loc["left-open", "error"].startswith("left open")
    assert len(a.loc["big", "output"]) == MAX_VALUE_CHARS + 3
    b = spans[spans["sid"] == "b"].set_index("name")
    assert b.loc["left-open", "error"].startswith("left open")  # closed at the call's end


def test_a_timed_out_call_keeps_its_spans_closed_as_failed(results_dir: Path) -> None:
    @task(timeout_seconds=0.2)
    async def slow(evaluated_model_input: str) -> str:
        with span("waiting", kind="tool"):
            await asyncio.sleep(5)
        return "never"

    ex = _run(results_dir, slow)
    spans = ex.spans()
    assert len(spans) == 2
    assert spans["error"].str.startswith("CancelledError").all()


def test_each_repeat_keeps_its_own_spans(results_dir: Path) -> None:
    ex = _run(results_dir, agent, repeats=2)
    spans = ex.spans()
    assert sorted(spans.groupby(["sid", "repeat"]).size().items()) == [
        (("a", 1), 4), (("a", 2), 4), (("b", 1), 4), (("b", 2), 4)]
    assert spans["span_id"].is_unique


def test_a_cached_call_keeps_the_spans_it_recorded(results_dir: Path) -> None:
    calls: list[str] = []

    @task(cache=True)
    def cached(evaluated_model_input: str) -> str:
        calls.append(evaluated_model_input)
        with span("model", kind="llm", model="gpt-4o-mini") as s:
            s.set(input_tokens=1000, output_tokens=100, output="done")
        return "done"

    from patronus_tasks.evaluators import budget

    checks = [budget(max_cost=0.0001, name="cheap"), budget(max_seconds=60, name="quick")]
    first = _run(results_dir, cached, checks)
    again = _run(results_dir, cached, checks)
    # a cached call judged by what it did: its spans' cost and extent, not "free" nor unknown
    for run in (first, again):
        verdicts = run.to_dataframe().groupby("evaluator_name")["pass"].apply(list).to_dict()
        assert verdicts == {"cheap": [False, False], "quick": [True, True]}
    assert calls == ["alpha", "beta"]  # the second run called nothing
    assert again.to_dataframe()["task_cached"].tolist() == [True] * 4
    s1, s2 = first.spans(), again.spans()
    # what they recorded, as this run's spans: new ids, this run's times, marked cached
    same = ["sid", "name", "kind", "model", "input_tokens", "output_tokens", "output"]
    assert s2[same].to_dict("records") == s1[same].to_dict("records")
    assert not set(s2["span_id"]) & set(s1["span_id"]) and (s2["started_at"] > s1["ended_at"].max()).all()
    assert [json.loads(a) for a in s2["attributes"]] == [{"cached": True}] * 2
    # priced at the experiment's prices: 1000 in, 100 out at gpt-4o-mini's
    assert s1["cost"].tolist() == pytest.approx([0.00021, 0.00021])


def test_spans_outside_a_call_record_nothing_and_threads_without_context_are_roots() -> None:
    with span("alone") as s:
        s.set(output=1)
    assert s.sink is None
    seen: list[Any] = []
    thread = threading.Thread(target=lambda: seen.append(span("t").sink))
    thread.start()
    thread.join()
    assert seen == [None]
    time.sleep(0)


def test_on_prefect_each_span_is_a_task_run_nested_under_its_call(prefect_server: str,
                                                                  results_dir: Path) -> None:
    from .test_prefect_run import _task_runs

    @traced(name="lookup", kind="tool")
    def lookup(key: str) -> str:
        if key == "beta":
            raise KeyError(key)
        return key

    @task
    def tooled(evaluated_model_input: str) -> str:
        with span("plan", kind="agent"):
            with span("chat", kind="llm", model="gpt-4o-mini", input_tokens=1000, output_tokens=500):
                pass
            try:
                return lookup(evaluated_model_input)
            except KeyError:
                return "none"

    ex = run_experiment("spans", data=ROWS, task=tooled,
                        results_dir=results_dir, print_summary=False, html_report=False)
    assert ex.wait_recorded(RECORDED_WITHIN)
    runs = {r.name: r for r in asyncio.run(_task_runs(ex.manifest.flow_run_id))}
    assert set(runs) == {"tooled-a", "tooled-b", "plan-a", "plan-b", "lookup-a", "lookup-b",
                         "chat-a", "chat-b"}
    # a model call's task run says its cost (priced as its call ended, before it was sent)
    assert runs["chat-a"].state.message == "gpt-4o-mini · 1000 in / 500 out tokens · $0.000450"
    for sid in "ab":
        parents = {n: [i.id for i in runs[n].task_inputs["__parents__"]]
                   for n in (f"plan-{sid}", f"lookup-{sid}")}
        assert parents == {f"plan-{sid}": [runs[f"tooled-{sid}"].id],
                           f"lookup-{sid}": [runs[f"plan-{sid}"].id]}
        assert runs[f"plan-{sid}"].task_key == "span-agent" and "span:agent" in runs[f"plan-{sid}"].tags
    assert runs["lookup-a"].state_type.value == "COMPLETED"
    assert runs["lookup-b"].state_type.value == "FAILED"  # the span raised; the row went on
    async def logs(name: str) -> list[str]:
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import LogFilter, LogFilterTaskRunId

        async with get_client() as client:
            found = await client.read_logs(LogFilter(task_run_id=LogFilterTaskRunId(
                any_=[runs[name].id])))
            return [log.message for log in found]
    assert asyncio.run(logs("lookup-b")) == ["tool span 'lookup' failed: KeyError: 'beta'"]
    # a model call's page opens on its logs: they say its model, tokens and cost
    assert asyncio.run(logs("chat-a")) == [
        "llm span 'chat': model gpt-4o-mini · 1000 in / 500 out tokens · $0.000450"]
    assert asyncio.run(logs("plan-a")) == []  # no model: nothing to say
    assert runs["tooled-b"].state_type.value == "COMPLETED"
    # a coarser level drops the spans first
    calls_only = run_experiment("spans", data=ROWS, task=tooled, record="calls",
                                results_dir=results_dir, print_summary=False, html_report=False)
    assert calls_only.wait_recorded(RECORDED_WITHIN)
    names = {r.name for r in asyncio.run(_task_runs(calls_only.manifest.flow_run_id))}
    assert names == {"tooled-a", "tooled-b"}
    assert len(calls_only.spans()) == 6  # still in the results


def test_the_html_report_shows_a_rows_spans_as_a_tree(results_dir: Path) -> None:
    from .chromium import Browser, chromium_or_skip

    chromium_or_skip()
    ex = run_experiment("spans", data=ROWS, task=agent, evaluators=[used_two_docs],
                        backend="local", results_dir=results_dir, print_summary=False)
    assert ex.wait_recorded(RECORDED_WITHIN)  # the report is written after the results
    with Browser() as b:
        b.open((ex.path / "report.html").as_uri())
        b.wait_for("document.body.dataset.ready && document.body.dataset.shown")
        b.js("[...document.querySelectorAll('#rows tbody tr')]"
             ".find(tr => tr.innerText.includes('ALPHA-0')).click()")
        b.wait_for("document.querySelector('#detail.shown .spans') && true")
        tree = b.js("[...document.querySelectorAll('#detail .spans .span')]"
                    ".map(d => [d.querySelector('b').textContent, parseInt(d.style.paddingLeft)])")
        text = b.js("document.querySelector('#detail .spans').innerText")
    assert tree == [["plan", 6], ["search", 22], ["fetch_doc", 22], ["fetch_doc", 22]]
    assert "agent" in text and " ms" in text
    # what each call was given and gave back: a trajectory reads as its calls
    assert '{"doc":"alpha-0"} → "ALPHA-0"' in text
    # A run with a task and no evaluator (no evaluator column): its rows open too.
    bare = run_experiment("spans", data=ROWS, task=agent, backend="local", results_dir=results_dir,
                          experiment_name="no-evaluators", print_summary=False)
    with Browser() as b:
        b.open((bare.path / "report.html").as_uri() + "#row=0")
        b.wait_for("document.body.dataset.ready && document.querySelector('#detail.shown .spans') && true")
        count = b.js("document.getElementById('count').textContent")
    assert count.endswith("records"), count  # was: "could not read the records: TypeError..."


def test_retries_odd_attributes_and_mistyped_fields_never_cost_the_row(results_dir: Path) -> None:
    tries: dict[str, int] = {}

    @task(retries=1, retry_delay_seconds=0)
    def flaky(evaluated_model_input: str) -> str:
        tries[evaluated_model_input] = tries.get(evaluated_model_input, 0) + 1
        with span("search", kind="tool", by_id={1: "x"}, huge=2**70) as s:
            s.set(input_tokens=12.5, output_tokens="7", model="m")
        if tries[evaluated_model_input] == 1:
            raise ConnectionError("first attempt fails")
        return "ok"

    seen: list[int] = []

    @evaluator
    def one_search(trace: Trace) -> bool:
        seen.append(len(trace.tool_calls()))
        return True

    ex = _run(results_dir, flaky, [one_search])
    assert ex.to_dataframe()["status"].tolist() == ["ok", "ok"]
    assert seen == [1, 1]  # the evaluators judge the last attempt
    spans = ex.spans()
    attrs = [json.loads(a) for a in spans[spans.sid == "a"]["attributes"]]
    assert attrs == [{"by_id": {"1": "x"}, "huge": str(2**70), "input_tokens": 12.5,
                      "failed_attempt": 1},
                     {"by_id": {"1": "x"}, "huge": str(2**70), "input_tokens": 12.5}]
    assert spans["output_tokens"].tolist() == [7] * 4 and spans["input_tokens"].isna().all()
