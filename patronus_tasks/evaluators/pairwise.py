"""`pairwise_judge`: this output against a baseline experiment's output for the same row.

The judge is asked twice, the two answers in one order and then the other: models
prefer the first (or second) answer they see, so a verdict counts only when it survives
the swap. Both times the same answer wins: a win (score 1) or a loss (0); a tie, or two
askings that disagree: a tie (0.5).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from patronus_tasks.define.row import Row
from patronus_tasks.define.step_results import EvaluationResult
from patronus_tasks.evaluators.forms import Choices
from patronus_tasks.evaluators.judge import Judge, split_options
from patronus_tasks.exceptions import ConfigError, DatasetError

PAIRWISE_PROMPT = """Compare two answers to the user's input and say which is better by these
criteria:
{criteria}

User input:
{input}

Gold answer (for reference):
{gold_answer}

[Answer A]
{output_a}

[Answer B]
{output_b}

Choose "A" if answer A is better, "B" if answer B is better, "tie" if neither is."""

_OUTCOMES = {("this", "this"): 1.0, ("baseline", "baseline"): 0.0}


class PairwiseJudge(Judge):
    factory = "pairwise_judge"
    default_prompt = PAIRWISE_PROMPT

    def __init__(self, baseline: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.baseline = baseline if isinstance(baseline, str | Path) else _location(baseline)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in super().__getstate__().items() if k != "_outputs"}

    def cache_identity(self) -> dict[str, Any]:
        return {**super().cache_identity(), "baseline": str(self.baseline)}

    async def setup(self) -> None:
        self.outputs()

    def outputs(self) -> dict[str, str]:
        """The baseline's output per sample id (its last task; its first repeat)."""
        found: dict[str, str] | None = self.__dict__.get("_outputs")
        if found is None:
            from patronus_tasks.results.store import load_experiment

            df = load_experiment(self.baseline).to_dataframe()
            df = df[df["task_output"].notna()].sort_values(["link_index"], kind="stable")
            found = {str(sid): str(out) for sid, out in
                     df.groupby("sid", sort=False)["task_output"].last().items()}
            self.__dict__["_outputs"] = found
        return found

    async def evaluate(self, row: Row, evaluated_model_output: str | None = None,
                       evaluated_model_input: str | None = None,
                       evaluated_model_gold_answer: Any = None) -> EvaluationResult:
        base = self.outputs().get(row.sid)
        if base is None:
            raise DatasetError(f"pairwise_judge: the baseline {str(self.baseline)!r} has no output for "
                               f"row sid={row.sid}; compare experiments run on the same dataset.")
        fields = {"input": evaluated_model_input, "gold_answer": evaluated_model_gold_answer}
        first = self.messages({**fields, "output_a": evaluated_model_output, "output_b": base})
        second = self.messages({**fields, "output_a": base, "output_b": evaluated_model_output})
        answers = [a for batch in (await self.ask_all(first), await self.ask_all(second)) for a in batch]
        half = len(answers) // 2
        picks = [_side(a.reading.raw, swapped=i >= half) for i, a in enumerate(answers)]
        orders = (_majority(picks[:half]), _majority(picks[half:]))
        score = _OUTCOMES.get(orders, 0.5)
        result = self.result(answers, picks=picks)
        verdict = {1.0: "better than the baseline", 0.0: "worse than the baseline"}.get(
            score, "a tie" + (" (the two orders disagree)" if orders[0] != orders[1] else ""))
        return result.model_copy(update={"score_raw": score, "pass_": score >= self.threshold,
                                         "explanation": f"{verdict}\n{result.explanation or ''}".strip()})


def _majority(picks: list[str]) -> str:
    counts = Counter(picks).most_common()
    return counts[0][0] if len(counts) == 1 or counts[0][1] > counts[1][1] else "tie"


def _side(choice: Any, swapped: bool) -> str:
    if choice == "tie":
        return "tie"
    return "this" if (choice == "A") != swapped else "baseline"


def _location(baseline: Any) -> str:
    folder = getattr(baseline, "location", None) or getattr(baseline, "path", None)
    if folder is None:
        raise ConfigError(f"pairwise_judge: baseline must be an Experiment, its results folder or "
                          f"URL, or an experiment's name, not {baseline!r}.")
    return str(folder)


def pairwise_judge(baseline: Any, *, criteria: str = "Which answer is more correct, complete and "
                   "helpful for the user's input?", threshold: float = 0.5,
                   **options: Any) -> PairwiseJudge:
    """This output against ``baseline``'s (an `Experiment`, its results folder or URL, or a
    name `patronus-tasks show` takes) for the same row (by sample id), by ``criteria``:
    asked in both orders, a win (1) or a loss (0) only when both agree, else a tie (0.5).
    Passes at ``threshold`` (default: not worse than the baseline). Judge options as
    `llm_judge`'s; a panel votes in each order."""
    own, step = split_options(options)
    own.setdefault("aggregate", "majority")
    return PairwiseJudge(baseline, form=Choices({"A": 1.0, "B": 0.0, "tie": 0.5}),
                         criteria=criteria, threshold=threshold, opts=own, step=step)
