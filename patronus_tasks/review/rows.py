"""The rows a person may review: one per sample of an evaluator (its first link and
repeat), with what the judge saw and said, and the scale a person answers on."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from patronus_tasks.define.row import clean
from patronus_tasks.exceptions import ConfigError
from patronus_tasks.record.records import STATUS_OK
from patronus_tasks.results.agreement import as_verdict, category
from patronus_tasks.results.experiment import Experiment
from patronus_tasks.results.reviewed import by_verdict, judge_rows, scale_in

PASS_FAIL = ["pass", "fail"]


@dataclass(frozen=True)
class Reviewable:
    """One row of an evaluator to review: what the judge saw (input, output, gold answer,
    retrieved context), what it said (``verdict`` on the scale, ``passed``, ``score``,
    ``explanation``, each judge of a panel in ``judges``), its probability of a pass where
    log-probabilities gave one (``p_pass``), and who labelled it already (``reviewers``).
    A ``select=`` function is given these."""

    sid: str
    evaluator: str
    verdict: str | None
    passed: bool | None = None
    score: float | None = None
    explanation: str | None = None
    input: Any = None
    output: Any = None
    gold_answer: Any = None
    context: Any = None
    p_pass: float | None = None
    judges: list[tuple[str, str | None]] = field(default_factory=list)  # (model, answer)
    reviewers: tuple[str, ...] = ()

    @property
    def split(self) -> bool:
        """A panel whose judges did not all answer the same."""
        return len({a for _, a in self.judges}) > 1


def evaluators_of(experiment: Experiment) -> list[str]:
    return list(dict.fromkeys(e.name for link in experiment.manifest.links for e in link.evaluators))


def resolve_scale(experiment: Experiment, evaluator: str, records: pd.DataFrame,
                  given: list[str] | None) -> list[str]:
    """The labels a person may give: ``given``, the judge's scale in the manifest, or
    pass/fail for an evaluator that gives verdicts; else a `ConfigError`."""
    if given is not None:
        scale = [str(v).strip() for v in given]
        if len(scale) < 2 or len(set(scale)) != len(scale) or not all(scale):
            raise ConfigError(f"review: scale must be two or more distinct labels, not {given!r}.")
        return scale
    found = scale_in(experiment.manifest, evaluator)
    if found:
        return found
    mine = records[records["evaluator_name"] == evaluator]
    if mine["pass"].notna().any():
        return list(PASS_FAIL)
    raise ConfigError(f"review: {evaluator!r} gives no pass/fail verdicts and has no scale to label "
                      "its rows on; give scale=[...] (the labels a person may choose).")


def check_evaluator(experiment: Experiment, evaluator: str | None) -> str:
    """The evaluator to review: the one named (it must be in the experiment), or the
    experiment's only one."""
    names = evaluators_of(experiment)
    if evaluator is None:
        if len(names) == 1:
            return names[0]
        raise ConfigError(f"review: say which evaluator's rows to review (evaluator=...): "
                          f"{experiment.name} has {', '.join(names) or 'none'}.")
    if evaluator not in names:
        raise ConfigError(f"review: {experiment.name} has no evaluator {evaluator!r} (it has "
                          f"{', '.join(names) or 'none'}).")
    return evaluator


def _meta(text: Any) -> dict[str, Any]:
    try:
        found = json.loads(text) if isinstance(text, str) else {}
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def answer(record: Any, scale: list[str]) -> str | None:
    """The judge's answer on a record, as a value of ``scale`` (None: none on it)."""
    if by_verdict(scale):
        return as_verdict(category(clean(getattr(record, "pass_", None))))
    raw = _meta(getattr(record, "evaluation_metadata", None)).get("raw")
    found = category(raw) if not isinstance(raw, list | dict) else None
    return found if found in scale else None


def _p_pass(record: Any, meta: dict[str, Any]) -> float | None:
    """A pass/fail judge's probability of a pass: its score, when log-probabilities
    gave it (else its score is 0 or 1: no probability)."""
    score = clean(getattr(record, "score", None))
    if meta.get("logprobs") is True and isinstance(meta.get("raw"), bool) and score is not None:
        return float(score)
    return None


def _panel(meta: dict[str, Any], scale: list[str]) -> list[tuple[str, str | None]]:
    found = []
    for j in meta.get("judges") or []:
        if isinstance(j, dict):
            raw = category(j.get("raw"))
            found.append((str(j.get("model")), as_verdict(raw) if by_verdict(scale) else raw))
    return found


def _column(record: Any, name: str) -> Any:
    return clean(getattr(record, name, None))


def reviewables(records: pd.DataFrame, labels: pd.DataFrame, evaluator: str,
                scale: list[str]) -> list[Reviewable]:
    """The evaluator's scored rows (one per sample) as `Reviewable`s, in the file's order."""
    rows = judge_rows(records, evaluator)
    rows = rows[rows["status"] == STATUS_OK].rename(columns={"pass": "pass_"})
    mine = labels[labels["evaluator"] == evaluator]
    who = mine.groupby("sid")["reviewer"].agg(tuple).to_dict() if len(mine) else {}
    found = []
    for r in rows.itertuples(index=False):
        meta = _meta(getattr(r, "evaluation_metadata", None))
        output = _column(r, "task_output")
        found.append(Reviewable(
            sid=str(r.sid), evaluator=evaluator, verdict=answer(r, scale),
            passed=_column(r, "pass_"), score=_column(r, "score"),
            explanation=_column(r, "explanation"), input=_column(r, "evaluated_model_input"),
            output=output if output is not None else _column(r, "evaluated_model_output"),
            gold_answer=_column(r, "evaluated_model_gold_answer"),
            context=_column(r, "evaluated_model_retrieved_context"), p_pass=_p_pass(r, meta),
            judges=_panel(meta, scale), reviewers=tuple(who.get(str(r.sid), ()))))
    return [x for x in found if x.verdict is not None]
