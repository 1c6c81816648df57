"""`Client`: the reference SDK's entry point, running experiments on Prefect."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from typing_extensions import Unpack

from patronus_tasks.api import arun_experiment, run_experiment
from patronus_tasks.define.dataset import DataInput
from patronus_tasks.integrations.patronus import RemoteEvaluator, patronus_endpoint
from patronus_tasks.results.experiment import Experiment
from patronus_tasks.run.options import RunOptions


class Client:
    """Runs experiments; ``Client().experiment(...)`` is `run_experiment` with defaults.

    ``results_dir`` and ``backend`` set here apply to every experiment of this client.
    ``api_key`` and ``base_url`` (else ``PATRONUS_API_KEY``/``PATRONUS_API_URL``) are only
    needed for remote evaluators.
    """

    def __init__(self, api_key: str | None = None, base_url: str | None = None, *,
                 results_dir: str | Path | None = None,
                 backend: Any = "prefect") -> None:
        self._api_key, self.base_url = api_key, base_url
        self.results_dir = results_dir
        self.backend = backend

    def __repr__(self) -> str:
        return f"Client(base_url={self.base_url!r}, results_dir={self.results_dir!r})"

    def remote_evaluator(self, evaluator_id_or_alias: str,
                         profile_name_or_criteria: str | None = None, *,
                         profile_config: dict[str, Any] | None = None,
                         criteria_config: dict[str, Any] | None = None,
                         allow_update: bool = False, explain_strategy: str = "always",
                         max_attempts: int = 3, max_in_flight: int = 16,
                         timeout: float = 60.0, name: str | None = None,
                         criteria: str | None = None) -> RemoteEvaluator:
        """A Patronus evaluator scoring rows through the Patronus API.

        Fails at once without an API key. The criteria is looked up (and created or
        revised, see ``allow_update``) before the experiment's first row.
        """
        endpoint = patronus_endpoint(self._api_key, self.base_url, max_attempts=max_attempts,
                                     max_in_flight=max_in_flight, timeout=timeout)
        return RemoteEvaluator(
            evaluator_id_or_alias, profile_name_or_criteria or criteria,
            criteria_config=profile_config if profile_config is not None else criteria_config,
            allow_update=allow_update, explain_strategy=explain_strategy, endpoint=endpoint,
            name=name)

    def _defaults(self, options: RunOptions) -> RunOptions:
        """This client's ``results_dir`` and ``backend`` where a call does not give its own."""
        return {"results_dir": self.results_dir, "backend": self.backend, **options}

    def experiment(self, project_name: str, *, data: DataInput | None = None,
                   **options: Unpack[RunOptions]) -> Experiment:
        """Run an experiment and return it; the options are `run_experiment`'s."""
        return run_experiment(project_name, data=data, **self._defaults(options))

    async def experiment_async(self, project_name: str, *, data: DataInput | None = None,
                               **options: Unpack[RunOptions]) -> Experiment:
        """Async form of `experiment`."""
        return await arun_experiment(project_name, data=data, **self._defaults(options))
