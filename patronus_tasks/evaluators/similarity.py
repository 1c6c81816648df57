"""Similarity to the gold answer, offline, through the reference libraries: edit distances
and token-set ratios (`rapidfuzz`), ROUGE (Google's `rouge-score`), BLEU and chrF
(`sacrebleu`). Each score is the library's own value on the same strings, in [0, 1]
(sacrebleu's 0-100 divided by 100); against a list of gold answers, the best (BLEU and
chrF: all of them as references, as those metrics define it).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from patronus_tasks.define.step_results import EvaluationResult
from patronus_tasks.evaluators.base import (
    Check,
    best,
    check_bool,
    check_choice,
    check_threshold,
    cut,
    reads,
    scored,
)
from patronus_tasks.exceptions import ConfigError, DatasetError


def _similarity(metric: str) -> Callable[[str, str], float]:
    from rapidfuzz import fuzz
    from rapidfuzz.distance import Indel, JaroWinkler, Levenshtein

    metrics: dict[str, Callable[[str, str], float]] = {
        "levenshtein": Levenshtein.normalized_similarity,
        "indel": Indel.normalized_similarity,
        "jaro_winkler": JaroWinkler.similarity,
        "token_set": lambda a, b: fuzz.token_set_ratio(a, b) / 100,
        "token_sort": lambda a, b: fuzz.token_sort_ratio(a, b) / 100,
        "partial": lambda a, b: fuzz.partial_ratio(a, b) / 100,
    }
    return metrics[metric]


SIMILARITY_METRICS = ("levenshtein", "jaro_winkler", "token_set", "token_sort", "indel", "partial")


class _Lazy(Check):
    """A check holding a library object built on first use (not pickled: each process
    builds its own)."""

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_scorer"}

    def scorer(self) -> Any:
        found = self.__dict__.get("_scorer")
        if found is None:
            found = self.__dict__["_scorer"] = self.build()
        return found

    def build(self) -> Any:
        raise NotImplementedError

    def warm(self) -> None:
        self.scorer()


class StringSimilarity(_Lazy):
    factory = "string_similarity"

    def build(self) -> Any:
        return _similarity(self.options["metric"])

    @reads(gold="texts")
    def evaluate(self, evaluated_model_gold_answer: Any = None,
                 evaluated_model_output: Any = None) -> EvaluationResult:
        fold = str.casefold if self.options["ignore_case"] else str
        score, _ = best(fold(evaluated_model_output),
                        [fold(g) for g in evaluated_model_gold_answer], self.scorer())
        return scored(float(score), self.options["threshold"])


def string_similarity(*, metric: str = "levenshtein", threshold: float = 0.8,
                      ignore_case: bool = False, **step: Any) -> StringSimilarity:
    """How close the output is to the gold answer, through `rapidfuzz`: ``"levenshtein"``
    (normalised edit similarity, 1 - distance / longer length), ``"jaro_winkler"``,
    ``"token_set"`` (``fuzz.token_set_ratio``: word order and repeats ignored),
    ``"token_sort"``, ``"indel"`` (``fuzz.ratio``) or ``"partial"`` (best-matching
    substring). Score in [0, 1]; passes at ``threshold``. ``ignore_case`` compares
    case-folded text (off: the library's value on the strings as they are)."""
    owner = "string_similarity"
    options = {"metric": check_choice(owner, "metric", metric, SIMILARITY_METRICS),
               "threshold": check_threshold(owner, threshold),
               "ignore_case": check_bool(owner, "ignore_case", ignore_case)}
    return StringSimilarity(options, f"{metric} similarity to the gold answer >= {threshold:g}", step)


ROUGE_KINDS = ("rouge1", "rouge2", "rougeL", "rougeLsum")


class Rouge(_Lazy):
    factory = "rouge"

    def build(self) -> Any:
        from rouge_score import rouge_scorer, tokenizers

        tokenizer = (UnicodeTokenizer() if self.options["tokenizer"] == "unicode"
                     else tokenizers.DefaultTokenizer(use_stemmer=self.options["use_stemmer"]))
        return rouge_scorer.RougeScorer([self.options["kind"]], tokenizer=tokenizer)

    @reads(gold="texts")
    def evaluate(self, evaluated_model_gold_answer: Any = None,
                 evaluated_model_output: Any = None) -> EvaluationResult:
        kind, scorer = self.options["kind"], self.scorer()
        texts = self._readable(evaluated_model_gold_answer, scorer)
        parts = {g: scorer.score(g, evaluated_model_output)[kind] for g in texts}
        gold = max(parts, key=lambda g: parts[g].fmeasure)
        s = parts[gold]
        return scored(float(s.fmeasure), self.options["threshold"], precision=s.precision,
                      recall=s.recall)

    def _readable(self, texts: list[str], scorer: Any) -> list[str]:
        """The gold answers the tokenizer reads a word of (the scorer's own, as `build`
        gave it). None: every output would score 0 however right, that row's error;
        another acceptable answer beside one in another script is scored alone."""
        kept = [t for t in texts if scorer._tokenizer.tokenize(t)]
        if not kept:
            raise DatasetError(f"rouge: the gold answer {cut(texts[0], 60)!r} has no word "
                               "rouge-score's tokenizer keeps (its default keeps only a-z and "
                               "0-9): give rouge(tokenizer='unicode') for text in other scripts.")
        return kept


class UnicodeTokenizer:
    """Words of any script (``\\w+``), case-folded: for ROUGE beyond English, where the
    library's default tokenizer keeps only a-z and 0-9 (a Russian answer scored 0)."""

    def tokenize(self, text: str) -> list[str]:
        return re.findall(r"\w+", text.casefold())


def rouge(*, kind: str = "rougeL", threshold: float = 0.5, use_stemmer: bool = False,
          tokenizer: str = "default", **step: Any) -> Rouge:
    """ROUGE F-measure of the output against the gold answer, through Google's
    `rouge-score` (``rouge_scorer.RougeScorer``): ``kind`` ``"rouge1"``, ``"rouge2"``,
    ``"rougeL"`` (longest common subsequence) or ``"rougeLsum"``; ``use_stemmer`` as the
    library's (Porter stemming, off by default as in Hugging Face's ``evaluate``).
    Precision and recall go to the metadata. Passes at ``threshold``. ``tokenizer``:
    ``"default"`` (the library's: a-z and 0-9 only; a gold answer with no such word is that
    row's error, not a 0) or ``"unicode"`` (runs of letters of any script, case-folded, no
    stemming: an unspaced Chinese or Thai sentence is one word)."""
    owner = "rouge"
    check_choice(owner, "tokenizer", tokenizer, ("default", "unicode"))
    if tokenizer == "unicode" and use_stemmer:
        raise ConfigError("rouge: use_stemmer is the default tokenizer's (Porter, English); "
                          "tokenizer='unicode' does not stem.")
    options = {"tokenizer": tokenizer, "kind": check_choice(owner, "kind", kind, ROUGE_KINDS),
               "threshold": check_threshold(owner, threshold),
               "use_stemmer": check_bool(owner, "use_stemmer", use_stemmer)}
    return Rouge(options, f"{kind} F-measure with the gold answer >= {threshold:g}", step)


class _Sacre(_Lazy):
    @reads(gold="texts")
    def evaluate(self, evaluated_model_gold_answer: Any = None,
                 evaluated_model_output: Any = None) -> EvaluationResult:
        result = self.scorer().sentence_score(evaluated_model_output,
                                              evaluated_model_gold_answer)
        return scored(result.score / 100, self.options["threshold"], str(result))


class Bleu(_Sacre):
    factory = "bleu"

    def build(self) -> Any:
        from sacrebleu.metrics import BLEU

        return BLEU(tokenize=self.options["tokenize"], smooth_method=self.options["smooth_method"],
                    lowercase=self.options["lowercase"], effective_order=True)


def bleu(*, threshold: float = 0.3, tokenize: str = "13a", smooth_method: str = "exp",
         lowercase: bool = False, **step: Any) -> Bleu:
    """Sentence BLEU of the output against the gold answer(s) as references, through
    `sacrebleu` (``BLEU(effective_order=True).sentence_score``, as ``sacrebleu.sentence_bleu``:
    its ``13a`` tokenizer and ``exp`` smoothing by default), divided by 100. Passes at
    ``threshold``."""
    owner = "bleu"
    options = {"threshold": check_threshold(owner, threshold),
               "tokenize": check_choice(owner, "tokenize", tokenize,
                                        ("13a", "none", "intl", "char", "zh", "ja-mecab",
                                         "ko-mecab", "flores101", "flores200")),
               "smooth_method": check_choice(owner, "smooth_method", smooth_method,
                                             ("exp", "floor", "add-k", "none")),
               "lowercase": check_bool(owner, "lowercase", lowercase)}
    return Bleu(options, f"sentence BLEU with the gold answer >= {threshold:g}", step)


class Chrf(_Sacre):
    factory = "chrf"

    def build(self) -> Any:
        from sacrebleu.metrics import CHRF

        return CHRF(char_order=self.options["char_order"], word_order=self.options["word_order"],
                    beta=self.options["beta"], lowercase=self.options["lowercase"])


def chrf(*, threshold: float = 0.5, word_order: int = 0, char_order: int = 6, beta: int = 2,
         lowercase: bool = False, **step: Any) -> Chrf:
    """Sentence chrF of the output against the gold answer(s), through `sacrebleu`
    (``CHRF().sentence_score``, as ``sacrebleu.sentence_chrf``); ``word_order=2`` is chrF++.
    Divided by 100; passes at ``threshold``."""
    owner = "chrf"
    options = {"threshold": check_threshold(owner, threshold),
               "word_order": check_choice(owner, "word_order", word_order, (0, 1, 2)),
               "char_order": check_choice(owner, "char_order", char_order, tuple(range(1, 11))),
               "beta": check_choice(owner, "beta", beta, (1, 2, 3)),
               "lowercase": check_bool(owner, "lowercase", lowercase)}
    return Chrf(options, f"chrF with the gold answer >= {threshold:g}", step)
