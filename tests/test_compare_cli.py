"""compare_experiments and the command line: list, show, compare, export, run, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from patronus_tasks import ConfigError, Row, evaluator, run_experiment
from patronus_tasks.cli import app
from patronus_tasks.results.compare import compare_experiments
from patronus_tasks.results.store import list_experiments, load_experiment
from patronus_tasks.results.verdict import Rule, said

from .conftest import ROOT


@evaluator
def exact(row: Row) -> bool:
    return row.evaluated_model_output == row.evaluated_model_gold_answer


@evaluator
def closeness(row: Row) -> float:
    return float(row.s)


def _data(passing: set[int], bump: float) -> list[dict[str, object]]:
    return [{"sid": f"s{i:02d}", "evaluated_model_gold_answer": "g",
             "evaluated_model_output": "g" if i in passing else "wrong", "s": 0.5 + bump * (i % 2)}
            for i in range(1, 41)]


@pytest.fixture
def two_runs(results_dir: Path) -> tuple[Path, Path]:
    a = run_experiment("cmp", data=_data(set(range(1, 31)), 0.0), evaluators=[exact, closeness],
                       experiment_name="base", backend="local", results_dir=results_dir,
                       print_summary=False)
    passing_b = set(range(1, 26)) | {31, 32, 33}
    b = run_experiment("cmp", data=_data(passing_b, 0.2), evaluators=[exact, closeness],
                       experiment_name="cand", backend="local", results_dir=results_dir,
                       print_summary=False)
    return a.path, b.path


def test_compare_finds_known_regressions_and_statistics(two_runs: tuple[Path, Path]) -> None:
    a, b = (load_experiment(p) for p in two_runs)
    result = compare_experiments(a, b)
    by = {e.evaluator: e for e in result.evaluators}
    ex = by["exact"]
    assert ex.paired == 40 and (ex.mcnemar_b, ex.mcnemar_c) == (5, 3)
    assert ex.regressed == [f"s{i}" for i in range(26, 31)]
    assert ex.improved == ["s31", "s32", "s33"]
    assert ex.pass_rate_a == 30 / 40 and ex.pass_rate_b == 28 / 40
    assert ex.pass_diff == pytest.approx(-2 / 40)
    assert ex.mcnemar_statistic == pytest.approx((abs(5 - 3) - 1) ** 2 / 8)
    from scipy.stats import binomtest  # here: importing it costs every test process ~1.2 s

    assert ex.mcnemar_p == pytest.approx(binomtest(3, 8, 0.5).pvalue)
    lo, hi = ex.pass_diff_ci  # type: ignore[misc]
    assert lo < -2 / 40 < hi
    cl = by["closeness"]
    assert cl.mean_diff == pytest.approx(0.1)  # half the rows gained 0.2
    assert cl.mean_diff_ci[0] > 0 and cl.score_p < 0.05  # type: ignore[index,operator]
    assert cl.regressed == [] and len(cl.improved) == 20
    assert result.has_regressions and result.only_in_a == result.only_in_b == 0
    assert compare_experiments(a, b).evaluators == result.evaluators  # seeded: repeatable


def test_compare_and_report_take_names_as_the_cli_does(two_runs: tuple[Path, Path],
                                                       results_dir: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from patronus_tasks.report import write_report

    monkeypatch.setenv("PATRONUS_TASKS_RESULTS_DIR", str(results_dir))
    by_name = compare_experiments("base", "cmp/cand")
    assert (by_name.a, by_name.b) == ("base", "cand")
    assert by_name.evaluators == compare_experiments(*(load_experiment(p) for p in two_runs)).evaluators
    # Beside the run's own report.html, not over it (as `patronus-tasks report --against`).
    where = write_report("cand", against="base")
    assert where == two_runs[1] / "report-vs-base.html" and "s26" in Path(where).read_text()
    with pytest.raises(ConfigError, match="expected an Experiment"):
        compare_experiments(3, "base")  # type: ignore[arg-type]
    again = run_experiment("cmp", data=_data(set(range(1, 31)), 0.0), evaluators=[exact],
                           experiment_name="base", backend="local", results_dir=results_dir,
                           print_summary=False, html_report=False)
    assert compare_experiments(two_runs[0], again).b == "base (base-2)"  # not both "base"


def test_cli_list_show_compare_export(two_runs: tuple[Path, Path], results_dir: Path,
                                      tmp_path: Path) -> None:
    runner = CliRunner()
    rd = ["--results-dir", str(results_dir)]
    listed = runner.invoke(app, ["list", *rd])
    assert listed.exit_code == 0
    assert "cmp/base" in listed.stdout and "cmp/cand" in listed.stdout
    assert "exact 75%" in listed.stdout and "rows=40" in listed.stdout
    shown = runner.invoke(app, ["show", "cand", "--failures", *rd])
    assert shown.exit_code == 0 and "Pass rate : 70.0%  (28/40)" in shown.stdout
    assert "sid=s26 link=0 exact: failed" in shown.stdout
    latest = runner.invoke(app, ["show", "cmp", *rd])  # a project: its latest run
    assert latest.exit_code == 0 and "Experiment cmp/cand" in latest.stdout
    cmp = runner.invoke(app, ["compare", "base", "cmp/cand", *rd])
    assert cmp.exit_code == 0
    assert "regressed (5): s26, s27, s28, s29, s30" in cmp.stdout
    # What got worse first, the counts before the p-value.
    said = cmp.stdout.split("\n\n")[0].splitlines()
    assert said[0].startswith("Comparing B=cand against A=base")  # which runs, first
    assert any(line.startswith("exact [link 0] worse: 5 worse / 3 better rows; 75.0% → 70.0% "
                               "(-5.0 points); p=") for line in said), said
    assert "closeness [link 0] better: 0 worse / 20 better rows; mean 0.5 → 0.6 (+0.1); p=0" in said
    assert "McNemar b=5 c=3" in cmp.stdout
    assert "pass rate  A 75.0%  B 70.0%  diff -5.0% [" in cmp.stdout  # rates unsigned, diffs signed
    # The gates of an experiment's fail_on_regression: 5 worse / 3 better rows is worse by
    # the drop rule (-5 points), and far from significant (p=0.73); no single row decides.
    worse = runner.invoke(app, ["compare", "base", "cand", "--fail-on-worse", *rd])
    assert worse.exit_code == 1 and "gate failed: exact [link 0] got worse" in worse.stderr
    not_significant = runner.invoke(app, ["compare", "base", "cand", "--fail-on-regression", *rd])
    assert not_significant.exit_code == 0, not_significant.stderr
    # Back the other way, closeness falls on 20 rows by 0.2 (p < 0.05): significant.
    significant = runner.invoke(app, ["compare", "cand", "base", "--fail-on-regression", *rd])
    assert significant.exit_code == 1
    assert "gate failed: closeness [link 0] regressed significantly" in significant.stderr
    both = runner.invoke(app, ["compare", "cand", "base", "--fail-on-regression", "--fail-on-worse", *rd])
    assert both.exit_code == 1 and "closeness [link 0] regressed significantly" in both.stderr
    assert "closeness [link 0] got worse" in both.stderr and "exact" not in both.stderr
    same = runner.invoke(app, ["compare", "base", "base", "--fail-on-regression", "--fail-on-worse", *rd])
    assert same.exit_code == 0
    out = tmp_path / "cand.jsonl"
    exported = runner.invoke(app, ["export", "cand", "--format", "jsonl", "-o", str(out), *rd])
    assert exported.exit_code == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 80 and {"sid", "pass", "score"} <= set(records[0])
    csv = runner.invoke(app, ["export", str(two_runs[0]), "--format", "csv"])
    assert csv.exit_code == 0 and csv.stdout.count("\n") == 81
    assert [e.name for e in list_experiments(results_dir)] == ["base", "cand"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["show", "nope"], "no experiment 'nope'"),
        (["export", "base", "--format", "xml"], "--format must be csv or jsonl"),
        (["run", "missing.py"], "missing.py: no such file"),
        (["run", "x.py", "--min-pass-rate", "exact"], "write EVALUATOR=RATE"),
        (["run", str(ROOT / "README.md")], "README.md: not a Python file"),
        (["compare", "base", "cand", "--drop", "5"], "--drop must be a fall from 0 to 1"),
        (["list", "--results-dir", "s3://no-such-bucket/x?endpoint_override=127.0.0.1:9&scheme=http"],
         "cannot be listed"),
    ],
)
def test_cli_usage_errors_exit_2(two_runs: tuple[Path, Path], results_dir: Path,
                                 args: list[str], message: str) -> None:
    given = [] if "--results-dir" in args else ["--results-dir", str(results_dir)]
    result = CliRunner().invoke(app, [*args, *given])
    assert result.exit_code == 2 and message in " ".join(result.stderr.split()), result.stderr


def test_cli_run_against_a_prefect_api_that_does_not_answer(tmp_path: Path) -> None:
    """After `server down`, PREFECT_API_URL still set: said before anything runs, with the
    fix and the usage exit code (a traceback and exit 1, a gate's code, before)."""
    import os
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/api"
    env = {**os.environ, "PREFECT_API_URL": url, "PREFECT_HOME": str(tmp_path / "home")}
    ran = subprocess.run([sys.executable, "-m", "patronus_tasks", "run", "flows/text_to_sql.py"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    said = " ".join(ran.stderr.split())
    assert ran.returncode == 2, ran.stderr[-2000:]
    assert f"the Prefect API at {url} does not answer" in said and "patronus-tasks server up" in said
    assert "Traceback" not in ran.stderr


RUNNABLE = """
from patronus_tasks import evaluator, run_experiment

@evaluator
def nonempty(evaluated_model_output: str) -> bool:
    return evaluated_model_output != ""

def main(dataset: str, experiment_name: str = "cli", results_dir: str | None = None):
    return run_experiment("cli", data=dataset, evaluators=[nonempty], backend="local",
                          experiment_name=experiment_name, results_dir=results_dir)
"""


@pytest.mark.heavy
def test_cli_run_with_gates(tmp_path: Path) -> None:
    script = tmp_path / "exp.py"
    script.write_text(RUNNABLE)
    data = tmp_path / "d.jsonl"
    data.write_text('{"evaluated_model_output": "a"}\n{"evaluated_model_output": ""}\n')
    base = [sys.executable, "-m", "patronus_tasks", "run", f"{script}:main", "--data", str(data),
            "--results-dir", str(tmp_path / "r")]

    ok = subprocess.run([*base, "--min-pass-rate", "nonempty=0.5", "--experiment-name", "first"],
                        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "Pass rate : 50.0%  (1/2)" in ok.stdout and "2/2" in ok.stderr  # the progress bar

    def cli(*extra: str) -> Any:  # the same command in this process (spares ~1.5 s each)
        return CliRunner().invoke(app, [*base[3:], *extra])

    low = cli("--min-pass-rate", "nonempty=0.9")
    assert low.exit_code == 1
    assert "gate failed: cli: nonempty [link 0]: pass rate 50.0% is below 90.0%" in low.stderr
    unknown = cli("--min-pass-rate", "judge=0.9")
    assert unknown.exit_code == 1 and "judge: no experiment that ran has this evaluator" in unknown.stderr
    bad = cli("--max-concurrency", "3")
    assert bad.exit_code == 2 and "takes no max_concurrency parameter" in bad.stderr


RESUMABLE = """
import sys
from patronus_tasks import evaluator, run_experiment

CALLS = open(sys.argv[-1], "a")

@evaluator
def counted(row) -> bool:
    CALLS.write(row.sid + "\\n")
    return True

def main(dataset: str, results_dir: str, resume: bool = False, retry_errors: bool = False):
    return run_experiment("cli-resume", data=dataset, evaluators=[counted], backend="local",
                          experiment_name="again", results_dir=results_dir, resume=resume,
                          retry_errors=retry_errors)
"""


NO_RESUME_PARAMETER = RESUMABLE.replace(
    "def main(dataset: str, results_dir: str, resume: bool = False, retry_errors: bool = False):",
    "def main(dataset: str, results_dir: str):").replace(
    ", resume=resume,\n                          retry_errors=retry_errors)", ")")


@pytest.mark.heavy
def test_cli_resume_reaches_the_experiments_of_a_function_without_it(tmp_path: Path) -> None:
    script = tmp_path / "exp.py"
    script.write_text(NO_RESUME_PARAMETER.replace("sys.argv[-1]", repr(str(tmp_path / "calls.txt"))))
    assert "resume=" not in NO_RESUME_PARAMETER
    data = tmp_path / "d.jsonl"
    data.write_text('{"x": 1}\n{"x": 2}\n')
    args = ["run", f"{script}:main", "--data", str(data), "--results-dir", str(tmp_path / "r")]
    first = subprocess.run([sys.executable, "-m", "patronus_tasks", *args], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)  # its calls written
    assert first.returncode == 0, first.stderr
    again = CliRunner().invoke(app, [*args, "--resume"])  # in this process: spares ~1.5 s
    assert again.exit_code == 0, again.stderr
    assert (tmp_path / "calls.txt").read_text().split() == ["1", "2"]  # resumed: no new calls


@pytest.mark.heavy
def test_cli_run_resume_passes_through(tmp_path: Path) -> None:
    script = tmp_path / "exp.py"
    script.write_text(RESUMABLE.replace("sys.argv[-1]", repr(str(tmp_path / "calls.txt"))))
    data = tmp_path / "d.jsonl"
    data.write_text('{"x": 1}\n{"x": 2}\n')
    base = [sys.executable, "-m", "patronus_tasks", "run", f"{script}:main", "--data", str(data),
            "--results-dir", str(tmp_path / "r")]
    first = subprocess.run(base, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    for extra in (["--resume"], ["--retry-errors"]):  # in this process: spares ~1.5 s each
        again = CliRunner().invoke(app, [*base[3:], *extra])
        assert again.exit_code == 0, again.stderr
    assert (tmp_path / "calls.txt").read_text().split() == ["1", "2"]  # resumed: no new calls
    assert [p.name for p in (tmp_path / "r" / "cli-resume").iterdir()] == ["again"]


def test_a_runners_gates_go_into_the_experiments_that_can_take_them(tmp_path: Path) -> None:
    from patronus_tasks.execute.setup import make_spec
    from patronus_tasks.run.options import giving

    @evaluator
    def nonempty(evaluated_model_output: str) -> bool:
        return bool(evaluated_model_output)

    data = [{"evaluated_model_output": "a"}]
    run_experiment("p", data=data, evaluators=[nonempty], backend="local", results_dir=tmp_path,
                   experiment_name="e", print_summary=False, html_report=False)  # to resume

    def spec(**options: Any) -> Any:
        return make_spec("p", data=data, evaluators=[nonempty], backend="local",
                         results_dir=tmp_path, experiment_name="e", **options)

    with giving(min_pass_rates={"nonempty": 0.9, "judge": 0.5}, min_metrics={"f1": 0.8},
                resume=True):
        looser, stricter = spec(min_pass_rates={"nonempty": 0.5}), spec(min_pass_rates={"nonempty": 0.95})
        fresh = spec(resume=False)  # a baseline the flow starts fresh on purpose
    # Of the command's gate and the experiment's own on one evaluator the stricter holds;
    # one naming an evaluator the experiment lacks is not its gate; the metric gates wait
    # for the metrics computed (`execute.run._metric_gates`).
    assert looser.min_pass_rates == {"nonempty": 0.9} and stricter.min_pass_rates == {"nonempty": 0.95}
    assert looser.min_metrics == {} and looser.given_min_metrics == {"f1": 0.8}
    assert looser.replay == "resume" and fresh.replay is None
    outside = spec()
    assert outside.min_pass_rates == {} and outside.given_min_metrics == {} and outside.replay is None


def test_a_runners_metric_gate_fails_only_the_experiment_computing_it(tmp_path: Path) -> None:
    from patronus_tasks import QualityGateError
    from patronus_tasks.metrics import accuracy_by
    from patronus_tasks.run.options import giving

    @evaluator
    def is_a(evaluated_model_output: str) -> bool:
        return evaluated_model_output == "a"

    data = [{"evaluated_model_output": o, "g": "x"} for o in ("a", "b")]
    kwargs: dict[str, Any] = dict(data=data, evaluators=[is_a], backend="local",
                                  results_dir=tmp_path, print_summary=False, html_report=False)
    with giving(min_metrics={"accuracy[g=x]": 0.9}):
        run_experiment("no-metrics", **kwargs)  # computes no such metric: not its gate
        with pytest.raises(QualityGateError, match=r"accuracy\[g=x\]: 0.5 is below 0.9"):
            run_experiment("with-metrics", metrics=[accuracy_by("g")], **kwargs)


@pytest.mark.heavy
def test_the_main_flow_gated_and_resumed_through_the_cli(
        prefect_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's main flow from the command line with a gate it misses and `--resume`
    (which the flow takes no parameter for: its experiments are given it): the command
    exits 1, and the experiment's flow run, which the UI shows, ends Failed too."""
    import asyncio

    from prefect.client.orchestration import get_client

    monkeypatch.chdir(ROOT)  # the flow's dataset path is the repository's
    monkeypatch.setenv("PATRONUS_TASKS_RESULTS_DIR", str(tmp_path))
    out = CliRunner().invoke(app, ["run", str(ROOT / "flows" / "text_to_sql.py"), "--resume",
                                   "--experiment-name", "gated",
                                   "--min-pass-rate", "result_matches_gold=0.99"])
    assert out.exit_code == 1, out.stderr
    assert "gate failed: gated: result_matches_gold [link 0]: pass rate" in out.stderr
    manifest = json.loads((tmp_path / "text-to-sql" / "gated" / "manifest.json").read_text())

    async def state() -> Any:
        async with get_client() as client:
            return (await client.read_flow_run(manifest["flow_run_id"])).state

    assert asyncio.run(state()).type.value == "FAILED"


def test_rows_whose_task_failed_count_as_worse_never_left_out(results_dir: Path) -> None:
    """A model that crashes on rows is a regression: each evaluation of such a row is
    not passed (they were left out: a run whose every task failed compared 'same', and
    `--fail-on-worse` let it through)."""
    from patronus_tasks import task

    def answering(broken: set[int]) -> Any:
        @task
        def answer(row: Row) -> str:
            if int(row.sid) in broken:
                raise RuntimeError("model API 500")
            return "g"
        return answer

    @evaluator
    def exact(evaluated_model_output: str, evaluated_model_gold_answer: str) -> bool:
        return evaluated_model_output == evaluated_model_gold_answer

    data = [{"sid": str(i), "evaluated_model_gold_answer": "g"} for i in range(1, 6)]
    runs = {name: run_experiment("crash", data=data, task=answering(broken), evaluators=[exact],
                                 experiment_name=name, backend="local", results_dir=results_dir,
                                 print_summary=False, html_report=False).path
            for name, broken in (("base", set()), ("some", {1, 2}), ("all", set(range(1, 6))))}
    some = compare_experiments(runs["base"], runs["some"]).evaluators[0]
    # The pass rates are each run's summary's (of judged rows), the failed tasks said apart
    assert (some.paired, some.pass_rate_a, some.pass_rate_b, some.not_judged_b) == (5, 1.0, 1.0, 2)
    assert some.regressed == ["1", "2"] and some.improved == []
    assert "rows whose task failed (not judged): 0 → 2" in said(some, Rule())
    assert Rule().movement(some) == "worse"
    everything = compare_experiments(runs["base"], runs["all"])
    assert [(e.evaluator, e.pass_rate_b, len(e.regressed)) for e in everything.evaluators] == [
        ("exact", None, 5)]
    assert everything.evaluators[0].regressed_significantly() is False  # 5 rows: p=0.0625
    assert "100.0% → - (no row judged)" in said(everything.evaluators[0], Rule())
    gated = CliRunner().invoke(app, ["compare", str(runs["base"]), str(runs["all"]),
                                     "--fail-on-worse"])
    assert gated.exit_code == 1, gated.stdout
    back = compare_experiments(runs["some"], runs["base"]).evaluators[0]  # mended: better
    assert back.improved == ["1", "2"]


def test_a_first_runs_folder_name_means_that_run_beside_its_latest(results_dir: Path) -> None:
    """``exp1`` is the experiment's latest run and its first run's folder: `compare exp1
    exp1-2` compared exp1-2 with itself ("same" everywhere); now the first with the second."""
    for passing in (set(range(1, 31)), set(range(1, 21))):
        run_experiment("names", data=_data(passing, 0.0), evaluators=[exact], experiment_name="exp1",
                       backend="local", results_dir=results_dir, print_summary=False,
                       html_report=False)
    for a in ("exp1", "names/exp1"):
        shown = CliRunner().invoke(app, ["compare", a, "exp1-2", "--results-dir", str(results_dir)])
        assert shown.exit_code == 0, shown.stdout
        assert "Comparing B=exp1 (exp1-2) against A=exp1 (exp1-2)" not in shown.stdout
        assert "10 worse / 0 better rows" in shown.stdout, shown.stdout
    same = CliRunner().invoke(app, ["compare", "exp1-2", "exp1-2", "--results-dir", str(results_dir)])
    assert same.exit_code == 0 and "are the same run" in same.stderr
    report = CliRunner().invoke(app, ["report", "exp1-2", "--against", "exp1",
                                      "--results-dir", str(results_dir)])
    assert report.exit_code == 0 and report.stdout.strip().endswith("report-vs-exp1.html"), report.stdout


def test_a_damaged_run_is_said_and_hides_no_other(results_dir: Path) -> None:
    """One run's damaged manifest made list, show and compare of every run fail; a
    results.parquet cut short was a traceback. Now each is said on its own run."""
    for name in ("good", "badman", "badpq"):
        run_experiment("dmg", data=_data({1}, 0.0)[:3], evaluators=[exact], experiment_name=name,
                       backend="local", results_dir=results_dir, print_summary=False,
                       html_report=False)
    (results_dir / "dmg" / "badman" / "manifest.json").write_text('{"broken')
    with (results_dir / "dmg" / "badpq" / "results.parquet").open("r+b") as f:
        f.truncate(300)
    rd = ["--results-dir", str(results_dir)]
    runner = CliRunner()
    listed = runner.invoke(app, ["list", *rd])
    assert listed.exit_code == 0 and "dmg/good" in listed.stdout, listed.stdout
    assert "results unreadable:" in listed.stdout and "unreadable: dmg/badman:" in listed.stderr
    assert runner.invoke(app, ["show", "good", *rd]).exit_code == 0
    for command in (["show", "badpq"], ["report", "badpq"], ["compare", "good", "badpq"],
                    ["export", "badpq", "--format", "csv", "-o", str(results_dir / "x.csv")]):
        said = runner.invoke(app, [*command, *rd])
        assert said.exit_code == 2 and "is damaged and cannot be read" in said.stderr, command
        assert said.exception is None or isinstance(said.exception, SystemExit), command


def test_compare_says_renamed_evaluators_and_changed_data_and_gates_fail(results_dir: Path) -> None:
    @evaluator
    def exact_match(row: Row) -> bool:
        return row.evaluated_model_output == row.evaluated_model_gold_answer

    base = run_experiment("ren", data=_data({1, 2}, 0.0)[:4], evaluators=[exact],
                          experiment_name="a", backend="local", results_dir=results_dir,
                          print_summary=False, html_report=False)
    renamed = run_experiment("ren", data=_data({1, 2}, 0.0)[:4][::-1], evaluators=[exact_match],
                             experiment_name="b", backend="local", results_dir=results_dir,
                             print_summary=False, html_report=False)
    shown = CliRunner().invoke(app, ["compare", str(base.path), str(renamed.path), "--fail-on-worse"])
    assert shown.exit_code == 1, shown.stdout
    assert "Not compared (in one run only): A exact; B exact_match" in shown.stdout
    assert ("gate failed: could not be checked: no evaluator is in both runs (the previous: "
            "exact; this one: exact_match)") in " ".join(shown.stderr.split())
    reordered = compare_experiments(base, run_experiment(
        "ren", data=[{**r, "evaluated_model_output": "x"} for r in _data({1, 2}, 0.0)[:4]],
        evaluators=[exact], experiment_name="c", backend="local", results_dir=results_dir,
        print_summary=False, html_report=False))
    assert reordered.datasets_differ and "The datasets differ (content hash)" in reordered.format()
    assert not compare_experiments(base, base).datasets_differ


def test_a_score_on_a_bin_edge_lands_in_the_bin_it_starts(results_dir: Path) -> None:
    from patronus_tasks.results.summary import _histogram

    bins = _histogram(np.array([0, 0, 0.2, 0.4, 0.6, 0.6, 0.8, 1, 1, 1]))
    assert [c for _, _, c in bins] == [2, 1, 1, 2, 4]  # 0.6 in 0.6-0.8, never in 0.4-0.6


def test_a_name_with_a_slash_is_found_by_that_name(results_dir: Path) -> None:
    run_experiment("models", data=_data({1}, 0.0)[:2], evaluators=[exact],
                   experiment_name="llama/3.1", backend="local", results_dir=results_dir,
                   print_summary=False, html_report=False)
    for given in ("llama/3.1", "models/llama/3.1"):
        found = load_experiment(given, results_dir)
        # Its folder: the name cleaned, and its hash (names that clean alike never share one).
        assert found.name == "llama/3.1" and found.location.name == "llama_3.1-d8e79ae8", given


def test_an_evaluator_of_texts_says_which_rows_texts_changed(results_dir: Path) -> None:
    """A verdict returned as text (no pass, no score) compared "same: 0 worse / 0 better"
    though two rows went from PASS to FAIL; the HTML report showed "mean 0 → 0"."""
    def run(failing: set[int], name: str) -> Any:
        @evaluator
        def verdict_text(row: Row) -> str:
            return "FAIL" if int(row.sid) in failing else "PASS"
        return run_experiment("texts", data=[{"sid": str(i), "evaluated_model_output": "x"}
                                             for i in range(1, 7)],
                              evaluators=[verdict_text], experiment_name=name, backend="local",
                              results_dir=results_dir, print_summary=False, html_report=False)
    a, b = run(set(), "a"), run({2, 5}, "b")
    e = compare_experiments(a, b).evaluators[0]
    assert (e.changed, e.regressed, e.improved) == (["2", "5"], [], [])
    shown = CliRunner().invoke(app, ["compare", str(a.path), str(b.path)])
    assert "verdict_text [link 0] changed: text changed on 2 of 6 rows" in shown.stdout, shown.stdout
    assert "text changed (2): 2, 5" in shown.stdout
    from patronus_tasks.report import write_report

    page = write_report(b, a, results_dir / "vs.html").read_text()
    assert "text changed on 2 rows" in page and "mean 0 → 0" not in page


def test_a_judge_that_never_answered_is_not_compared_and_fails_the_gates(results_dir: Path) -> None:
    """A judge endpoint down all night: every evaluation unscored (JudgeError). It dropped
    out of the comparison: "Unchanged", and --fail-on-worse passed."""
    from patronus_tasks.exceptions import JudgeError
    from patronus_tasks.prefect.ui.series import _verdict_lines
    from patronus_tasks.results.verdict import Rule, judge

    def night(down: bool, name: str) -> Any:
        @evaluator
        def faithful(evaluated_model_output: str) -> bool:
            if down:
                raise JudgeError("judge endpoint: ConnectError (is the server up?)")
            return True
        return run_experiment("judged", data=_data({1}, 0.0)[:4], evaluators=[exact, faithful],
                              experiment_name=name, backend="local", results_dir=results_dir,
                              print_summary=False, html_report=False)
    good, down = night(False, "good"), night(True, "down")
    result = compare_experiments(good, down)
    assert (result.unjudged_b, [e.evaluator for e in result.evaluators]) == (["faithful"], ["exact"])
    assert "Not compared (no verdict in B: every evaluation unscored" in result.format()
    gated = CliRunner().invoke(app, ["compare", str(good.path), str(down.path), "--fail-on-worse"])
    assert gated.exit_code == 1 and ("gate failed: could not be checked: no verdict this run "
                                     "from faithful") in " ".join(gated.stderr.split())
    note = judge(down.summary(), result, Rule(fail_on="worse"))
    assert "not-compared" in note.tags and note.name == "Gate failed"
    assert note.failures[0].startswith("fail_on_regression could not be checked: no verdict this "
                                       "run from faithful")
    assert _verdict_lines(result, Rule())[0].startswith("**Not compared**: no verdict this run")
    back = compare_experiments(down, good)  # the judge answers again the next night
    assert back.unjudged_a == ["faithful"] and not judge(good.summary(), back, Rule()).failures
    assert "no verdict last run from faithful (back this run)" in _verdict_lines(back, Rule())[0]


def test_the_paired_interval_agrees_with_the_exact_test_on_few_rows() -> None:
    """3 of 9 rows worse, none better: McNemar's exact p is 0.25, and the interval (Agresti
    and Min 2005: half a pair added to each cell) holds 0; the Wald interval it replaces,
    [-64.1%, -2.5%], did not."""
    import math

    from patronus_tasks.results.stats import mcnemar, paired_pass_ci

    lo, hi = paired_pass_ci(3, 0, 9, 0.95)
    b, c, n = 3.5, 0.5, 11  # the paper's adjustment, worked by hand
    half = 1.96 * math.sqrt(b + c - (c - b) ** 2 / n) / n
    assert (lo, hi) == pytest.approx(((c - b) / n - half, (c - b) / n + half))
    assert lo < 0 < hi and mcnemar(3, 0)[1] == pytest.approx(0.25)
    lo, hi = paired_pass_ci(30, 0, 90, 0.95)  # ten times the rows: clearly worse
    assert hi < 0


def test_crashes_judges_and_texts_across_repeats_and_links(results_dir: Path) -> None:
    """A review's cases: a text evaluator with different repeats (pair='mean') crashed
    compare with a KeyError; a task crash hid a judge that never answered; a crash in a
    chain's first link dropped the row from the later links' evaluators."""
    from patronus_tasks import task
    from patronus_tasks.exceptions import JudgeError

    @evaluator
    def verdict_text(row: Row) -> str:
        return "FAIL" if row.sid == "2" else "PASS"

    data = [{"sid": str(i), "evaluated_model_output": "x"} for i in range(1, 4)]
    once, twice = (run_experiment("rep", data=data, evaluators=[verdict_text],
                                  experiment_name=f"r{n}", repeats=n, backend="local",
                                  results_dir=results_dir, print_summary=False,
                                  html_report=False) for n in (1, 2))
    e = compare_experiments(once, twice).evaluators[0]
    assert (e.changed, e.text_rows) == (["1", "2", "3"], 3)  # "PASS" against "PASS | PASS"

    def night(crash: set[str], judge_down: bool, name: str) -> Any:
        @task
        def answer(row: Row) -> str:
            if row.sid in crash:
                raise RuntimeError("model API 500")
            return "x"

        @evaluator
        def judge(evaluated_model_output: str) -> bool:
            if judge_down:
                raise JudgeError("judge endpoint down")
            return True

        @task
        def follow_up(row: Row) -> str:
            return "y"

        @evaluator
        def followed(evaluated_model_output: str) -> bool:
            return evaluated_model_output == "y"

        return run_experiment("chain", data=data, chain=[
            {"task": answer, "evaluators": [judge]},
            {"task": follow_up, "evaluators": [followed]}], experiment_name=name,
            backend="local", results_dir=results_dir, print_summary=False, html_report=False)
    good = night(set(), False, "good")
    bad = night({"1"}, True, "bad")
    result = compare_experiments(good, bad)
    assert result.unjudged_b == ["judge"]  # the crash on row 1 is no judge's answer
    later = {(x.link_index, x.evaluator): x for x in result.evaluators}[(1, "followed")]
    assert "1" in later.regressed and later.paired == 3  # the chain stopped at link 0


def test_rows_that_moved_are_listed_as_a_person_counts_and_list_says_its_zone(
        results_dir: Path) -> None:
    import os

    rows = [{"sid": str(i), "evaluated_model_gold_answer": "g", "evaluated_model_output": "g"}
            for i in range(1, 13)]
    a = run_experiment("nat", data=rows, evaluators=[exact], experiment_name="a", backend="local",
                       results_dir=results_dir, print_summary=False, html_report=False)
    worse = [{**r, "evaluated_model_output": "x"} if int(str(r["sid"])) >= 6 else r for r in rows]
    b = run_experiment("nat", data=worse, evaluators=[exact], experiment_name="b", backend="local",
                       results_dir=results_dir, print_summary=False, html_report=False)
    assert compare_experiments(a, b).evaluators[0].regressed == [str(i) for i in range(6, 13)]
    env = {**os.environ, "TZ": "America/New_York"}
    listed = subprocess.run([sys.executable, "-m", "patronus_tasks", "list", "--results-dir",
                             str(results_dir)], capture_output=True, text=True, env=env, cwd=ROOT)
    assert " EST  completed" in listed.stdout or " EDT  completed" in listed.stdout, listed.stdout


def test_a_path_that_holds_no_experiment_is_said_as_a_path(results_dir: Path) -> None:
    shown = CliRunner().invoke(app, ["show", "/tmp/no/such/dir", "--results-dir", str(results_dir)])
    assert shown.exit_code == 2
    assert "no experiment's folder at /tmp/no/such/dir" in " ".join(shown.stderr.split())
