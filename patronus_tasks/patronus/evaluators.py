"""Patronus remote evaluators over the Patronus v1 HTTP API.

Before the first row, the evaluator is looked up (``GET /v1/evaluators``) and the
criteria found by name (``GET /v1/evaluator-criteria``), created when missing, or given
a new revision when its config differs and ``allow_update=True``. Each row is then
scored with ``POST /v1/evaluate``.
"""

from __future__ import annotations

from typing import Any

from patronus_tasks.define.step_results import EvaluationResult, TaskResult, Usage
from patronus_tasks.define.steps import Evaluator
from patronus_tasks.exceptions import ConfigError, JudgeError, RemoteAPIError
from patronus_tasks.http import Endpoint
from patronus_tasks.trace.spans import span


def _config_diff(have: dict[str, Any], want: dict[str, Any]) -> list[str]:
    keys = sorted(set(have) | set(want))
    return [f"{k}: {have.get(k)!r} on the server, {want.get(k)!r} given"
            for k in keys if have.get(k) != want.get(k)]


def context_list(value: Any) -> list[str] | None:
    """A retrieved context as the API takes it: a list of str."""
    if value is None:
        return None
    return [value] if isinstance(value, str) else [str(v) for v in value]


class RemoteEvaluator(Evaluator):
    """A Patronus evaluator (``custom-large``, ``judge``, ``lynx``...) with a criteria."""

    is_judge = True  # a timeout is no verdict

    def __init__(self, evaluator_id_or_alias: str, criteria: str | None = None, *,
                 criteria_config: dict[str, Any] | None = None, allow_update: bool = False,
                 explain_strategy: str = "always", endpoint: Endpoint, name: str | None = None,
                 timeout_seconds: float | None = None, cache: bool | None = None) -> None:
        super().__init__(name or criteria or evaluator_id_or_alias, criteria=criteria,
                         timeout_seconds=timeout_seconds, cache=cache)
        self.evaluator_id_or_alias = evaluator_id_or_alias
        self.criteria_config = criteria_config
        self.allow_update, self.explain_strategy = allow_update, explain_strategy
        self.endpoint = endpoint
        self.family: str | None = None
        self.criteria_revision: int | None = None

    async def setup(self) -> None:
        if self.family is None:
            self.family = await self._find_family()
        if self.criteria is not None and self.criteria_revision is None:
            self.criteria_revision = await self._ensure_criteria(self.family)

    async def _find_family(self) -> str:
        body, _ = await self.endpoint.request("GET", "/v1/evaluators")
        for ev in body.get("evaluators", []):
            names = {ev.get("id"), ev.get("name"), *(ev.get("aliases") or [])}
            if self.evaluator_id_or_alias in names:
                return str(ev.get("evaluator_family") or ev.get("name"))
        raise ConfigError(f"Patronus has no evaluator {self.evaluator_id_or_alias!r}; "
                          "check the id or alias (GET /v1/evaluators lists them).")

    async def _ensure_criteria(self, family: str) -> int:
        params = {"name": self.criteria, "evaluator_family": family, "get_last_revision": "true"}
        body, _ = await self.endpoint.request("GET", "/v1/evaluator-criteria", params=params)
        found = body.get("evaluator_criteria") or []
        if not found:
            return await self._create_criteria(family)
        current = found[0]
        if self.criteria_config is None:
            return int(current.get("revision", 0))
        diff = _config_diff(current.get("config") or {}, self.criteria_config)
        if not diff:
            return int(current.get("revision", 0))
        if not self.allow_update:
            raise ConfigError(
                f"criteria {self.criteria!r} differs from the given config ({'; '.join(diff)}). "
                "Pass allow_update=True to add a revision, or use the server's config.")
        body, _ = await self.endpoint.request(
            "POST", f"/v1/evaluator-criteria/{self.criteria}/revision",
            json={"config": self.criteria_config})
        return int(body["evaluator_criteria"]["revision"])

    async def _create_criteria(self, family: str) -> int:
        if self.criteria_config is None:
            raise ConfigError(f"Patronus has no criteria {self.criteria!r} for {family}; "
                              "pass profile_config= (criteria_config=) to create it.")
        body, _ = await self.endpoint.request("POST", "/v1/evaluator-criteria", json={
            "name": self.criteria, "evaluator_family": family, "config": self.criteria_config})
        return int(body["evaluator_criteria"].get("revision", 0))

    async def evaluate(self, task_result: TaskResult | None = None, tags: dict[str, str] | None = None,
                       evaluated_model_system_prompt: str | None = None,
                       evaluated_model_retrieved_context: Any = None,
                       evaluated_model_input: str | None = None,
                       evaluated_model_output: str | None = None,
                       evaluated_model_gold_answer: str | None = None) -> EvaluationResult:
        await self.setup()
        payload = evaluate_payload(
            self.evaluator_id_or_alias, self.criteria, self.explain_strategy,
            tags={**(tags or {}), **((task_result.tags or {}) if task_result else {})},
            evaluated_model_system_prompt=evaluated_model_system_prompt,
            evaluated_model_retrieved_context=evaluated_model_retrieved_context,
            evaluated_model_input=evaluated_model_input,
            evaluated_model_output=evaluated_model_output,
            evaluated_model_gold_answer=evaluated_model_gold_answer)
        try:  # a Patronus judge that gives no verdict is unscored, as every judge
            body, attempts = await post_evaluate(self.endpoint, payload)
            return parse_evaluation(body, attempts, {"criteria_revision": self.criteria_revision})
        except RemoteAPIError as exc:
            raise JudgeError.no_answer(exc, self.name) from None

    def cache_identity(self) -> dict[str, Any]:
        """The evaluator, its criteria and config: a new criteria revision (its config
        changed) is a new key."""
        return {"evaluator": self.evaluator_id_or_alias, "criteria": self.criteria,
                "config": self.criteria_config, "explain_strategy": self.explain_strategy,
                "base_url": self.endpoint.base_url}

    async def aclose(self) -> None:
        await self.endpoint.aclose()


def evaluate_payload(evaluator: str, criteria: str | None, explain_strategy: str, *,
                     tags: dict[str, str] | None, **fields: Any) -> dict[str, Any]:
    """The body of ``POST /v1/evaluate`` for one evaluator; ``fields``: evaluated_model_*."""
    spec = {"evaluator": evaluator, "explain_strategy": explain_strategy}
    if criteria:
        spec["criteria"] = criteria
    fields["evaluated_model_retrieved_context"] = context_list(
        fields.get("evaluated_model_retrieved_context"))
    return {"evaluators": [spec], **fields, "tags": tags or {}}


def parse_evaluation(body: dict[str, Any], attempts: int,
                     extra: dict[str, Any] | None = None) -> EvaluationResult:
    """The `EvaluationResult` in a ``POST /v1/evaluate`` answer (``extra``: more metadata)."""
    results = body.get("results") or []
    if not results:
        raise RemoteAPIError("POST /v1/evaluate answered without results", attempts=attempts)
    first = results[0]
    if first.get("status", "success") != "success" or first.get("evaluation_result") is None:
        raise RemoteAPIError(f"Patronus evaluation failed: {first.get('error_message')}",
                             attempts=attempts)
    res = first["evaluation_result"]
    metadata = {**(res.get("evaluation_metadata") or {}), "http_attempts": attempts,
                "evaluation_id": res.get("id"), **(extra or {})}
    return EvaluationResult(
        pass_=res.get("pass"), score_raw=res.get("score_raw"),
        text_output=res.get("text_output"), explanation=res.get("explanation"),
        metadata=metadata, evaluation_duration=res.get("evaluation_duration"),
        tags=res.get("tags") or None, usage=_usage(res, first))


def _usage(res: dict[str, Any], first: dict[str, Any]) -> Usage | None:
    """The evaluation's tokens, when the API says them (its ``usage``), as the model
    ``patronus:<evaluator family or id>`` (Patronus prices evaluations, not tokens: no
    price is known for it unless given)."""
    usage = res.get("usage") or first.get("usage")
    if not isinstance(usage, dict):
        return None
    family = res.get("evaluator_family") or first.get("evaluator_id") or res.get("evaluator_id")
    return Usage.of(usage, f"patronus:{family}" if family else None)


async def post_evaluate(endpoint: Endpoint, payload: dict[str, Any]) -> tuple[Any, int]:
    """``POST /v1/evaluate`` inside an ``llm`` span (a Patronus judge is a model call made
    elsewhere): named ``patronus <evaluator>``, the evaluator and criteria as its model,
    the verdict as its output. The payload has no credential (the key is a header)."""
    spec = (payload.get("evaluators") or [{}])[0]
    who = spec.get("evaluator")
    with span(f"patronus {who}", kind="llm", provider="patronus",
              model=":".join(str(v) for v in (who, spec.get("criteria")) if v)) as s:
        body, attempts = await endpoint.request("POST", "/v1/evaluate", json=payload)
        s.set(output=body, http_attempts=attempts)
    return body, attempts
