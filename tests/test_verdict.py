"""A run's verdict against the previous one, said plainly (patronus_tasks.results.verdict):
"worse" by a drop threshold or by counts, not only by significance; its name, tags and
message; the options that set it; and the state a calling flow ends in."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from patronus_tasks import ConfigError, QualityGateError, Row, evaluator, run_experiment, task
from patronus_tasks.prefect import verdict_state
from patronus_tasks.results.compare import Comparison, EvaluatorComparison
from patronus_tasks.results.summary import EvaluatorStats, Summary
from patronus_tasks.results.verdict import (
    Baseline,
    NotCompared,
    Rule,
    calling_tags,
    judge,
    rule_of,
    said,
)

from .conftest import RECORDED_WITHIN


def moved(name: str, a: float, b: float, worse: int, better: int, p: float = 0.5) -> EvaluatorComparison:
    return EvaluatorComparison(link_index=0, evaluator=name, paired=20, pass_rate_a=a, pass_rate_b=b,
                               pass_diff=b - a, mcnemar_p=p, regressed=[f"w{i}" for i in range(worse)],
                               improved=[f"b{i}" for i in range(better)])


def summary(errors: int = 0) -> Summary:
    stats = EvaluatorStats(0, "judge", 20, 12, 20, 0, 0, 0.6)
    return Summary([stats], samples=20, task_errors=errors, evaluator_errors=0, skipped_tasks=0)


@pytest.mark.parametrize(("e", "rule", "word"), [
    (moved("j", 0.667, 0.333, 3, 0, p=0.25), Rule(), "worse"),  # not significant, still worse
    (moved("j", 0.80, 0.78, 1, 1), Rule(), "same"),  # a wobble: 2 points, as many each way
    (moved("j", 0.80, 0.78, 2, 1), Rule(), "worse"),  # more rows worse than better
    (moved("j", 0.80, 0.74, 3, 3), Rule(drop=0.10), "same"),  # 6 points under a 10-point rule
    (moved("j", 0.80, 0.74, 3, 3), Rule(drop=0.10, per_evaluator={"j": 0.05}), "worse"),
    (moved("j", 0.70, 0.75, 0, 1), Rule(), "better"),
])
def test_worse_better_or_the_same(e: EvaluatorComparison, rule: Rule, word: str) -> None:
    assert rule.movement(e) == word


def test_said_counts_first_then_the_change_then_p() -> None:
    e = moved("result_matches_gold", 2 / 3, 1 / 3, 3, 0, p=0.25)
    assert said(e, Rule()) == ("result_matches_gold worse: 3 worse / 0 better rows; "
                               "66.7% → 33.3% (-33.3 points); p=0.25")


def test_the_verdict_names_tags_and_says_it() -> None:
    comparison = Comparison("night-1", "night-2", [moved("judge", 0.9, 0.6, 6, 0, p=0.03),
                                                   moved("tone", 0.5, 0.6, 0, 2)], 0, 0)
    note = judge(summary(errors=1), comparison, Rule())
    assert (note.name, note.worse, note.better) == ("Regressed", ["judge"], ["tone"])
    assert note.tags == ["regressed", "regressed:judge", "errors"]
    assert note.message.startswith("Regressed: judge worse: 6 worse / 0 better rows; 90.0% → 60.0%")
    assert "vs previous run night-1: tone better: 0 worse / 2 better rows" in note.lines[-1]
    failed = judge(summary(), comparison, Rule(fail_on="worse"))
    assert failed.name == "Gate failed" and failed.tags == ["regressed", "regressed:judge", "gate-failed"]
    assert failed.failures == ["judge [link 0] regressed (worse) against the previous run: "
                               + said(comparison.evaluators[0], Rule())]
    assert judge(summary(), "This is the first run of its series.", Rule()).name == "First run"
    unread = judge(summary(), NotCompared("its results could not be read"), Rule(fail_on="worse"))
    assert (unread.name, unread.tags) == ("Gate failed", ["gate-failed", "not-compared"])
    assert unread.failures == ["fail_on_regression could not be checked: its results could not be read"]
    assert judge(summary(), NotCompared("gone"), Rule()).name == "Not compared"
    from patronus_tasks.prefect.ui.series import headline

    assert headline(NotCompared("gone")) == "not compared: the previous run's results could not be read"
    assert headline("This is the first run of its series.") == "no previous run to compare with"
    assert judge(summary(), None, Rule()).name == "Completed"
    assert judge(summary(errors=2), None, Rule()).tags == ["errors"]


def test_a_regression_against_the_baseline_stays_until_a_run_is_accepted() -> None:
    """Night 2 halved the pass rate; night 3, as broken, is the same as night 2: against
    the baseline (night 1) it stays Regressed, since night 2. Night 4 after night 3 was
    accepted: Unchanged."""
    halved = moved("judge", 2 / 3, 1 / 3, 3, 0, p=0.25)
    night2 = Comparison("night-1", "night-2", [halved], 0, 0)
    second = judge(summary(), night2, Rule(), baseline=Baseline("night-1", "first run", night2,
                                                                previous=True))
    assert (second.name, second.baseline, second.since) == ("Regressed", "night-1", "night-2")
    assert second.message.startswith("Regressed since night-2, against baseline night-1: judge "
                                     "worse: 3 worse / 0 better rows; 66.7% → 33.3%")
    assert not [line for line in second.lines if line.startswith("vs baseline")]  # said once
    same = Comparison("night-2", "night-3", [moved("judge", 1 / 3, 1 / 3, 0, 0)], 0, 0)
    base = Comparison("night-1", "night-3", [halved], 0, 0)
    third = judge(summary(), same, Rule(), baseline=Baseline("night-1", "first run", base,
                                                             since=second.since))
    assert (third.name, third.since, third.worse) == ("Regressed", "night-2", ["judge"])
    assert third.tags == ["regressed", "regressed:judge"] and calling_tags(third) == ["regressed"]
    assert third.message.startswith("Regressed since night-2, against baseline night-1: judge worse")
    assert "vs baseline night-1 (first run): judge worse: 3 worse / 0 better rows" in third.lines[-1]
    gated = judge(summary(), same, Rule(fail_on="worse"), baseline=Baseline("night-1", "accepted", base))
    assert gated.failures == ["judge [link 0] regressed (worse) against the baseline night-1: "
                              + said(halved, Rule())]
    accepted = Comparison("night-3", "night-4", [moved("judge", 1 / 3, 1 / 3, 0, 0)], 0, 0)
    fourth = judge(summary(), accepted, Rule(), baseline=Baseline("night-3", "accepted", accepted,
                                                                  previous=True))
    assert (fourth.name, fourth.tags, fourth.since) == ("Unchanged", [], None)
    # Off Prefect (no previous run known), against an accepted baseline alone.
    alone = judge(summary(), None, Rule(), baseline=Baseline("night-3", "accepted", accepted))
    assert alone.name == "Unchanged"


def test_no_evaluator_in_both_runs_is_not_compared_and_fails_a_gate() -> None:
    """An evaluator renamed between two nights: nothing pairs. It was "Completed" and
    passed fail_on_regression; a gate that could not be checked is no pass."""
    renamed = Comparison("night-1", "night-2", [], 0, 0, only_evaluators_a=["exact"],
                         only_evaluators_b=["exact_match"])
    note = judge(summary(), renamed, Rule(fail_on="worse"))
    assert (note.name, note.tags) == ("Gate failed", ["gate-failed", "not-compared"])
    assert note.failures == ["fail_on_regression could not be checked: no evaluator is in both "
                             "runs (the previous: exact; this one: exact_match)"]
    assert judge(summary(), renamed, Rule()).name == "Not compared"
    assert "Not compared (in one run only): A exact; B exact_match" in renamed.format()


def test_errors_name_a_night_only_when_there_are_more_than_before() -> None:
    """A dataset's known bad row named every night "Errors", so no night read "Unchanged"
    or "Improved"; the errors tag still says there were some."""
    same = Comparison("night-1", "night-2", [moved("judge", 0.6, 0.6, 0, 0)], 0, 0,
                      errors_a=1, errors_b=1)
    note = judge(summary(errors=1), same, Rule())
    assert (note.name, note.tags) == ("Unchanged", ["errors"])
    better = Comparison("night-1", "night-2", [moved("judge", 0.6, 0.7, 0, 2)], 0, 0,
                        errors_a=1, errors_b=1)
    assert judge(summary(errors=1), better, Rule()).name == "Improved"
    more = Comparison("night-1", "night-2", [moved("judge", 0.6, 0.6, 0, 0)], 0, 0,
                      errors_a=1, errors_b=3)
    assert judge(summary(errors=3), more, Rule()).name == "Errors"
    assert judge(summary(errors=1), "This is the first run of its series.", Rule()).name == "Errors"


def test_options_that_set_the_rule() -> None:
    rule = rule_of({"judge": 0.1, "*": 0.02}, "worse")
    assert (rule.drop, rule.drop_for("judge"), rule.fail_on) == (0.02, 0.1, "worse")
    assert rule_of(None, True).fail_on == "significant" and rule_of(0.2, False).fail_on is None
    for threshold, fail_on, message in [(2, False, r"regression_threshold\['\*'\] must be"),
                                        ({"j": -0.1}, False, r"regression_threshold\['j'\]"),
                                        (None, "sometimes", "fail_on_regression must be")]:
        with pytest.raises(ConfigError, match=message):
            rule_of(threshold, fail_on)
    with pytest.raises(ConfigError, match="regression_threshold"):
        run_experiment("rule", data=[{"x": 1}], backend="local", regression_threshold=5)


@task
def answer(row: Row) -> str:
    return str(row.answer)


@evaluator
def right(task_result: Any, evaluated_model_gold_answer: str) -> bool:
    return bool(task_result.evaluated_model_output == evaluated_model_gold_answer)


def night(wrong: int, results_dir: Path, **options: Any) -> Any:
    data = [{"sid": f"s{i:02d}", "evaluated_model_gold_answer": "yes",
             "answer": "no" if i < wrong else "yes"} for i in range(20)]
    return run_experiment("verdict-rule", data=data, task=answer, evaluators=[right],
                          results_dir=results_dir, print_summary=False, html_report=False, **options)


def test_fail_on_regression_worse_fails_a_night_one_row_worse(prefect_server: str,
                                                              results_dir: Path) -> None:
    first = night(0, results_dir, series="verdict-rule-1")
    assert first.wait_recorded(RECORDED_WITHIN) and first.manifest.verdict.name == "First run"
    with pytest.raises(QualityGateError, match=r"right \[link 0\] regressed \(worse\)"):
        night(1, results_dir, series="verdict-rule-1", fail_on_regression="worse")
    # The same night under a looser rule for that evaluator: worse, but nothing fails.
    third = night(2, results_dir, series="verdict-rule-1", regression_threshold={"right": 0.2})
    assert third.wait_recorded(RECORDED_WITHIN)
    assert third.manifest.verdict.name == "Regressed"  # one more row worse than better
    # The previous run's results gone (cleaned up, a store's credentials expired): not a
    # first run, and the regression gate is not passed unchecked.
    import shutil

    shutil.rmtree(third.path)
    with pytest.raises(QualityGateError, match="fail_on_regression could not be checked: the "
                                               "previous run's results at"):
        night(20, results_dir, series="verdict-rule-1", fail_on_regression="worse")
    fourth = night(20, results_dir, series="verdict-rule-2")
    assert fourth.wait_recorded(RECORDED_WITHIN) and fourth.manifest.verdict.name == "First run"


def test_verdict_state_without_prefect_says_the_figures(results_dir: Path) -> None:
    exp = night(3, results_dir, backend="local")
    state = verdict_state(exp)
    assert state.is_completed() and state.name == "Completed"  # Prefect's name: lists filter by it
    assert state.message == ("Completed: 20 rows: right 17 of 20 rows passed (85.0%); task "
                             "errors 0, evaluator errors 0")
    assert state.data == exp.manifest.to_json()


def test_nights_stay_regressed_against_the_baseline_until_one_is_accepted(
        prefect_server: str, results_dir: Path) -> None:
    """Three nights on a real server (good, halved, halved again): the third, the same as
    the second, keeps `regressed` against the series' baseline (its first night) and says
    since the second; `patronus-tasks accept` the third, and a fourth like it is Unchanged."""
    from typer.testing import CliRunner

    from patronus_tasks.cli import app

    series = "verdict-baseline"
    nights = []
    for i, wrong in enumerate((0, 10, 10), 1):  # named: two in one second share a name
        nights.append(night(wrong, results_dir, series=series, experiment_name=f"night-{i}"))
        assert nights[-1].wait_recorded(RECORDED_WITHIN)
    first, second, third = (n.manifest.verdict for n in nights)
    assert (first.name, first.baseline) == ("First run", None)
    assert (second.name, second.baseline, second.since) == ("Regressed", nights[0].name, nights[1].name)
    assert (third.name, third.since) == ("Regressed", nights[1].name)  # night 2 alone: "Unchanged"
    assert {"regressed", "regressed:right"} <= set(third.tags)
    assert third.message.startswith(f"Regressed since {nights[1].name}, against baseline "
                                    f"{nights[0].name}: right worse: 10 worse / 0 better rows")
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(restore_defaults={PREFECT_API_URL}):  # no server named: no throwaway one
        refused = CliRunner().invoke(app, ["accept", str(nights[2].path)])
    assert refused.exit_code == 2 and "no PREFECT_API_URL is set" in refused.stderr
    accepted = CliRunner().invoke(app, ["accept", str(nights[2].path)])
    assert accepted.exit_code == 0, accepted.output
    assert accepted.output.startswith(f"{series}: the baseline is now {nights[2].name}")
    fourth = night(10, results_dir, series=series, experiment_name="night-4")
    assert fourth.wait_recorded(RECORDED_WITHIN)
    note = fourth.manifest.verdict
    assert (note.name, note.baseline, note.since, note.tags) == ("Unchanged", nights[2].name, None, [])
    # compare names the baseline each run was judged against
    shown = CliRunner().invoke(app, ["compare", str(nights[1].path), str(nights[2].path)])
    assert (f"B's verdict: Regressed since {nights[1].name}, against baseline {nights[0].name}"
            in shown.stdout), shown.stdout


def test_off_prefect_a_run_is_accepted_beside_the_results(results_dir: Path) -> None:
    """A run not kept on Prefect: accept keeps its series' baseline in the project's
    results folder (baselines.json), and the next local run is judged against it."""
    from typer.testing import CliRunner

    from patronus_tasks.cli import app

    good = night(0, results_dir, backend="local", experiment_name="good")
    assert good.manifest.verdict is None  # no baseline yet: nothing to judge against
    accepted = CliRunner().invoke(app, ["accept", str(good.path)])
    assert accepted.exit_code == 0, accepted.output
    kept = json.loads((good.path.parent / "baselines.json").read_text())
    assert kept["verdict-rule"]["run"] == good.path.name
    worse = night(4, results_dir, backend="local", experiment_name="worse")
    note = worse.manifest.verdict
    assert (note.name, note.baseline, note.worse) == ("Regressed", "good", ["right"])
    assert verdict_state(worse).message.startswith("Regressed since worse, against baseline good")
