"""Judges of retrieval-augmented answers: `faithfulness` (the output's claims against the
retrieved context), `context_relevance` (the context against the input) and
`context_recall` (the gold answer against the context), as Ragas defines them, read
claim by claim: the score is the share of claims (passages, statements) that hold, and
the explanation names the ones that do not.
"""

from __future__ import annotations

from typing import Any

from patronus_tasks.define.step_results import EvaluationResult
from patronus_tasks.evaluators.base import cut
from patronus_tasks.evaluators.forms import Reading, _strict, explanation_of, out_of_scale
from patronus_tasks.evaluators.judge import Judge, passages, split_options


class ItemsForm:
    """A list of items, each judged yes or no: ``{"<key>": [{"<text>": ..., "<flag>": bool}]}``."""

    def __init__(self, key: str, text: str, flag: str, what: str, empty_score: float | None) -> None:
        self.key, self.text, self.flag, self.what, self.empty_score = key, text, flag, what, empty_score

    def schema(self) -> dict[str, Any]:
        item = _strict({self.text: {"type": "string"}, self.flag: {"type": "boolean"}})
        return _strict({self.key: {"type": "array", "items": item},
                        "explanation": {"type": "string"}})

    def instruction(self) -> str:
        return (f'Answer with one JSON object and nothing else: {{"{self.key}": [{{"{self.text}": '
                f'"...", "{self.flag}": true or false}}, ...], "explanation": "<one sentence>"}}.')

    def describe(self) -> str:
        return f"each {self.what} {self.flag} or not"

    def tokens(self) -> dict[str, float]:
        return {}

    def read(self, data: dict[str, Any], weights: dict[str, float] | None) -> Reading:
        items = data.get(self.key)
        if not isinstance(items, list) or not all(
                isinstance(i, dict) and isinstance(i.get(self.flag), bool) for i in items):
            raise out_of_scale(f"{self.key!r} must be a list of objects with a boolean "
                               f"{self.flag!r}", data)
        if not items and self.empty_score is None:
            raise out_of_scale(f"{self.key!r} is empty: the judge found no {self.what} to judge", data)
        failing = [str(i.get(self.text, "")) for i in items if not i[self.flag]]
        score = (len(items) - len(failing)) / len(items) if items else float(self.empty_score or 0)
        return Reading(score, None, f"{len(items) - len(failing)}/{len(items)}", explanation_of(data),
                       {self.key: items})


FAITHFULNESS_PROMPT = """Break the model output into the factual claims it makes (short, each
standing on its own). For each claim, say whether the retrieved context supports it: true
only when the context states it or it follows from the context; false when the context
contradicts it or says nothing of it. General knowledge does not count.

User input:
{input}

Retrieved context:
{context}

Model output:
{output}"""


class Faithfulness(Judge):
    factory = "faithfulness"
    default_prompt = FAITHFULNESS_PROMPT

    async def evaluate(self, evaluated_model_retrieved_context: Any,
                       evaluated_model_output: str | None = None,
                       evaluated_model_input: str | None = None) -> EvaluationResult:
        result = await self.judge({"output": evaluated_model_output, "input": evaluated_model_input,
                                   "context": passages(evaluated_model_retrieved_context)})
        return _naming(result, "claims", "claim", "supported", "unsupported claims")


def _naming(result: EvaluationResult, key: str, text: str, flag: str, title: str) -> EvaluationResult:
    """The result with the items that did not hold listed first in its explanation."""
    items = (result.metadata or {}).get(key)
    if not isinstance(items, list):  # a panel: each judge's items are in its metadata
        return result
    failing = [cut(str(i.get(text, "")), 200) for i in items if not i.get(flag)]
    if not failing:
        return result
    listed = "\n".join(f"- {f}" for f in failing)
    return result.model_copy(update={"explanation": f"{title} ({len(failing)}):\n{listed}"
                                     + (f"\n{result.explanation}" if result.explanation else "")})


def faithfulness(*, threshold: float = 1.0, **options: Any) -> Faithfulness:
    """Is every claim of the output supported by the retrieved context
    (``evaluated_model_retrieved_context``: a list of passages or one text)? The judge lists
    the output's claims and marks each; the score is the share supported (an output with
    no claim scores 1), the unsupported claims are listed in the explanation and all claims
    kept in the metadata. Passes at ``threshold`` (default: every claim). Judge options as
    `llm_judge`'s."""
    own, step = split_options(options)
    return Faithfulness(form=ItemsForm("claims", "claim", "supported", "claim", 1.0),
                        criteria="every claim supported by the retrieved context",
                        threshold=threshold, opts=own, step=step)


CONTEXT_RELEVANCE_PROMPT = """For each numbered passage of the retrieved context, say whether it is
relevant to answering the user's input (it holds information the answer needs). Give
one entry per passage, in order, its "passage" being its number.

User input:
{input}

Retrieved context:
{context}"""


class ContextRelevance(Judge):
    factory = "context_relevance"
    default_prompt = CONTEXT_RELEVANCE_PROMPT

    async def evaluate(self, evaluated_model_input: str,
                       evaluated_model_retrieved_context: Any) -> EvaluationResult:
        given = passages(evaluated_model_retrieved_context)
        result = await self.judge({"input": evaluated_model_input, "context": given})
        items = (result.metadata or {}).get("passages")
        if isinstance(items, list) and len(items) != len(given):
            raise out_of_scale(f"{len(given)} passages were given, the judge marked {len(items)}",
                               items)
        return _naming(result, "passages", "passage", "relevant", "passages not relevant")


def context_relevance(*, threshold: float = 0.5, **options: Any) -> ContextRelevance:
    """How much of the retrieved context is relevant to the input: the judge marks each
    passage; the score is the share relevant (the others named in the explanation).
    Passes at ``threshold``. Judge options as `llm_judge`'s."""
    own, step = split_options(options)
    return ContextRelevance(form=ItemsForm("passages", "passage", "relevant", "passage", None),
                            criteria="the retrieved passages are relevant to the input",
                            threshold=threshold, opts=own, step=step)


CONTEXT_RECALL_PROMPT = """Break the gold answer into its statements. For each, say whether it can
be attributed to the retrieved context (the context states it or it follows from it).

User input:
{input}

Retrieved context:
{context}

Gold answer:
{gold_answer}"""


class ContextRecall(Judge):
    factory = "context_recall"
    default_prompt = CONTEXT_RECALL_PROMPT

    async def evaluate(self, evaluated_model_gold_answer: Any,
                       evaluated_model_retrieved_context: Any,
                       evaluated_model_input: str | None = None) -> EvaluationResult:
        result = await self.judge({"input": evaluated_model_input,
                                   "gold_answer": evaluated_model_gold_answer,
                                   "context": passages(evaluated_model_retrieved_context)})
        return _naming(result, "statements", "statement", "attributed", "statements not in the context")


def context_recall(*, threshold: float = 0.5, **options: Any) -> ContextRecall:
    """How much of the gold answer the retrieved context holds: the judge splits the gold
    answer into statements and marks each attributable to the context or not; the score
    is the share attributable (the others named). Passes at ``threshold``. Judge options
    as `llm_judge`'s."""
    own, step = split_options(options)
    return ContextRecall(form=ItemsForm("statements", "statement", "attributed", "statement", None),
                         criteria="the retrieved context holds the gold answer",
                         threshold=threshold, opts=own, step=step)
