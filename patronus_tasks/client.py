"""`Client`: the reference SDK's entry point, running experiments on Prefect."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from typing_extensions import Unpack

from patronus_tasks.api import _run_sync, arun_experiment, run_experiment
from patronus_tasks.define.dataset import DataInput
from patronus_tasks.define.step_results import EvaluationResult
from patronus_tasks.exceptions import ConfigError
from patronus_tasks.http import Endpoint
from patronus_tasks.patronus import PatronusReporter, RemoteDataset, RemoteEvaluator, patronus_endpoint
from patronus_tasks.patronus import evaluate as _evaluate
from patronus_tasks.results.experiment import Experiment
from patronus_tasks.run.options import BackendOption, RunOptions
from patronus_tasks.settings import report_to_patronus as _report_env

logger = logging.getLogger("patronus_tasks.patronus")
F = TypeVar("F", bound=Callable[..., Any])


class Client:
    """Runs experiments; ``Client().experiment(...)`` is `run_experiment` with defaults.

    ``results_dir`` and ``backend`` set here apply to every experiment of this client.
    ``api_key`` and ``base_url`` (else ``PATRONUS_API_KEY``/``PATRONUS_API_URL``) are only
    needed for what uses the Patronus API: remote evaluators and datasets, `evaluate`,
    and ``report_to_patronus=True`` (else ``PATRONUS_REPORT=1``), which also sends every
    experiment's evaluation results to the Patronus platform (and fails at once without
    a key). ``max_attempts``, ``max_in_flight`` and ``timeout`` apply to those calls.
    """

    def __init__(self, api_key: str | None = None, base_url: str | None = None, *,
                 results_dir: str | Path | None = None, backend: BackendOption = "prefect",
                 report_to_patronus: bool | None = None, max_attempts: int = 3,
                 max_in_flight: int = 16, timeout: float = 60.0) -> None:
        self._api_key, self.base_url = api_key, base_url
        self.results_dir = results_dir
        self.backend = backend
        self._http = {"max_attempts": max_attempts, "max_in_flight": max_in_flight,
                      "timeout": timeout}
        self.report_to_patronus = (_report_env() if report_to_patronus is None
                                   else report_to_patronus)
        if self.report_to_patronus:
            self._endpoint("report_to_patronus")  # no key: a ConfigError now, not mid-run
        self._local_evaluators: dict[str, Callable[..., Any]] = {}

    def __repr__(self) -> str:
        return (f"Client(base_url={self.base_url!r}, results_dir={self.results_dir!r}, "
                f"report_to_patronus={self.report_to_patronus})")

    def _endpoint(self, needed_for: str, **http: Any) -> Endpoint:
        return patronus_endpoint(self._api_key, self.base_url, needed_for=needed_for,
                                 **{**self._http, **http})

    def remote_evaluator(self, evaluator_id_or_alias: str,
                         profile_name_or_criteria: str | None = None, *,
                         profile_config: dict[str, Any] | None = None,
                         criteria_config: dict[str, Any] | None = None,
                         allow_update: bool = False, explain_strategy: str = "always",
                         max_attempts: int = 3, max_in_flight: int = 16,
                         timeout: float = 60.0, name: str | None = None,
                         criteria: str | None = None,
                         cache: bool | None = None) -> RemoteEvaluator:
        """A Patronus evaluator scoring rows through the Patronus API.

        Fails at once without an API key. The criteria is looked up (and created or
        revised, see ``allow_update``) before the experiment's first row.
        """
        endpoint = self._endpoint("remote evaluators", max_attempts=max_attempts,
                                  max_in_flight=max_in_flight, timeout=timeout)
        return RemoteEvaluator(
            evaluator_id_or_alias, profile_name_or_criteria or criteria,
            criteria_config=profile_config if profile_config is not None else criteria_config,
            allow_update=allow_update, explain_strategy=explain_strategy, endpoint=endpoint,
            name=name, cache=cache)

    def remote_dataset(self, dataset_id: str) -> RemoteDataset:
        """A dataset stored on Patronus, usable as ``data=``; fetched when the experiment
        starts (or with ``await dataset.load()``). Fails at once without an API key."""
        return RemoteDataset(dataset_id, self._endpoint("remote datasets"))

    def register_local_evaluator(self, name: str) -> Callable[[F], F]:
        """Register a function for `evaluate` under ``name`` (the SDK's decorator).

        It is called with keywords only: every ``evaluated_model_*`` field, ``tags`` and
        ``explain_strategy`` (take ``**kwargs`` for the ones it ignores). It returns what
        an evaluator may (bool, number, str, `EvaluationResult`, None).
        """
        def register(fn: F) -> F:
            if name in self._local_evaluators:
                logger.warning("local evaluator %r was registered already; replacing it", name)
            self._local_evaluators[name] = fn
            return fn

        return register

    def evaluate(self, evaluator: str, criteria: str | None = None, *,
                 tags: dict[str, str] | None = None, explain_strategy: str = "always",
                 capture: str = "all", **fields: Any) -> EvaluationResult | None:
        """One evaluation outside an experiment (see `evaluate_async`)."""
        return _run_sync(self._evaluate_once(evaluator, criteria, tags=tags,
                                             explain_strategy=explain_strategy,
                                             capture=capture, **fields))

    async def evaluate_async(self, evaluator: str, criteria: str | None = None, *,
                             tags: dict[str, str] | None = None,
                             explain_strategy: str = "always", capture: str = "all",
                             **fields: Any) -> EvaluationResult | None:
        """One evaluation outside an experiment, as the SDK's ``Client.evaluate``.

        ``fields``: ``evaluated_model_system_prompt``, ``_retrieved_context``, ``_input``,
        ``_output``, ``_gold_answer``, ``_attachments``, and the request's ``app``,
        ``experiment_id``, ``dataset_id``, ``dataset_sample_id``. A local evaluator
        registered under ``evaluator`` (and no ``criteria``) runs here; anything else is a
        Patronus evaluator, called through the API. A local result is exported to
        Patronus when this client reports there and ``capture`` asks for it.
        """
        return await self._evaluate_once(evaluator, criteria, tags=tags,
                                         explain_strategy=explain_strategy, capture=capture,
                                         **fields)

    async def _evaluate_once(self, evaluator: str, criteria: str | None, *,
                             tags: dict[str, str] | None, explain_strategy: str,
                             capture: str, **given: Any) -> EvaluationResult | None:
        known = {*_evaluate.FIELDS, *_evaluate.REQUEST_EXTRAS} - {"capture"}
        unknown = sorted(set(given) - known)
        if unknown:
            raise ConfigError(f"evaluate() got unknown keywords {unknown}; it takes "
                              f"{', '.join(sorted(known))}.")
        fields = {name: given.get(name) for name in _evaluate.FIELDS}
        extras = {name: given.get(name) for name in _evaluate.REQUEST_EXTRAS}
        extras["capture"] = capture
        local = None if criteria else self._local_evaluators.get(evaluator)
        if local is None:
            endpoint = self._endpoint("remote evaluators")
            try:
                return await _evaluate.evaluate_remote(
                    endpoint, evaluator, criteria, fields=fields, tags=tags,
                    explain_strategy=explain_strategy, extras=extras)
            finally:
                await endpoint.aclose()
        result = await _evaluate.evaluate_local(evaluator, local, fields=fields, tags=tags,
                                                explain_strategy=explain_strategy)
        if result is not None and self._captures(capture, result):
            await self._export_one(evaluator, result, fields, tags, extras)
        return result

    def _captures(self, capture: str, result: EvaluationResult) -> bool:
        if not self.report_to_patronus or capture == "none":
            return False
        return capture != "fails-only" or result.pass_ is not True

    async def _export_one(self, name: str, result: EvaluationResult, fields: dict[str, Any],
                          tags: dict[str, str] | None, extras: dict[str, Any]) -> None:
        endpoint = self._endpoint("report_to_patronus")
        try:
            await endpoint.request("POST", "/v1/evaluation-results/batch",
                                   json=_evaluate.export_body(name, result, fields, tags, extras))
        finally:
            await endpoint.aclose()

    def _defaults(self, options: RunOptions) -> RunOptions:
        """This client's ``results_dir``, ``backend`` and reporter, where a call does not
        give its own."""
        merged: RunOptions = {"results_dir": self.results_dir, "backend": self.backend, **options}
        if self.report_to_patronus:  # a reporter per experiment: it holds that run's queue
            reporter = PatronusReporter(self._endpoint("report_to_patronus"))
            merged["reporters"] = [*(options.get("reporters") or ()), reporter]
        return merged

    def experiment(self, project_name: str, *, data: DataInput | None = None,
                   **options: Unpack[RunOptions]) -> Experiment:
        """Run an experiment and return it; the options are `run_experiment`'s, and the
        Patronus SDK's ``dataset=`` (for ``data=``) and ``display_hist=``."""
        return run_experiment(project_name, data=data, **self._defaults(options))

    async def experiment_async(self, project_name: str, *, data: DataInput | None = None,
                               **options: Unpack[RunOptions]) -> Experiment:
        """Async form of `experiment`."""
        return await arun_experiment(project_name, data=data, **self._defaults(options))
