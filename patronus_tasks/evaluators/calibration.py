"""Judge calibration: run a judge on rows carrying a human label and say how far it agrees
(`calibrate`), or add that figure to any experiment whose rows have labels
(`judge_agreement`, a dataset-level metric), so a nightly can say both "the model got
worse" and "the judge is still trusted" (``min_metrics={"judge_kappa": 0.6}``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from patronus_tasks.define.metrics import Metric
from patronus_tasks.define.steps import Evaluator
from patronus_tasks.evaluators.forms import Choices, Numeric, PassFail
from patronus_tasks.exceptions import ConfigError, DatasetError, QualityGateError
from patronus_tasks.results.agreement import (
    CALIBRATION_TAG,
    Agreement,
    agreement,
    as_verdict,
    by_verdict,
    category,
)
from patronus_tasks.results.experiment import Experiment


def judge_agreement(evaluator: str | Evaluator, label: str = "label", *, prefix: str = "judge") -> Metric:
    """A metric: ``evaluator``'s verdicts against the human labels in the dataset's
    ``label`` column: ``<prefix>_accuracy``, ``<prefix>_kappa`` (Cohen's, quadratically
    weighted on a 1-N scale), ``<prefix>_n`` (rows compared) and, for a panel,
    ``<prefix>_alpha`` (Krippendorff's alpha across its judges)."""
    name = evaluator if isinstance(evaluator, str) else evaluator.name
    verdicts = not isinstance(evaluator, str) and by_verdict(evaluator.scale)

    def judge_agreement(results: pd.DataFrame) -> dict[str, float | None]:
        return agreement(results, name, label, verdicts).metrics(prefix)

    return Metric(judge_agreement, name=f"{prefix}_agreement")


@dataclass(frozen=True)
class Calibration:
    """A calibration run: the experiment (its results, its flow run, its report) and the
    agreement of the judge with the human labels."""

    experiment: Any
    agreement: Agreement

    @property
    def metrics(self) -> dict[str, float | None]:
        return self.agreement.metrics()

    @property
    def confusion(self) -> pd.DataFrame:
        return self.agreement.confusion

    @property
    def disagreements(self) -> pd.DataFrame:
        return self.agreement.disagreements

    def format(self) -> str:
        a = self.agreement
        lines = [a.headline(), "", "Confusion (rows: human, columns: judge)",
                 a.confusion.to_string()]
        if len(a.disagreements):
            lines += ["", "Rows where they disagree",
                      a.disagreements.head(20).to_string(index=False, max_colwidth=80)]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


def _label_values(judge: Evaluator) -> set[str] | None:
    """The labels a judge's answers can be compared with (None: any)."""
    form = getattr(judge, "form", None)
    if isinstance(form, PassFail):
        return {"pass", "fail"}
    if isinstance(form, Numeric):
        return {str(v) for v in range(1, form.top + 1)}
    if isinstance(form, Choices):
        return set(form.choices)
    return None


def check_labels(judge: Evaluator, data: Any, label: str) -> None:
    """Every label is one the judge could answer; else a `DatasetError` naming the row."""
    from patronus_tasks.define.dataset import load_dataset

    df = load_dataset(data).df
    if label not in df.columns:
        raise DatasetError(f"calibrate: the data has no {label!r} column of human labels; add it, "
                           f"or say which column holds them (label=...).")
    allowed = _label_values(judge)
    for sid, value in zip(df["sid"], df[label], strict=True):
        found = category(value)
        if found is None or allowed is None:
            continue
        found = as_verdict(found) if isinstance(getattr(judge, "form", None), PassFail) else found
        if found not in allowed:
            raise DatasetError(f"calibrate: row sid={sid}: {label}={value!r} is not a label the judge "
                               f"{judge.name!r} can answer ({', '.join(sorted(allowed))}); fix the "
                               "row or leave it empty to skip it.")


def calibrate(judge: Evaluator, data: Any, *, label: str = "label", project: str = "judge-calibration",
              min_kappa: float | None = None, **options: Any) -> Calibration:
    """Run ``judge`` on ``data`` (anything `run_experiment` reads; the output to judge in
    ``evaluated_model_output``, or a ``task=``) and compare its verdicts with the human
    labels in the ``label`` column: accuracy, Cohen's kappa (quadratically weighted on a 1-N
    scale), Krippendorff's alpha across a panel's judges, the confusion matrix and the rows
    where they disagree. The run is an ordinary experiment (tagged ``calibration``): its
    metrics (``judge_kappa``, ...) are in its manifest, summary, Prefect artifacts and HTML
    report, whose calibration section shows the matrix and the disagreeing rows.
    ``min_kappa``: a gate (`QualityGateError` below it, its ``calibration`` the figures
    that failed it: matrix, disagreeing rows); other options go to `run_experiment`.
    """
    from patronus_tasks.api import run_experiment

    if not isinstance(judge, Evaluator):
        raise ConfigError(f"calibrate: judge must be an evaluator (a judge of "
                          f"patronus_tasks.evaluators, or your own), not {judge!r}.")
    check_labels(judge, data, label)
    gates = dict(options.pop("min_metrics", None) or {})
    if min_kappa is not None:
        gates["judge_kappa"] = min_kappa
    tags = {**(options.pop("tags", None) or {}), CALIBRATION_TAG: f"{judge.name}|{label}"}
    metrics = [*(options.pop("metrics", None) or []), judge_agreement(judge, label)]
    try:
        experiment = run_experiment(project, data=data, evaluators=[judge], metrics=metrics,
                                    tags=tags, min_metrics=gates or None, **options)
    except QualityGateError as exc:  # the figures that failed it, on the error
        ran = exc.experiment
        if isinstance(ran, Experiment):
            exc.calibration = Calibration(ran, agreement(ran.to_dataframe(), judge.name, label,
                                                         by_verdict(judge.scale)))
        raise
    return Calibration(experiment, agreement(experiment.to_dataframe(), judge.name, label,
                                             by_verdict(judge.scale)))
