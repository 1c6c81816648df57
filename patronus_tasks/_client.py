"""`Client`: the reference SDK's entry point, running experiments on Prefect."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ._dataset import DataInput
from ._experiment import Experiment, Orchestrator, arun_experiment, run_experiment
from ._steps import Evaluator, Task


class Client:
    """Runs experiments; ``Client().experiment(...)`` is `run_experiment` with defaults.

    ``results_dir`` and ``orchestrator`` set here apply to every experiment of this client.
    """

    def __init__(self, *, results_dir: str | Path | None = None,
                 orchestrator: Orchestrator = "prefect") -> None:
        self.results_dir = results_dir
        self.orchestrator: Orchestrator = orchestrator

    def _defaults(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        kwargs.setdefault("results_dir", self.results_dir)
        kwargs.setdefault("orchestrator", self.orchestrator)
        return kwargs

    def experiment(self, project_name: str, *, data: DataInput, task: Task | None = None,
                   evaluators: Sequence[Evaluator] | None = None,
                   chain: Sequence[Mapping[str, Any]] | None = None,
                   tags: Mapping[str, str] | None = None, experiment_name: str | None = None,
                   max_concurrency: int = 10, **kwargs: Any) -> Experiment:
        """Run an experiment and return it; see `run_experiment` for every argument."""
        return run_experiment(project_name, data=data, task=task, evaluators=evaluators,
                              chain=chain, tags=tags, experiment_name=experiment_name,
                              max_concurrency=max_concurrency, **self._defaults(kwargs))

    async def experiment_async(self, project_name: str, *, data: DataInput,
                               **kwargs: Any) -> Experiment:
        """Async form of `experiment`."""
        return await arun_experiment(project_name, data=data, **self._defaults(kwargs))
