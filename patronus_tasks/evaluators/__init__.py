"""Ready evaluators: the judgments users would otherwise write by hand.

Each name is a factory returning an ordinary `Evaluator` of this package, named after the
factory (or ``name=``): use it in ``evaluators=[...]``, in chains, with ``cache=``,
repeats and gates like your own. Every option has a documented default and a wrong one
is a `ConfigError` at construction. They read the output (the task's, or the dataset's
``evaluated_model_output`` without a task) and, where they need it, the gold answer
(``evaluated_model_gold_answer``: one text, or a list of acceptable ones), the input or
the retrieved context. Scores are in [0, 1]; ``pass`` is ``score >= threshold`` unless
the check is a yes/no one (score 1 or 0).

- text (`text`): `exact_match`, `contains`, `regex`, `numeric_close`, `token_f1`, `refusal`
- similarity (`similarity`): `string_similarity` (rapidfuzz), `rouge` (rouge-score),
  `bleu` and `chrf` (sacrebleu)
- JSON (`structured`): `json_valid`, `json_schema` (jsonschema), `json_equal`
- SQL (`sql`): `sql_result_match`, `sql_equivalent` (sqlglot)
- safety (`safety`): `pii`
- LLM judges on any OpenAI-compatible endpoint (`judge`, `rag`, `pairwise`): `llm_judge`,
  `factuality`, `answer_relevance`, `faithfulness`, `context_relevance`,
  `context_recall`, `pairwise_judge`; a judge that gives no verdict raises `JudgeError`
  (the row is *unscored*: out of pass rates, counted apart)
- judge calibration (`calibration`): `calibrate`, `judge_agreement`
- trajectories, from the task's spans (`agentic`): `tool_calls_match`, `tool_args_valid`,
  `budget`, `span_matches`, `no_loops`, `trajectory_judge` (an LLM judge)

May import: `define`, `agents` (tools' schemas), `trace`, `results` (the agreement, a
baseline's outputs), `http`, `openai` and the ground modules; `calibration` runs an
experiment through `api`. Nothing here imports Prefect (pyproject's import contracts); each
module, and the libraries beneath, on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from patronus_tasks.evaluators.agentic import (
        budget,
        no_loops,
        span_matches,
        tool_args_valid,
        tool_calls_match,
        trajectory_judge,
    )
    from patronus_tasks.evaluators.calibration import Calibration, calibrate, judge_agreement
    from patronus_tasks.evaluators.judge import Judge, answer_relevance, factuality, llm_judge
    from patronus_tasks.evaluators.pairwise import pairwise_judge
    from patronus_tasks.evaluators.rag import context_recall, context_relevance, faithfulness
    from patronus_tasks.evaluators.safety import pii
    from patronus_tasks.evaluators.similarity import bleu, chrf, rouge, string_similarity
    from patronus_tasks.evaluators.sql import sql_equivalent, sql_result_match
    from patronus_tasks.evaluators.structured import json_equal, json_schema, json_valid
    from patronus_tasks.evaluators.text import (
        contains,
        exact_match,
        numeric_close,
        refusal,
        regex,
        token_f1,
    )
    from patronus_tasks.exceptions import JudgeError

#: Where each name lives: a module is imported when one of its names is first used (the
#: judges' HTTP client and the calibration's results reader cost ~140 ms to import, which
#: a run of offline checks never needs).
_HOMES = {
    **dict.fromkeys(["Calibration", "calibrate", "judge_agreement"], "evaluators.calibration"),
    **dict.fromkeys(["Judge", "answer_relevance", "factuality", "llm_judge"], "evaluators.judge"),
    "pairwise_judge": "evaluators.pairwise",
    **dict.fromkeys(["context_recall", "context_relevance", "faithfulness"], "evaluators.rag"),
    "pii": "evaluators.safety",
    **dict.fromkeys(["bleu", "chrf", "rouge", "string_similarity"], "evaluators.similarity"),
    **dict.fromkeys(["sql_equivalent", "sql_result_match"], "evaluators.sql"),
    **dict.fromkeys(["json_equal", "json_schema", "json_valid"], "evaluators.structured"),
    **dict.fromkeys(["contains", "exact_match", "numeric_close", "refusal", "regex", "token_f1"],
                    "evaluators.text"),
    "JudgeError": "exceptions",
    **dict.fromkeys(["budget", "no_loops", "span_matches", "tool_args_valid", "tool_calls_match",
                     "trajectory_judge"], "evaluators.agentic"),
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'patronus_tasks.evaluators' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"patronus_tasks.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


__all__ = [
    "Calibration",
    "Judge",
    "JudgeError",
    "answer_relevance",
    "bleu",
    "budget",
    "calibrate",
    "chrf",
    "contains",
    "context_recall",
    "context_relevance",
    "exact_match",
    "factuality",
    "faithfulness",
    "json_equal",
    "json_schema",
    "json_valid",
    "judge_agreement",
    "llm_judge",
    "no_loops",
    "numeric_close",
    "pairwise_judge",
    "pii",
    "refusal",
    "regex",
    "rouge",
    "span_matches",
    "sql_equivalent",
    "sql_result_match",
    "string_similarity",
    "token_f1",
    "tool_args_valid",
    "tool_calls_match",
    "trajectory_judge",
]
