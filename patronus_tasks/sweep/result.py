"""A finished sweep: its variants' experiments, the matrix, the Pareto front, the headline."""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING

import pandas as pd

from patronus_tasks.record.location import Location
from patronus_tasks.results.experiment import Experiment
from patronus_tasks.sweep.matrix import Best, best_of, build_matrix, pareto_front
from patronus_tasks.sweep.store import MATRIX_FILE, REPORT_FILE, SweepFile

if TYPE_CHECKING:
    from patronus_tasks.run.background import Afterwards
    from patronus_tasks.sweep.on_prefect import SweepRun


class Sweep:
    """A sweep's variants run over one dataset, side by side.

    ``variants``: every label, in grid order; ``experiments``: the `Experiment` of each
    variant that ran (``failed`` says why the others did not); ``matrix()`` and
    ``pareto()`` set them side by side against the ``baseline``.
    """

    def __init__(self, folder: Location, file: SweepFile, experiments: dict[str, Experiment],
                 run: SweepRun | None = None) -> None:
        self.location, self.file = folder, file
        self.project, self.name, self.baseline = file.project, file.sweep_name, file.baseline
        self.variants = [v.label for v in file.variants]
        self.experiments = {label: experiments[label] for label in self.variants
                            if label in experiments}
        self._run = run
        self._matrix: pd.DataFrame | None = None
        self._lock = threading.Lock()
        self.afterwards: Afterwards | None = None  # the report and Prefect's end, in a thread

    @property
    def failed(self) -> dict[str, str]:
        """The variants that did not run, and why."""
        return {v.label: v.error or v.status for v in self.file.variants
                if v.status in ("failed", "interrupted")}

    @property
    def gate_failures(self) -> dict[str, list[str]]:
        """The variants whose own gates failed (``fail_on_error``, ``min_pass_rates``...)."""
        return {v.label: v.gate_failures for v in self.file.variants if v.gate_failures}

    @property
    def params(self) -> dict[str, dict[str, str]]:
        """Each variant's parameters, as labelled (``{"model": "gpt-4o-mini", ...}``)."""
        return {v.label: dict(v.shown) for v in self.file.variants}

    def matrix(self) -> pd.DataFrame:
        """One row per variant and evaluator (`sweep.matrix.COLUMNS`): pass rate and its
        95% interval, mean score, unscored and error counts, tokens, cost, latency, and
        against the baseline the rows worse and better, p, Holm's adjusted p, the verdict."""
        with self._lock:  # the report's thread and the caller may both ask at once
            if self._matrix is None:
                self._matrix = build_matrix(self.experiments, self.baseline)
            return self._matrix.copy()

    def pareto(self, quality: str | None = None, cost: str = "cost_usd") -> pd.DataFrame:
        """The variants no other beats on both ``quality`` (None: the mean of the pass
        rates; an evaluator's name: its pass rate) and ``cost`` (a column of the matrix:
        ``cost_usd``, ``latency_p50_s``, ``tokens_in``...), cheapest first."""
        return pareto_front(self.matrix(), quality, cost)

    def best(self, quality: str | None = None) -> Best | None:
        return best_of(self.matrix(), self.baseline, quality)

    def headline(self) -> str:
        """Which variant is best, and whether it beats the baseline beyond chance; which
        failed."""
        best = self.best()
        parts = [best.headline()] if best is not None else ["no variant ran"]
        parts += [f"failed: {label} ({why})" for label, why in self.failed.items()]
        return "; ".join(parts)

    @property
    def flow_run_id(self) -> str | None:
        """The sweep's flow run (None off Prefect)."""
        return self._run.flow_run_id() if self._run is not None else None

    @property
    def report_path(self) -> Location:
        return self.location / REPORT_FILE

    @property
    def matrix_path(self) -> Location:
        return self.location / MATRIX_FILE

    def wait_recorded(self, timeout: float | None = None) -> bool:
        """Wait for the report and, on Prefect, every variant's task runs and the sweep's
        flow run's end; True when all are in."""
        done = self.afterwards.wait(timeout) if self.afterwards is not None else True
        done = all([done, *(e.wait_recorded(timeout) for e in self.experiments.values())])
        return done and (self._run.wait(timeout) if self._run is not None else True)

    def format(self) -> str:
        """The headline and the matrix, as text."""
        from patronus_tasks.sweep.text import matrix_text

        return "\n".join([f"Sweep {self.project}/{self.name}: {self.headline()}", "",
                          *matrix_text(self.matrix())])

    def __repr__(self) -> str:
        return f"Sweep({self.project}/{self.name!r}, variants={len(self.variants)})"


def figure(value: object, rate: bool = False) -> str:
    """A matrix figure as text: a rate in percent, else 3 digits; empty when unknown."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return ""
    if rate:
        return f"{float(value):.1%}"  # type: ignore[arg-type]
    return f"{float(value):.3g}" if isinstance(value, float) else str(value)
