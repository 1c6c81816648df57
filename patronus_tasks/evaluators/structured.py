"""JSON checks, offline: valid JSON, valid against a JSON Schema (the `jsonschema`
library), equal to the gold answer's JSON (key order ignored, a partial score).

An output in a Markdown code fence (```json ... ```), as chat models often answer, is
read from inside the fence unless ``strip_fences=False``. An output or gold answer that is
a parsed value already (a dict, a list, a number: a JSON dataset's objects) is that JSON.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from patronus_tasks.define.step_results import EvaluationResult
from patronus_tasks.evaluators.base import (
    Check,
    check_bool,
    check_choice,
    check_threshold,
    cut,
    reads,
    relative_closeness,
    scored,
    verdict,
)
from patronus_tasks.exceptions import ConfigError, DatasetError

# A Markdown code fence anywhere in the output ("Here you go: ```json ...```"), the first.
_FENCE = re.compile(r"```[\w-]*[ \t]*\n(.*?)\n?[ \t]*```", re.DOTALL)
_MAX_ERRORS = 10


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is Python's, not JSON's (RFC 8259 has no NaN or Infinity)")


def parse_json(text: Any, strip_fences: bool) -> tuple[Any, str | None]:
    """``text`` parsed, or (None, what is wrong with it). A value that is not text is
    parsed JSON already: itself, if JSON can write it."""
    if not isinstance(text, str):
        try:
            json.dumps(text, allow_nan=False)
        except (TypeError, ValueError) as exc:
            return None, f"not JSON: {exc}"
        return text, None
    fenced = _FENCE.search(text) if strip_fences and "```" in text else None
    if fenced:
        text = fenced.group(1)
    try:
        return json.loads(text, parse_constant=_not_json), None
    except ValueError as exc:
        if not isinstance(exc, json.JSONDecodeError):
            return None, f"not valid JSON: {exc}"
        where = " (in its code fence)" if fenced else ""
        return None, f"not valid JSON{where}: {exc.msg} at line {exc.lineno} column {exc.colno}"


class JsonValid(Check):
    factory = "json_valid"

    @reads(output="value")
    def evaluate(self, evaluated_model_output: Any = None) -> EvaluationResult:
        value, problem = parse_json(evaluated_model_output, self.options["strip_fences"])
        if problem is None and self.options["require_container"] \
                and not isinstance(value, dict | list):
            kind = _KINDS.get(type(value), "a number")
            problem = f"JSON {kind}, not an object or array (require_container)"
        return verdict(problem is None, problem)


_KINDS = {str: "a string", bool: "true or false", type(None): "null"}


def json_valid(*, strip_fences: bool = True, require_container: bool = False,
               **step: Any) -> JsonValid:
    """The output parses as JSON (``json.loads``; inside a Markdown code fence when
    ``strip_fences``); a parsed value (a dict, list, number) is JSON. With
    ``require_container``, only an object or an array passes (autoevals' ``ValidJSON``:
    ``"1"`` fails). Score 1 or 0; a failure says where the JSON breaks."""
    owner = "json_valid"
    return JsonValid({"strip_fences": check_bool(owner, "strip_fences", strip_fences),
                      "require_container": check_bool(owner, "require_container",
                                                      require_container)},
                     "is a JSON object or array" if require_container else "is valid JSON", step)


def _load_schema(schema: Any) -> dict[str, Any]:
    if isinstance(schema, Path) or (isinstance(schema, str) and not schema.lstrip().startswith("{")):
        path = Path(schema)
        if not path.is_file():
            raise ConfigError(f"json_schema: schema {str(schema)!r} is neither a JSON Schema "
                              "(a dict or JSON text) nor a file; give one of those.")
        schema = path.read_text(encoding="utf-8")
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"json_schema: the schema is not valid JSON: {exc}.") from None
    if not isinstance(schema, dict | bool):
        raise ConfigError(f"json_schema: schema must be a dict, JSON text or a file path, "
                          f"not {type(schema).__name__}.")
    return schema  # type: ignore[return-value]


#: Where a `JsonSchema` keeps its compiled validator (not pickled: Dask ships the check).
_COMPILED = "_compiled_validator"


class JsonSchema(Check):
    factory = "json_schema"

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != _COMPILED}

    def _validator(self) -> Any:
        # Kept under a name of its own: an instance attribute named like this method
        # would hide it, and the second call would call the validator itself.
        found = self.__dict__.get(_COMPILED)
        if found is None:
            import jsonschema

            schema = self.options["schema"]
            found = self.__dict__[_COMPILED] = jsonschema.validators.validator_for(schema)(schema)
        return found

    def warm(self) -> None:
        self._validator()

    @reads(output="value")
    def evaluate(self, evaluated_model_output: Any = None) -> EvaluationResult:
        value, problem = parse_json(evaluated_model_output, self.options["strip_fences"])
        if problem is not None:
            return verdict(False, problem)
        errors = sorted(self._validator().iter_errors(value), key=lambda e: list(e.absolute_path))
        if not errors:
            return verdict(True)
        lines = [f"{_where(e.absolute_path)}: {cut(e.message, 200)}" for e in errors[:_MAX_ERRORS]]
        more = f"\n(+{len(errors) - _MAX_ERRORS} more)" if len(errors) > _MAX_ERRORS else ""
        return verdict(False, f"{len(errors)} schema error(s):\n" + "\n".join(lines) + more,
                       errors=len(errors))


def _where(path: Any) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)


def json_schema(schema: dict[str, Any] | str | Path, *, strip_fences: bool = True,
                **step: Any) -> JsonSchema:
    """The output is JSON valid against ``schema`` (a dict, JSON text or a file path),
    checked with the `jsonschema` library in the draft the schema's ``$schema`` names
    (2020-12 without one). A failure lists each error with where it is (``$.items[2].price:
    -1 is less than the minimum of 0``; the first 10). The schema itself is checked at
    construction. Score 1 or 0."""
    import jsonschema

    loaded = _load_schema(schema)
    try:
        jsonschema.validators.validator_for(loaded).check_schema(loaded)
    except jsonschema.SchemaError as exc:
        raise ConfigError(f"json_schema: the schema is not a valid JSON Schema: {exc.message} "
                          f"(at {_where(exc.absolute_path)}).") from None
    title = loaded.get("title") if isinstance(loaded, dict) else None
    return JsonSchema({"schema": loaded, "strip_fences": check_bool("json_schema", "strip_fences",
                                                                     strip_fences)},
                      f"is valid against the JSON schema{f' {title!r}' if title else ''}", step)


def similarity(a: Any, b: Any) -> float:
    """How much of two JSON values agrees, in [0, 1]: objects by the mean over the union of
    their keys (a key on one side only 0), arrays position by position over the longer,
    numbers equal by value (1 and 1.0 alike), anything else equal or not."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = a.keys() | b.keys()
        return sum(similarity(a[k], b[k]) for k in keys if k in a and k in b) / len(keys) if keys else 1.0
    if isinstance(a, list) and isinstance(b, list):
        return _positions(a, b, similarity)
    if _number(a) and _number(b):
        return float(math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0))
    return float(type(a) is type(b) and a == b)


def _positions(a: list[Any], b: list[Any], leaf: Any) -> float:
    longest = max(len(a), len(b))
    return sum(leaf(x, y) for x, y in zip(a, b, strict=False)) / longest if longest else 1.0


def graded(a: Any, b: Any) -> float:
    """autoevals' ``JSONDiff`` (its defaults): objects by the mean over the union of their
    keys, an absent key read as null; arrays position by position over the longer; texts by
    Levenshtein similarity; numbers by ``NumericDiff``; null against null 1, against
    anything else 0; other pairs (true against 1) by the similarity of their JSON texts."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = a.keys() | b.keys()
        return sum(graded(a.get(k), b.get(k)) for k in keys) / len(keys) if keys else 1.0
    if isinstance(a, list) and isinstance(b, list):
        return _positions(a, b, graded)
    if isinstance(a, str) and isinstance(b, str):
        return _levenshtein(a, b)
    if _number(a) and _number(b):
        return relative_closeness(a, b)
    if a is None or b is None:
        return float(a is b)
    return _levenshtein(*(json.dumps(v, separators=(",", ":"), sort_keys=True) for v in (a, b)))


def _levenshtein(a: str, b: str) -> float:
    from rapidfuzz.distance import Levenshtein

    return float(Levenshtein.normalized_similarity(a, b))


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


class JsonEqual(Check):
    factory = "json_equal"

    @reads(gold="value", output="value")
    def evaluate(self, evaluated_model_gold_answer: Any = None,
                 evaluated_model_output: Any = None) -> EvaluationResult:
        got, problem = parse_json(evaluated_model_output, self.options["strip_fences"])
        if problem is not None:
            return verdict(False, f"the output is {problem}", score=0.0)
        want, problem = parse_json(evaluated_model_gold_answer, True)
        if problem is not None:
            raise DatasetError(f"json_equal: the gold answer is {problem}; fix the dataset's "
                               "evaluated_model_gold_answer (it must be JSON).")
        score = (graded if self.options["leaves"] == "graded" else similarity)(got, want)
        return scored(score, self.options["threshold"],
                      None if score == 1 else f"{score:.1%} of the JSON agrees")


def json_equal(*, threshold: float = 1.0, strip_fences: bool = True, leaves: str = "exact",
               **step: Any) -> JsonEqual:
    """The output's JSON equals the gold answer's (JSON text, or a parsed value), key order
    ignored. The score is the share that agrees: objects the mean over the union of both
    objects' keys (a key on one side only scores 0: an extra key in the output lowers the
    score, as does a null against an absent key), arrays position by position over the
    longer, numbers by value (1 and 1.0 alike; true is not 1), so a nearly right object
    scores near 1; passes at ``threshold`` (default: all of it). ``leaves="graded"`` scores
    as autoevals' ``JSONDiff``: texts by Levenshtein similarity, numbers by ``NumericDiff``
    (1 - |a - b| / (|a| + |b|)), an absent key as null."""
    owner = "json_equal"
    return JsonEqual({"threshold": check_threshold(owner, threshold),
                      "strip_fences": check_bool(owner, "strip_fences", strip_fences),
                      "leaves": check_choice(owner, "leaves", leaves, ("exact", "graded"))},
                     "the same JSON as the gold answer", step)
