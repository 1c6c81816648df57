"""``patronus-tasks review RUN``: the review's questions in a terminal, one row at a time,
for a developer trying a judge on a laptop (the Prefect UI's form asks the same in a flow)."""

from __future__ import annotations

from typing import Annotated

import typer

from patronus_tasks.cli.common import ExperimentArg, ResultsDir, load
from patronus_tasks.review.select import SELECTIONS


def review(experiment: ExperimentArg,
           evaluator: Annotated[str | None, typer.Option(
               "--evaluator", "-e", help="Whose rows (default: the experiment's only evaluator).")] = None,
           select: Annotated[str, typer.Option(
               "--select", help=f"Which rows: {', '.join(SELECTIONS)}.")] = "sample",
           n: Annotated[int, typer.Option("-n", help="At most this many rows.")] = 10,
           seed: Annotated[int, typer.Option("--seed", help="The sample's seed.")] = 0,
           reviewer: Annotated[str | None, typer.Option(
               "--reviewer", help="Your name (asked when not given).")] = None,
           reviewers: Annotated[int, typer.Option(
               "--reviewers", help="People wanted per row: rows fewer labelled are asked.")] = 1,
           into: Annotated[str | None, typer.Option(
               "--into", help="A JSON Lines file the labelled rows are appended to (a "
               "calibration set).")] = None,
           results_dir: ResultsDir = None) -> None:
    """Label an experiment's judged rows in the terminal, one at a time: kept beside its
    results (labels.parquet), the judge's agreement with them said at the end."""
    from patronus_tasks.review.run import review_in_terminal

    review_in_terminal(load(experiment, results_dir), evaluator, select=select, n=n, seed=seed,
                       reviewer=reviewer, reviewers=reviewers, into=into)
