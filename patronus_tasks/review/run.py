"""`review`: people label an experiment's judged rows in the Prefect UI (the flow run
pauses for a form, a page of rows at a time), and the judge is measured against them.

Its parts: which rows (`select`), the form (`form`), the pause (`prefect.pause`), the
labels (`record.labels`), the figures (`results.reviewed`), the calibration set grown
(`into`), the artifact (`prefect.ui.review`); the terminal's questions (`terminal`).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd

from patronus_tasks.exceptions import ConfigError
from patronus_tasks.record.labels import add_labels
from patronus_tasks.results.agreement import Agreement
from patronus_tasks.results.experiment import Experiment
from patronus_tasks.results.reviewed import Reviewed, reviewed
from patronus_tasks.results.store import as_experiment
from patronus_tasks.review import into as _into
from patronus_tasks.review.form import Page, check_page_size, paginate
from patronus_tasks.review.rows import Reviewable, check_evaluator, resolve_scale, reviewables
from patronus_tasks.review.select import Select, choose, pending

T = TypeVar("T")
CLI_HINT = "patronus-tasks review {folder} --evaluator {evaluator}"


@dataclass(frozen=True)
class Plan:
    """What a review asks about: the experiment, the evaluator and its scale, the rows
    selected (the same for the same call), and why none were when none were."""

    experiment: Experiment
    evaluator: str
    scale: list[str]
    selected: list[Reviewable]
    records: pd.DataFrame
    why_none: str = ""
    reviewers: int = 1

    def to_ask(self) -> list[Reviewable]:
        """The selected rows fewer than ``reviewers`` people labelled yet."""
        return pending(self.selected, self.reviewers)


@dataclass
class Review:
    """A review's outcome: the rows selected, how many are labelled, what was said, the
    judge against the labels (``agreement``: accuracy, kappa, n; None with fewer than 5
    labelled rows) and the reviewers' own agreement."""

    experiment: Experiment
    evaluator: str
    rows: list[str]  # the sample ids selected
    reviewed: int  # of them, those labelled now
    figures: Reviewed
    message: str
    added: _into.Appended | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def labels(self) -> pd.DataFrame:
        """The evaluator's labels (``sid``, ``evaluator``, ``label``, ``reviewer``,
        ``note``, ``reviewed_at``), this review's and earlier ones'."""
        found = self.experiment.labels()
        return found[found["evaluator"] == self.evaluator].reset_index(drop=True)

    @property
    def agreement(self) -> Agreement | None:
        return self.figures.agreement

    @property
    def reviewers_alpha(self) -> float | None:
        return self.figures.reviewers_alpha

    def __str__(self) -> str:
        return self.message


def plan(experiment: Experiment, evaluator: str | None, select: Select, n: int, seed: int,
         bounds: tuple[float, float], scale: list[str] | None, reviewers: int) -> Plan:
    """The rows to ask about (see `select`); a `ConfigError` for a bad argument."""
    if isinstance(reviewers, bool) or not isinstance(reviewers, int) or reviewers < 1:
        raise ConfigError(f"review: reviewers must be the number of people wanted per row "
                          f"(1 or more), not {reviewers!r}.")
    name = check_evaluator(experiment, evaluator)
    records = experiment.to_dataframe()
    found_scale = resolve_scale(experiment, name, records, scale)
    rows = reviewables(records, experiment.labels(), name, found_scale)
    chosen = choose(rows, select, n, seed, bounds)
    return Plan(experiment, name, found_scale, chosen.rows, records, chosen.why_none, reviewers)


def _run_here(fn: Callable[[], T]) -> T:
    """``fn()``, in a thread of its own when an event loop runs in this one (an async
    flow): Prefect's calls made there would be handed to that loop, blocked meanwhile."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return fn()
    ctx = contextvars.copy_context()
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(ctx.run, fn).result()


def review(experiment: Experiment | str | Path, evaluator: str | None = None, *,
           select: Select = "sample", n: int = 10, timeout: int = 3600, page_size: int | None = None,
           into: str | Path | None = None, seed: int = 0, bounds: tuple[float, float] = (0.2, 0.8),
           preset: bool = False, reviewers: int = 1, scale: list[str] | None = None,
           min_kappa: float | None = None, results_dir: str | Path | None = None) -> Review:
    """Ask people, in the Prefect UI, to label rows of ``experiment`` judged by
    ``evaluator`` (its only one by default), and keep what they say (``labels.parquet``).

    Runs inside a flow: the flow run pauses for a form, a page of ``page_size`` rows at a
    time (5 by default), each row's facts under its own field; on a deployment it is
    suspended instead (the worker freed; once resumed, the flow runs again from its
    start and takes up the answers). ``select``: ``"sample"`` (``n`` rows at random,
    ``seed``, stratified by the judge's answer), ``"failed"``, ``"disagreements"`` (a
    panel's judges split), ``"uncertain"`` (a probability of a pass between ``bounds``,
    from log-probabilities), or a function of the row; ``n`` caps them. Rows labelled
    already are not asked again (``reviewers=2``: until two people have). A page nobody
    answers in ``timeout`` seconds ends the review, the flow going on with what was
    answered. ``preset``: each label starts at the judge's answer (said on its field).
    ``into``: a JSON Lines file the labelled rows are appended to (no duplicates), the
    calibration set `calibrate` checks the judge on. ``min_kappa``: a `QualityGateError`
    when the judge's kappa with the labels is below it (or below the reviewers' own
    agreement, when that is lower). ``scale``: the labels, for an evaluator without one.
    Outside a flow: a `ConfigError` naming the terminal's review (``patronus-tasks review``).
    """
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise ConfigError(f"review: timeout must be seconds to wait for an answer (> 0), not {timeout!r}.")
    check_page_size(page_size)
    if into is not None:
        _into.check_target(into)
    exp = as_experiment(experiment, results_dir)
    p = plan(exp, evaluator, select, n, seed, bounds, scale, reviewers)
    from patronus_tasks.prefect import pause

    if pause.current_flow_run() is None:
        raise ConfigError(
            "review() asks people in the Prefect UI, so it runs inside a flow (@flow). Outside "
            "one, answer the same questions in a terminal: "
            + CLI_HINT.format(folder=exp.location, evaluator=p.evaluator))
    return _run_here(lambda: _in_flow(p, int(timeout), page_size, preset, into, min_kappa))


def _in_flow(p: Plan, timeout: int, page_size: int | None, preset: bool,
             into: str | Path | None, min_kappa: float | None) -> Review:
    from patronus_tasks.prefect import pause

    notes = []
    if not p.selected:
        notes.append(f"no row of {p.evaluator} matches the selection: {p.why_none}; nobody asked")
    elif not p.to_ask():
        notes.append(f"the {len(p.selected)} rows selected are labelled already; nobody asked")
    else:
        if pause.can_suspend(pause.current_flow_run()):
            pause.remember_experiment(str(p.experiment.location))
        notes += ask_pages(p, timeout, page_size, preset)
    done = finish(p, notes, into, publish=True)
    gate(done, min_kappa)
    return done


#: Reviews made so far in each flow run (by this process): the pause keys' first part.
_CALLS: dict[str, int] = {}


def ask_pages(p: Plan, timeout: int, page_size: int | None, preset: bool) -> list[str]:
    """Each page of the selection in turn, asking its rows still to label; the labels
    kept as each page is answered. A page with no answer ends it (the rest not asked)."""
    from patronus_tasks.prefect import pause

    run_id = str(pause.current_flow_run().id)
    call = _CALLS[run_id] = _CALLS.get(run_id, 0) + 1
    pages = paginate(p.evaluator, p.selected, p.scale, page_size, call, preset)
    wanted = {r.sid for r in p.to_ask()}
    first = 1
    for page in pages:
        shown = [r for r in page.rows if r.sid in wanted]
        at, first = first, first + len(page.rows)
        if not shown:
            continue
        asked = pause.ask(page.showing(shown).fields(), page.showing(shown).description(
            p.experiment.name, at, len(p.selected)), key=page.key, timeout=timeout)
        if asked.answer is None:
            said = f"page {page.number} of {page.pages}: {asked.why_none}; the rest not asked"
            say(said, warn=True)
            return [said]
        keep(p, page, asked.answer)
    return []


def keep(p: Plan, page: Page, answer: dict[str, Any]) -> None:
    """A page's answer kept: its labels beside the results, at once."""
    labels = page.read(answer)
    add_labels(p.experiment.location, labels)
    who = labels[0].reviewer if labels else str(answer.get("reviewer", ""))
    say(f"page {page.number} of {page.pages}: {len(labels)} labels from {who!r}")


def say(line: str, warn: bool = False) -> None:
    """A line in the flow run's logs (its Logs tab), else this package's log."""
    from patronus_tasks.prefect.pause import run_log

    run_log(f"review: {line}", logging.WARNING if warn else logging.INFO)


def finish(p: Plan, notes: list[str], into: str | Path | None, publish: bool = False) -> Review:
    """The outcome: the labels read back, the figures, the rows added ``into`` the
    labelled set, said (and, in a flow, published as the ``-review`` artifact)."""
    labels = p.experiment.labels()
    figures = reviewed(p.records, labels, p.evaluator, p.scale)
    have = labels[labels["evaluator"] == p.evaluator].groupby("sid")["reviewer"].nunique()
    done = sum(1 for r in p.selected if have.get(r.sid, 0) >= p.reviewers)
    message = f"{done} of {len(p.selected)} reviewed" + "".join(f"; {n}" for n in notes)
    added = None
    if into is not None and p.selected:
        added = _into.append(into, p.selected, labels, f"{p.experiment.project}/{p.experiment.name}")
        message += f"; {added.said()}"
    result = Review(p.experiment, p.evaluator, [r.sid for r in p.selected], done, figures,
                    message, added, notes)
    say(message)
    say(figures.headline())
    if publish:
        _publish(result, p)
    _rewrite_report(p.experiment)
    return result


def _publish(r: Review, p: Plan) -> None:
    from patronus_tasks.prefect.ui.review import publish_review, review_markdown
    from patronus_tasks.results.reviewed import review_rows

    manifest = p.experiment.manifest
    series = manifest.series or f"{manifest.project}/{p.evaluator}"
    rows = review_rows(p.records, p.experiment.labels(), p.evaluator, p.scale)
    title = f"{manifest.project}/{p.experiment.name}"
    publish_review(series, title, review_markdown(title, r.message, r.figures, rows), r.message)


def _rewrite_report(experiment: Experiment) -> None:
    """The HTML report written again, the labels in it (when the run wrote one)."""
    from patronus_tasks.report.build import REPORT_FILE, report_after_run

    if (experiment.location / REPORT_FILE).exists():
        report_after_run(experiment)


def gate(r: Review, min_kappa: float | None) -> None:
    """``min_kappa``: a `QualityGateError` when the judge's kappa with its reviewers is
    below it, or below the reviewers' own agreement when that is lower (said)."""
    from patronus_tasks.exceptions import QualityGateError

    if min_kappa is None:
        return
    found = r.agreement
    if found is None or found.kappa is None:
        say(f"min_kappa {min_kappa:g} not checked: {r.figures.headline()}", warn=True)
        return
    bar, why = r.figures.bar(min_kappa)
    if why:
        say(why, warn=True)
    if found.kappa < bar:
        raise QualityGateError([f"{r.evaluator}: Cohen's kappa with its reviewers {found.kappa:.3f} "
                                f"is below {bar:.3f}" + (f" ({why})" if why else "")], r.experiment)


def reviewed_experiment() -> Experiment | None:
    """In a flow run that a `review` suspended (on a deployment) and that runs again once
    resumed: the experiment it asked about, to take up instead of running it again
    (``experiment = reviewed_experiment() or run_experiment(...)``); None otherwise."""
    from patronus_tasks.prefect import pause

    where = pause.remembered_experiment()
    return Experiment(where) if where else None


def review_in_terminal(experiment: Experiment | str | Path, evaluator: str | None = None, *,
                       select: Select = "sample", n: int = 10, seed: int = 0,
                       bounds: tuple[float, float] = (0.2, 0.8), reviewers: int = 1,
                       scale: list[str] | None = None, reviewer: str | None = None,
                       into: str | Path | None = None, inp: Any = None, out: Any = None,
                       results_dir: str | Path | None = None) -> Review:
    """The same questions as `review`, one row at a time on a terminal (``inp``/``out``:
    standard input and output), each label kept as soon as it is given."""
    import sys

    from patronus_tasks.review.terminal import Terminal, review_rows, reviewer_name

    if into is not None:
        _into.check_target(into)
    p = plan(as_experiment(experiment, results_dir), evaluator, select, n, seed, bounds, scale,
             reviewers)
    t = Terminal(inp or sys.stdin, out or sys.stdout)
    rows = p.to_ask()
    t.say(f"Review of {p.evaluator} on {p.experiment.project}/{p.experiment.name}: "
          f"{len(rows)} rows to label ({len(p.selected)} selected).")
    if not rows:
        note = (f"no row of {p.evaluator} matches the selection: {p.why_none}" if not p.selected
                else f"the {len(p.selected)} rows selected are labelled already")
        t.say(note)
        return finish(p, [note], into)
    name = reviewer_name(t, reviewer)
    review_rows(t, rows, p.scale, name, lambda label: add_labels(p.experiment.location, [label]))
    done = finish(p, [], into)
    t.say(done.message)
    t.say(done.figures.headline())
    return done
