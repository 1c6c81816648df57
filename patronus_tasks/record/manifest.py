"""The experiment's ``manifest.json``: what ran, on what data, with what totals.

A versioned model: written from it (`Manifest.to_json`), read back into it
(`Experiment.manifest`; the file itself: `manifest_file`). Fields a newer version adds are
kept when an older one reads the file; fields an older file lacks take their defaults.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer

MANIFEST_VERSION = 1
#: Where the run is: ``running`` until it completed or was interrupted.
RunStatus = Literal["running", "completed", "interrupted"]


class _Model(BaseModel):
    """A part of the manifest. Read by attribute; ``m["rows"]``, ``m.get("rows")`` and
    ``"rows" in m`` read it as the JSON file has it, kept for compatibility: the manifest
    was a dict (``experiment.manifest["flow_run_id"]``) before it was typed."""

    model_config = ConfigDict(extra="allow")

    def _omitted(self) -> set[str]:
        """Fields the JSON file leaves out (while they are None)."""
        return set()

    def _keys(self) -> list[str]:
        names = [*type(self).model_fields, *(self.model_extra or {})]
        omitted = self._omitted()
        return [n for n in names if n not in omitted]

    def __contains__(self, key: object) -> bool:
        return key in self._keys()

    def __getitem__(self, key: str) -> Any:
        if key not in self:
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key) if key in self else default


class DatasetInfo(_Model):
    source: str | None = None
    rows: int = 0
    sha256: str | None = None


class EvaluatorInfo(_Model):
    name: str
    criteria: str | None = None
    weight: float | None = None  # its share in a row's weighted score (``weight=``)
    scale: list[str] | None = None  # the labels a person may give its rows (a judge's)

    @model_serializer(mode="wrap")
    def _no_weight(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Written only when given: most evaluators have none.
        data: dict[str, Any] = handler(self)
        for name in ("weight", "scale"):
            if data.get(name) is None:
                data.pop(name, None)
        return data


class LinkInfo(_Model):
    task: str | None = None
    evaluators: list[EvaluatorInfo] = []


class PrefectRecords(_Model):
    """How many of the experiment's task runs Prefect holds (kept current while the
    records catch up after the results are written)."""

    task_runs: int
    task_runs_recorded: int
    task_runs_lost: int
    complete: bool


class MetricValue(_Model):
    """One value of a dataset-level metric, or the error it gave (failures as data)."""

    name: str
    metric: str  # the metric function that gave it
    value: float | None = None
    error: str | None = None


class UsageTotal(_Model):
    """Calls of one step with one model: how many, how many the cache answered, their
    tokens (of the calls made) and what they cost (``cost_usd`` None: no price known for
    some of them, whose tokens are ``unpriced_calls``)."""

    step: str
    kind: Literal["task", "evaluator"]
    model: str | None = None
    calls: int = 0
    cached: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None
    unpriced_calls: int = 0


class VerdictNote(_Model):
    """The run against the previous run of its series and its baseline, as Prefect shows
    it (`results.verdict`): a name, tags, a message, log lines, and what got worse or
    better."""

    name: str  # Regressed, Gate failed, Errors, Improved, Unchanged, First run
    message: str
    tags: list[str] = []
    lines: list[str] = []
    worse: list[str] = []  # evaluators (against the previous run or the baseline)
    better: list[str] = []
    failures: list[str] = []  # gates that failed (``fail_on_regression`` included)
    baseline: str | None = None  # the run judged against besides the previous one
    since: str | None = None  # the first night of a regression against it still on


class Manifest(_Model):
    manifest_version: int = MANIFEST_VERSION
    project: str
    experiment_name: str
    experiment_id: str
    status: RunStatus
    tags: dict[str, str] = {}
    flow_run_id: str | None = None
    series: str | None = None  # the runs it is compared with, on Prefect
    started_at: str
    ended_at: str | None = None
    rows: int = 0
    records: int = 0
    task_errors: int = 0
    evaluator_errors: int = 0
    errored_rows: int = 0
    repeats: int = 1  # runs of each row (``repeats=N``)
    calls: int | None = None  # step calls made (the cache's answers not counted)
    cached_calls: int | None = None  # step calls the cache answered
    cost_usd: float | None = None  # what the calls made cost, where their price is known
    usage: list[UsageTotal] | None = None  # per step and model
    metrics: list[MetricValue] | None = None  # dataset-level metrics (``metrics=``)
    worker_pids: list[int] | None = None
    #: The process running the experiment, and its host: a run left ``running`` whose
    #: process is gone (killed) is told apart from one still going (`list`).
    pid: int | None = None
    host: str | None = None
    dataset: DatasetInfo = DatasetInfo()
    links: list[LinkInfo] = []
    package_version: str | None = None
    git_commit: str | None = None
    python: str | None = None
    prefect: PrefectRecords | None = None
    #: What each reporter (results sent elsewhere: ``patronus``) says it did.
    reports: dict[str, dict[str, Any]] | None = None
    #: The verdict against the series' previous run, once Prefect's side said it.
    verdict: VerdictNote | None = None
    #: The experiment's own facts (``metadata=``; the Patronus SDK 0.1.x's evaluator
    #: weights are kept under ``evaluator_weights``).
    metadata: dict[str, Any] | None = None

    def _omitted(self) -> set[str]:
        # The ``prefect`` block only once there is one; figures only once computed.
        return {name for name in ("prefect", "reports", "usage", "metrics", "calls",
                                  "cached_calls", "cost_usd", "verdict", "metadata")
                if getattr(self, name) is None}

    def to_json(self) -> dict[str, Any]:
        """The JSON file's content."""
        return self.model_dump(mode="json", exclude=self._omitted() or None)
