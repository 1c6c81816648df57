"""Patronus remote evaluators over the Patronus v1 HTTP API.

Before the first row, the evaluator is looked up (``GET /v1/evaluators``) and the
criteria found by name (``GET /v1/evaluator-criteria``), created when missing, or given
a new revision when its config differs and ``allow_update=True``. Each row is then
scored with ``POST /v1/evaluate``.
"""

from __future__ import annotations

import os
from typing import Any

from patronus_tasks.define.step_results import EvaluationResult, TaskResult
from patronus_tasks.define.steps import Evaluator
from patronus_tasks.exceptions import ConfigError, RemoteAPIError
from patronus_tasks.integrations.http import Endpoint

API_KEY_ENV, API_URL_ENV = "PATRONUS_API_KEY", "PATRONUS_API_URL"
DEFAULT_API_URL = "https://api.patronus.ai"


def patronus_endpoint(api_key: str | None = None, base_url: str | None = None, *,
                      max_attempts: int = 3, max_in_flight: int = 16,
                      timeout: float = 60.0) -> Endpoint:
    """The Patronus API from arguments or ``PATRONUS_API_KEY`` / ``PATRONUS_API_URL``."""
    key = api_key or os.environ.get(API_KEY_ENV)
    if not key:
        raise ConfigError(
            f"remote evaluators need a Patronus API key: set {API_KEY_ENV} (and "
            f"{API_URL_ENV} for a non-default server). Local evaluators need no key."
        )
    url = base_url or os.environ.get(API_URL_ENV) or DEFAULT_API_URL
    return Endpoint(url, headers={"x-api-key": key}, max_attempts=max_attempts,
                    max_in_flight=max_in_flight, timeout=timeout)


def _config_diff(have: dict[str, Any], want: dict[str, Any]) -> list[str]:
    keys = sorted(set(have) | set(want))
    return [f"{k}: {have.get(k)!r} on the server, {want.get(k)!r} given"
            for k in keys if have.get(k) != want.get(k)]


def _context(value: Any) -> list[str] | None:
    if value is None:
        return None
    return [value] if isinstance(value, str) else [str(v) for v in value]


class RemoteEvaluator(Evaluator):
    """A Patronus evaluator (``custom-large``, ``judge``, ``lynx``...) with a criteria."""

    def __init__(self, evaluator_id_or_alias: str, criteria: str | None = None, *,
                 criteria_config: dict[str, Any] | None = None, allow_update: bool = False,
                 explain_strategy: str = "always", endpoint: Endpoint, name: str | None = None,
                 timeout_seconds: float | None = None) -> None:
        super().__init__(name or criteria or evaluator_id_or_alias, criteria=criteria,
                         timeout_seconds=timeout_seconds)
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
        spec = {"evaluator": self.evaluator_id_or_alias, "explain_strategy": self.explain_strategy}
        if self.criteria:
            spec["criteria"] = self.criteria
        payload = {
            "evaluators": [spec],
            "evaluated_model_system_prompt": evaluated_model_system_prompt,
            "evaluated_model_retrieved_context": _context(evaluated_model_retrieved_context),
            "evaluated_model_input": evaluated_model_input,
            "evaluated_model_output": evaluated_model_output,
            "evaluated_model_gold_answer": evaluated_model_gold_answer,
            "tags": {**(tags or {}), **((task_result.tags or {}) if task_result else {})},
        }
        body, attempts = await self.endpoint.request("POST", "/v1/evaluate", json=payload)
        return self._result(body, attempts)

    def _result(self, body: dict[str, Any], attempts: int) -> EvaluationResult:
        results = body.get("results") or []
        if not results:
            raise RemoteAPIError("POST /v1/evaluate answered without results", attempts=attempts)
        first = results[0]
        if first.get("status", "success") != "success" or first.get("evaluation_result") is None:
            raise RemoteAPIError(f"Patronus evaluation failed: {first.get('error_message')}",
                                 attempts=attempts)
        res = first["evaluation_result"]
        metadata = {**(res.get("evaluation_metadata") or {}), "http_attempts": attempts,
                    "evaluation_id": res.get("id"), "criteria_revision": self.criteria_revision}
        return EvaluationResult(
            pass_=res.get("pass"), score_raw=res.get("score_raw"),
            explanation=res.get("explanation"), metadata=metadata,
            evaluation_duration=res.get("evaluation_duration"),
            tags=res.get("tags") or None)

    async def aclose(self) -> None:
        await self.endpoint.aclose()
