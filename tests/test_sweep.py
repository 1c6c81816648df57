"""Sweeps run here, with no Prefect: one limit for every variant's calls, rows interleaved,
task outputs shared, bad input refused before any call, resume, the N-way compare."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from scipy.stats import binomtest
from typer.testing import CliRunner

from patronus_tasks import ConfigError, Task, sweep, task
from patronus_tasks.cli import app

from .sweep_model import graded, loopback, right, rows, says_answer


def _local(results_dir: Path, **options: Any) -> Any:
    options = {"backend": "local", **options}
    return sweep("demo", results_dir=results_dir, print_summary=False, html_report=False,
                 **options)


def test_one_limit_for_every_call_of_every_variant_and_rows_interleaved(results_dir: Path) -> None:
    with loopback(latency=0.05) as (model, answer):
        s = _local(results_dir, data=rows(8), task=answer, evaluators=[right],
                   grid={"model": ["good", "meh", "bad"]}, max_concurrency=4)
    assert s.variants == ["model=good", "model=meh", "model=bad"]
    assert model.count() == 24 and model.most == 4  # the limit reached, never passed
    # Interleaved: each variant's calls overlap the others' in time, and the first half of
    # the calls holds every variant (one after another would hold one or two).
    spans = {m: (min(c[2] for c in model.calls if c[0] == m), max(c[3] for c in model.calls
                                                                    if c[0] == m))
             for m in ("good", "meh", "bad")}
    for a, b in itertools.combinations(spans.values(), 2):
        assert a[0] < b[1] and b[0] < a[1]
    first = sorted(model.calls, key=lambda c: c[2])[:12]
    assert {c[0] for c in first} == {"good", "meh", "bad"}


def test_variants_differing_in_evaluators_share_the_task_s_outputs(results_dir: Path) -> None:
    with loopback() as (model, answer):
        judges = _local(results_dir, data=rows(6), task=answer,
                        variants={"exact": {"evaluators": [right]},
                                  "prefix": {"evaluators": [says_answer]}},
                        sweep_name="judges")
        assert model.count() == 6  # once per row, not once per variant
        # A grid whose task reads only the model: its rubrics share the model's outputs.
        rubric = _local(results_dir, data=rows(6), task=answer, evaluators=[graded],
                        grid={"model": ["good", "meh"], "rubric": ["strict", "lenient"]},
                        sweep_name="rubrics")
    assert model.count("good") == 6 + 6 and model.count("meh") == 6
    outputs = {label: e.to_dataframe().sort_values("sid")["task_output"].tolist()
               for label, e in judges.experiments.items()}
    assert outputs["exact"] == outputs["prefix"]
    # Each keeps the output's tokens, as if it had run alone.
    tokens = [e.manifest.usage[0].input_tokens for e in rubric.experiments.values()]
    assert tokens == [6, 6, 6, 6]
    assert judges.file.shared_calls == 6 and rubric.file.shared_calls == 12
    m = rubric.matrix().set_index("variant")
    assert m.loc["model=meh,rubric=strict", "pass_rate"] == pytest.approx(2 / 6)
    assert m.loc["model=meh,rubric=lenient", "pass_rate"] == pytest.approx(1.0)


def test_the_matrix_counts_and_mcnemar_p_values(results_dir: Path) -> None:
    with loopback() as (_, answer):
        s = _local(results_dir, data=rows(10), task=answer, evaluators=[right],
                   grid={"model": ["meh", "good", "bad"]}, baseline="model=good")
    m = s.matrix().set_index("variant")
    right_of = {"good": set(range(10)), "meh": set(range(4, 10)), "bad": {0, 1}}
    for name, passed in right_of.items():
        row = m.loc[f"model={name}"]
        assert (row["passed"], row["rows"]) == (len(passed), 10)
        if name == "good":
            assert row["verdict"] == "baseline" and row["is_baseline"]
            continue
        worse, better = len(right_of["good"] - passed), len(passed - right_of["good"])
        assert (row["worse"], row["better"]) == (worse, better)
        assert row["p_value"] == pytest.approx(binomtest(worse, worse + better).pvalue)
        assert row["test"] == "McNemar exact" and row["verdict"] == "worse"
    p = sorted(m["p_value"].dropna())  # Holm over the two comparisons
    assert sorted(m["p_adjusted"].dropna()) == pytest.approx([min(1, 2 * p[0]), max(min(1, 2 * p[0]), p[1])])
    assert s.best() is not None and s.best().label == "model=good"  # type: ignore[union-attr]
    assert s.headline().startswith("best: model=good")
    assert s.pareto(cost="latency_p50_s")["variant"].tolist()[0] in s.variants


def test_bad_input_is_an_error_before_any_call(results_dir: Path) -> None:
    @task
    def plain(evaluated_model_input: str) -> str:
        return evaluated_model_input

    with loopback() as (model, answer):
        cases: list[tuple[dict[str, Any], str]] = [
            ({"grid": {"model": ["good"]}, "baseline": "model=best"}, "baseline 'model=best' is not"),
            ({"grid": {"model": ["good"]}, "baseline": {"model": "best"}}, "is not in the grid"),
            ({"grid": {}}, "the grid is empty"),
            ({"grid": {"model": []}}, "grid['model'] is empty"),
            ({"variants": {}}, "variants is empty"),
            ({"grid": {"model": ["good", "good"]}}, "two variants are labelled model=good"),
            ({"grid": {"model": ["good"]}, "task": plain}, "grid key 'model' reaches no step"),
            ({"grid": {"max_concurrency": [1, 2]}}, "'max_concurrency', which is the sweep's"),
            ({"grid": {"model": [object()]}}, "give grid['model'] as a dict of label -> value"),
            ({"grid": {"model": ["good"]}, "experiment_name": "x"}, "sweep() takes no experiment_name"),
            ({"grid": {"model": ["good"]}, "resume": True}, "resume=True needs the sweep"),
            ({"grid": {"model": ["good"]}, "backend": "dask"}, "backend must be 'prefect' or 'local'"),
            ({"variants": {"a": {"model": "good", "tags": {"x": 1}}}}, "tags must map str to str"),
        ]
        for options, said in cases:
            options = {"task": answer, **options}
            with pytest.raises(ConfigError, match=None) as caught:
                _local(results_dir, data=rows(3), evaluators=[right], **options)
            assert said in str(caught.value), (options, str(caught.value))
    assert model.count() == 0
    assert not results_dir.exists() or not any(results_dir.rglob("*.json"))


def test_a_failed_variant_does_not_stop_the_others_and_resume_runs_only_what_is_left(
        results_dir: Path) -> None:
    broken = {"on": True}

    class Flaky(Task):
        def __init__(self, inner: Task) -> None:
            super().__init__("answer")
            self.inner = inner

        async def setup(self) -> None:
            if broken["on"]:
                raise RuntimeError("no such model: weird")

        async def execute(self, evaluated_model_input: str, variant: Any) -> Any:
            return await self.inner.fn(evaluated_model_input=evaluated_model_input, variant=variant)

    with loopback() as (model, answer):
        options = {"data": rows(5), "task": answer, "evaluators": [right], "sweep_name": "nightly",
                   "variants": {"good": {"model": "good"}, "weird": {"model": "meh",
                                                                    "task": Flaky(answer)}}}
        first = _local(results_dir, **options)
        assert first.failed == {"weird": "RuntimeError: no such model: weird"}
        assert list(first.experiments) == ["good"] and model.count() == 5
        assert "failed: weird (RuntimeError: no such model: weird)" in first.headline()
        broken["on"] = False
        again = _local(results_dir, resume=True, **options)
    assert model.count("good") == 5 and model.count("meh") == 5  # only the failed variant ran
    assert list(again.experiments) == ["good", "weird"] and not again.failed
    assert again.location == first.location
    assert again.experiments["good"].location == first.experiments["good"].location
    with pytest.raises(ConfigError, match="the dataset changed since the sweep"):
        _local(results_dir, resume=True, **{**options, "data": rows(4)})


def test_resume_goes_on_with_the_rows_an_interrupt_left(results_dir: Path) -> None:
    calls: list[tuple[str, str]] = []
    interrupted: list[bool] = []

    @task
    async def count(evaluated_model_input: str, variant: Any) -> str:
        calls.append((variant["model"], evaluated_model_input))
        if variant["model"] == "b" and evaluated_model_input == "question 3" and not interrupted:
            interrupted.append(True)
            raise KeyboardInterrupt  # as Ctrl-C, in the middle of the rows
        return "answer " + evaluated_model_input.split()[-1]

    options = {"data": rows(6), "task": count, "evaluators": [right], "sweep_name": "cut",
               "grid": {"model": ["a", "b"]}, "max_concurrency": 1}
    with pytest.raises(KeyboardInterrupt):
        _local(results_dir, **options)
    done = {(e.name.split("=")[-1], sid) for e in _experiments(results_dir)
            for sid in _written_sids(e)}
    first = list(calls)
    s = _local(results_dir, resume=True, **options)
    again = {(m, f"s{q.split()[-1]}") for m, q in calls[len(first):]}
    assert again and not again & done  # nothing done before is called again
    assert all(len(e.to_dataframe()) == 6 for e in s.experiments.values())


def _experiments(results_dir: Path) -> list[Any]:
    from patronus_tasks.results.experiment import Experiment

    return [Experiment(p.parent) for p in results_dir.glob("demo/*/manifest.json")]


def _written_sids(e: Any) -> list[str]:
    from .waits import sids_written

    return sids_written(e.location.local)


def test_compare_takes_any_number_of_runs(results_dir: Path) -> None:
    with loopback() as (_, answer):
        s = _local(results_dir, data=rows(10), task=answer, evaluators=[right, says_answer],
                   grid={"model": ["good", "meh", "bad"]})
    folders = [str(e.path) for e in s.experiments.values()]
    runner = CliRunner()
    shown = runner.invoke(app, ["compare", *folders])
    assert shown.exit_code == 0, shown.output
    assert "Comparing 3 runs against the baseline A=" in shown.stdout
    assert "best:" in shown.stdout and "McNemar exact" in shown.stdout
    gated = runner.invoke(app, ["compare", *folders, "--fail-on-worse"])
    assert gated.exit_code == 1
    assert "got worse" in gated.output
    reversed_ = runner.invoke(app, ["compare", folders[2], folders[0], folders[1], "--fail-on-worse"])
    assert reversed_.exit_code == 0, reversed_.output  # against the worst, none is worse


def test_the_model_call_cache_is_one_for_the_sweep(results_dir: Path) -> None:
    with loopback() as (model, answer):
        options = {"data": rows(4), "task": answer, "evaluators": [right], "cache": True,
                   "grid": {"model": ["good", "meh"]}, "share_outputs": False}
        _local(results_dir, sweep_name="first", **options)
        assert model.count() == 8
        again = _local(results_dir, sweep_name="second", **options)
    assert model.count() == 8  # every call answered from the one cache
    assert all(e.manifest.cached_calls == 8 for e in again.experiments.values())


def test_the_report_shows_hostile_outputs_as_text(results_dir: Path) -> None:
    """An output that would end the page's data element (``</script>``) or turn the HTML
    parser's script escaping on (``<!--<script>``) is text in the report, the page whole."""
    from .chromium import Browser, chromium_or_skip

    chromium_or_skip()
    hostile = "<!--<script>x</script></script><img src=x onerror=\"document.title='pwned'\">"

    @task
    def echo(evaluated_model_input: str, variant: Any) -> str:
        return hostile if variant["mood"] == "bad" else evaluated_model_input

    s = sweep("demo", data=rows(2), task=echo, evaluators=[says_answer], backend="local",
              results_dir=results_dir, print_summary=False, grid={"mood": ["good", "bad"]})
    assert s.wait_recorded(60)
    with Browser() as b:
        b.open(Path(str(s.report_path)).as_uri())
        b.wait_for("document.querySelectorAll('#rows tbody tr').length === 2")
        assert hostile in b.js("document.querySelector('#rows tbody').innerText")
        assert b.js("document.querySelectorAll('img[src=\"x\"]').length") == 0
        assert b.js("document.title") != "pwned"
