"""Any runs set side by side as a sweep's variants are: ``patronus-tasks compare A B C``,
the first the baseline, each of the others against it in one matrix."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from patronus_tasks.results.compare import compare_experiments
from patronus_tasks.results.experiment import Experiment
from patronus_tasks.results.verdict import ALPHA, Rule
from patronus_tasks.sweep.matrix import Best, best_of, build_matrix
from patronus_tasks.sweep.text import matrix_text


@dataclass(frozen=True)
class RunsCompared:
    """Runs against the first: their labels, the matrix, the best of them."""

    labels: list[str]
    matrix: pd.DataFrame
    best: Best | None

    def format(self) -> str:
        lines = [f"Comparing {len(self.labels)} runs against the baseline A={self.labels[0]}"]
        lines += [f"  {chr(65 + i) if i < 26 else i}={label}" for i, label in enumerate(self.labels)]
        if self.best is not None:
            lines += ["", self.best.headline(), ""]
        return "\n".join(lines + matrix_text(self.matrix))

    def gates(self, significant: bool, worse: bool) -> list[str]:
        """What ``--fail-on-regression`` (Holm-adjusted p < 0.05 and worse) and
        ``--fail-on-worse`` (the drop rule) find, one line per run and evaluator."""
        failing = []
        for r in self.matrix[self.matrix["verdict"] == "worse"].itertuples():
            where = f"{r.variant}: {r.evaluator}" + (f" [link {r.link}]" if r.link else "")
            if significant and r.p_adjusted < ALPHA:
                failing.append(f"{where} regressed significantly (Holm-adjusted p < {ALPHA})")
            if worse:
                failing.append(f"{where} got worse")
        return failing


def _labels(experiments: Sequence[Experiment]) -> list[str]:
    """Each run's name, with its folder when two share a name."""
    names = [e.name for e in experiments]
    return [e.name if names.count(e.name) == 1 else f"{e.name} ({e.location.name})"
            for e in experiments]


def compare_runs(experiments: Sequence[Experiment], rule: Rule | None = None,
                 pair: str | None = None) -> RunsCompared:
    """Every run against the first (``pair``: with repeats, as `compare_experiments`)."""
    labels = _labels(experiments)
    runs = dict(zip(labels, experiments, strict=True))
    base = experiments[0]
    comparisons = {label: compare_experiments(base, e, pair=pair) for label, e in runs.items()
                   if label != labels[0]}
    matrix = build_matrix(runs, labels[0], rule, comparisons)
    return RunsCompared(labels, matrix, best_of(matrix, labels[0]))
