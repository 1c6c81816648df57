"""Commands over finished experiments: list, show, compare, export, report."""

from __future__ import annotations

import datetime as dt
import re
import socket
import sys
from pathlib import Path
from typing import Annotated

import typer

from patronus_tasks.cli.common import EXIT_GATE, ExperimentArg, ResultsDir, echo, load, load_two, say, usage
from patronus_tasks.exceptions import ConfigError
from patronus_tasks.procs import alive
from patronus_tasks.record.location import redact, scrub
from patronus_tasks.record.manifest import Manifest
from patronus_tasks.record.records import STATUS_ERROR
from patronus_tasks.results.baselines import accepted_here, series_of
from patronus_tasks.results.compare import Comparison, compare_experiments, run_label
from patronus_tasks.results.experiment import Experiment
from patronus_tasks.results.store import scan
from patronus_tasks.results.verdict import ALPHA, Rule, not_compared, rule_of, said
from patronus_tasks.settings import default_results_dir


def _status(m: Manifest) -> str:
    """``running`` said only of a run whose process is still there (on this host): a killed
    one (SIGKILL, a crash) never wrote its end."""
    if m.status != "running" or not m.pid or m.host != socket.gethostname():
        return m.status
    return m.status if alive(m.pid) else "stopped (its process is gone: killed?)"


def _local_time(stamp: str) -> str:
    """A manifest's UTC time in this machine's zone, the zone said (it was UTC unsaid)."""
    try:
        return dt.datetime.fromisoformat(stamp).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    except ValueError:
        return stamp[:19]


def _figures(e: Experiment) -> str:
    """Rows, errors and pass rates. A run not finished (interrupted, killed, running) has
    its rows in parts, counted from there: its manifest says 0 until it ends."""
    m = e.manifest
    try:
        summary = e.summary()
    except FileNotFoundError:
        return f"rows={m.rows}  (no results)"
    except ConfigError as exc:  # a damaged results file: said on its line, the rest listed
        return f"rows={m.rows}  (results unreadable: {exc})"
    rows = f"rows={m.rows}" if m.status == "completed" else \
        f"rows={summary.runs} of {m.dataset.rows * m.repeats}"
    rates = ", ".join(f"{s.evaluator} {'-' if s.pass_rate is None else f'{s.pass_rate:.0%}'}"
                      for s in summary.evaluators)
    return f"{rows}  errors={summary.task_errors + summary.evaluator_errors}  {rates}"


def list_(results_dir: ResultsDir = None) -> None:
    """Past experiments: name, start time, status, rows, errors and pass rates."""
    where = results_dir or default_results_dir()
    try:
        runs, unreadable = scan(results_dir)
    except ConfigError as exc:  # a store that cannot be opened (credentials, a bad URL)
        raise usage(str(exc)) from None
    except OSError as exc:  # opened, but it does not answer
        raise usage(f"results_dir {redact(str(where))} cannot be listed: "
                    f"{scrub(str(exc), str(where))}") from None
    if not runs and not unreadable:
        echo(f"no experiments under {redact(str(where))}" + (
            "" if "://" in str(where) or Path(where).is_dir() else " (no such folder)"))
        return
    for e in runs:
        m = e.manifest
        echo(f"{e.project}/{_listed(e)}  {_local_time(m.started_at)}  {_status(m)}  "
                   f"{_figures(e)}")
    for e, why in unreadable:  # one damaged run hides no other
        say("unreadable", f"{e.location.parent.name}/{e.location.name}: {why}")


def _listed(e: Experiment) -> str:
    """The run's folder (``nightly``, ``nightly-2``); a name that is not its folder's
    (``llama/3.1`` in ``llama_3.1-d8e79ae8``) said first: `show` and `compare` take both."""
    folder = e.location.name
    if re.fullmatch(rf"{re.escape(e.name)}(-\d+)?", folder):
        return folder
    return f"{e.name} ({folder})"


def _failure_lines(e: Experiment) -> list[str]:
    df = e.to_dataframe()
    bad = df[(df["status"] == STATUS_ERROR) | (df["pass"] == False)]  # noqa: E712
    lines = []
    for r in bad.itertuples():
        step = r.evaluator_name if isinstance(r.evaluator_name, str) else r.task_name
        if r.status == STATUS_ERROR:
            lines.append(f"  sid={r.sid} link={r.link_index} {step}: {r.error_type}: {r.error_message}")
        else:
            lines.append(f"  sid={r.sid} link={r.link_index} {step}: failed"
                         + (f" ({r.explanation})" if isinstance(r.explanation, str) else ""))
    return lines


def show(experiment: ExperimentArg, failures: Annotated[bool, typer.Option(
             "--failures", help="List rows that errored or failed an evaluator.")] = False,
         results_dir: ResultsDir = None) -> None:
    """An experiment's summary."""
    e = load(experiment, results_dir)
    echo(e.format_summary())
    if failures:
        lines = _failure_lines(e)
        echo(f"\nFailures ({len(lines)}):" if lines else "\nNo failures.")
        for line in lines:
            echo(line)


def compare(runs: Annotated[list[str], typer.Argument(
                help="The baseline (an experiment's name, run folder or path), then the runs "
                "compared with it: one for the row-by-row comparison, more for a matrix.")],
            fail_on_regression: Annotated[bool, typer.Option(
                "--fail-on-regression", help="Exit 1 when an evaluator regressed "
                "significantly (p < 0.05), as fail_on_regression=True.")] = False,
            fail_on_worse: Annotated[bool, typer.Option(
                "--fail-on-worse", help="Exit 1 when an evaluator got worse by --drop's rule, "
                "as fail_on_regression='worse'.")] = False,
            drop: Annotated[float, typer.Option(
                "--drop", help="The fall in pass rate (or mean score) called worse (0.05: "
                "5 points); more rows worse than better is worse too.")] = 0.05,
            pair: Annotated[str | None, typer.Option(
                "--pair", help="With repeats: 'repeat' pairs runs by sample id and repeat, "
                "'mean' compares rows' means (default: 'repeat' when both ran the same "
                "repeats, else 'mean').")] = None,
            results_dir: ResultsDir = None) -> None:
    """Compare experiment B with baseline A, pairing rows by sample id; then their
    dataset-level metrics, tokens and cost. With more runs (A B C ...), each against A in
    one matrix (as a sweep's), p adjusted for the comparisons (Holm)."""
    if len(runs) < 2:
        raise usage("compare needs a baseline and at least one run to compare with it.")
    try:
        rule = rule_of(drop, False)
    except ConfigError:  # its message names the Python option (regression_threshold)
        raise usage(f"--drop must be a fall from 0 to 1 (0.05: 5 points), not {drop:g}") from None
    if len(runs) > 2:
        _compare_many(runs, rule, pair, fail_on_regression, fail_on_worse, results_dir)
        return
    try:
        pair_of_runs = load_two(runs[0], runs[1], results_dir)
        result = compare_experiments(*pair_of_runs, pair=pair)
    except ConfigError as exc:
        raise usage(str(exc)) from None
    # Which runs first, then what got worse or better, counts before p-values; the figures.
    header, _, figures = result.format().partition("\n")
    echo(header)
    for line in _baselines_said(*pair_of_runs):
        echo(line)
    echo("\n".join(said(e, rule, many_links=True) for e in result.evaluators) + "\n")
    echo(figures)
    failing = _compare_gates(result, rule, fail_on_regression, fail_on_worse)
    for message in failing:
        say("gate failed", message)
    if failing:
        raise typer.Exit(EXIT_GATE)


def _compare_many(runs: list[str], rule: Rule, pair: str | None, significant: bool, worse: bool,
                  results_dir: str | None) -> None:
    """Every run against the first, in one matrix; the gates over all of them."""
    from patronus_tasks.sweep.compare import compare_runs

    try:
        result = compare_runs([load(r, results_dir) for r in runs], rule, pair)
    except ConfigError as exc:
        raise usage(str(exc)) from None
    echo(result.format())
    failing = result.gates(significant, worse)
    for message in failing:
        say("gate failed", message)
    if failing:
        raise typer.Exit(EXIT_GATE)


def _baselines_said(a: Experiment, b: Experiment) -> list[str]:
    """Each run's own verdict and the baseline it was judged against (its series'), and
    the baseline accepted beside the results: which run the team holds as good."""
    lines = []
    for which, e in (("A", a), ("B", b)):
        note = e.manifest.verdict
        if note is not None and note.baseline:
            since = f" since {note.since}" if note.since else ""
            lines.append(f"{which}'s verdict: {note.name}{since}, against baseline {note.baseline}")
    accepted = accepted_here(b.location.parent, series_of(b))
    if accepted is not None:
        lines.append(f"the series' accepted baseline ({series_of(b)}): {run_label(accepted)}"
                     + (" (A)" if accepted.location == a.location else ""))
    return lines


def accept(run: Annotated[str, typer.Argument(help="The run to hold as good: its name, run "
                                                   "folder or path.")],
           results_dir: ResultsDir = None) -> None:
    """Make RUN the baseline of its series: the runs after it are judged against it; prints
    the series' new baseline. On Prefect (a run recorded there) the server keeps it: set
    PREFECT_API_URL and its auth string (`patronus-tasks server env`); else a file beside
    the results."""
    from patronus_tasks.prefect import accept_baseline

    load(run, results_dir)  # an unknown run: said as every command says it
    try:
        said_ = accept_baseline(run, results_dir)
    except ConfigError as exc:
        raise usage(str(exc)) from None
    except Exception as exc:  # the server did not answer, or refused
        from prefect.settings import get_current_settings

        from patronus_tasks.prefect.clients import refused, refused_fix

        url = get_current_settings().api.url
        why = refused_fix(url) if refused(exc) else (
            f"the Prefect API at {url} did not take it ({type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:200]}): is it up, and PREFECT_API_URL set to it?")
        raise usage(f"could not accept {run}: {why}") from None
    echo(said_)


def _compare_gates(result: Comparison, rule: Rule, significant: bool, worse: bool) -> list[str]:
    """The gates of an experiment's ``fail_on_regression`` (True, ``"worse"``): one row
    that flipped is no gate. Both may be asked; each is checked and said on its own."""
    failing = []
    why_not = not_compared(result)  # as the run-to-run verdict says it
    if (significant or worse) and why_not:  # a gate unchecked never passes
        failing.append(f"could not be checked: {why_not}")
    for e in result.evaluators:
        where = f"{e.evaluator} [link {e.link_index}]"
        if significant and e.regressed_significantly(ALPHA):
            failing.append(f"{where} regressed significantly (p < {ALPHA})")
        if worse and rule.movement(e) == "worse":
            failing.append(f"{where} got worse")
    return failing


def export(experiment: ExperimentArg,
           format: Annotated[str, typer.Option("--format", help="csv or jsonl")] = "csv",
           output: Annotated[Path | None, typer.Option("--output", "-o")] = None,
           results_dir: ResultsDir = None) -> None:
    """Write an experiment's records as CSV or JSON Lines (to stdout without --output)."""
    if format not in ("csv", "jsonl"):
        raise usage(f"--format must be csv or jsonl, not {format!r}")
    e = load(experiment, results_dir)
    text = e.to_csv() if format == "csv" else e.to_json()
    if output is None:
        sys.stdout.write(text or "")
    else:
        output.write_text(text or "", encoding="utf-8")


def report(experiment: ExperimentArg,
           output: Annotated[str | None, typer.Option(
               "--output", "-o", help="Where to write it (default: report.html beside the "
               "results; with --against, report-vs-<B>.html there).")] = None,
           against: Annotated[str | None, typer.Option(
               "--against", help="Another run (the baseline), compared row by row.")] = None,
           results_dir: ResultsDir = None) -> None:
    """Write an experiment's HTML report: one self-contained page (charts, figures, every
    record to sort, filter and open); --against B adds the comparison with B."""
    from patronus_tasks.report import write_report

    baseline, e = load_two(against, experiment, results_dir) if against else (
        None, load(experiment, results_dir))
    try:
        where = write_report(e, baseline, output)  # default: report-vs-<B>.html with B
    except OSError as exc:
        raise usage(f"could not write the report: {exc}") from None
    echo(str(where))
