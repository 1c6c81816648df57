"""Experiment results on the Patronus platform (``Client(report_to_patronus=True)``).

Before the first row: ``GET /v1/whoami`` (the account, for the link), ``POST
/v1/projects`` and ``POST /v1/experiments``. Then every evaluation record goes through a
bounded queue to ``POST /v1/evaluation-results/batch`` in batches of at most 10 (the
API's limit), several batches in flight, through the endpoint's retries and in-flight
limit. A full queue makes the rows wait (nothing is dropped); a batch that still fails
is counted, never raised: the local results are complete either way.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import urllib.parse
from typing import TYPE_CHECKING, Any

from patronus_tasks.exceptions import RemoteAPIError
from patronus_tasks.http import Endpoint
from patronus_tasks.patronus.endpoint import ui_url
from patronus_tasks.patronus.evaluators import context_list
from patronus_tasks.record.records import STATUS_OK, Record

if TYPE_CHECKING:
    from patronus_tasks.record.manifest import Manifest
    from patronus_tasks.record.recorder import RunFacts

logger = logging.getLogger("patronus_tasks.patronus")

#: The most evaluation results ``POST /v1/evaluation-results/batch`` takes in one call.
BATCH_LIMIT = 10
_ROW_FIELDS = ("evaluated_model_system_prompt", "evaluated_model_input",
               "evaluated_model_gold_answer")
_MODEL_FACTS = ("name", "provider", "params", "selected_model")


class PatronusReporter:
    """Creates the project and experiment on Patronus and exports every evaluation there.

    ``queue_size``: results waiting at most before the rows wait; ``senders``: batches
    in flight at once; ``linger``: how long a part-full batch waits for more results.
    """

    name = "patronus"

    def __init__(self, endpoint: Endpoint, *, queue_size: int = 1000, senders: int = 4,
                 linger: float = 0.2, batch_size: int = BATCH_LIMIT) -> None:
        self.endpoint = endpoint
        self.queue_size, self.senders, self.linger = queue_size, senders, linger
        self.batch_size = min(batch_size, BATCH_LIMIT)
        self.exported = self.failed = 0
        self.errors: list[str] = []
        self.project_id: str | None = None
        self.experiment_id: str | None = None
        self.url: str | None = None
        self._spec: RunFacts | None = None
        self._queue: asyncio.Queue[dict[str, Any]] | None = None
        self._consumer: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"PatronusReporter({self.endpoint!r}, experiment_id={self.experiment_id!r})"

    async def start(self, spec: RunFacts) -> None:
        self._spec = spec
        who, _ = await self.endpoint.request("GET", "/v1/whoami")
        project, _ = await self.endpoint.request(
            "POST", "/v1/projects", json={"name": _project_name(spec.project_name)})
        self.project_id = str(project["id"])
        body, _ = await self.endpoint.request("POST", "/v1/experiments", json={
            "project_id": self.project_id, "name": spec.experiment_name, "tags": spec.tags})
        self.experiment_id = str(body["experiment"]["id"])
        self.url = _link(who, str(self.experiment_id))
        print(f"Patronus experiment: {self.url}")
        self._queue = asyncio.Queue(self.queue_size)
        self._consumer = asyncio.create_task(self._consume())

    async def add(self, records: list[Record]) -> None:
        assert self._queue is not None, "start() first"
        for record in records:
            if record.evaluator_name is None or record.status != STATUS_OK:
                continue  # the API takes results: errors and skips stay local
            try:
                result = self._result(record)
            except (TypeError, ValueError) as exc:  # a value the API cannot take: counted
                self._count_failed(1, f"sid {record.sid}: {exc}")
                continue
            await self._queue.put(result)

    def _count_failed(self, results: int, error: str) -> None:
        self.failed += results
        if len(self.errors) < 5:  # the first few say enough
            self.errors.append(self.endpoint.redact(error))

    async def finish(self, manifest: Manifest | None = None) -> dict[str, Any]:
        if self._queue is not None:
            await self._queue.join()  # every result sent, or counted as failed
        self.cancel()
        if self.failed:
            logger.warning(
                "%d of %d evaluation results could not be exported to Patronus (%s); the "
                "local results are complete", self.failed, self.failed + self.exported,
                self.errors[0] if self.errors else "")
        return {"project_id": self.project_id, "experiment_id": self.experiment_id,
                "url": self.url, "exported": self.exported, "failed": self.failed,
                "errors": self.errors}

    def cancel(self) -> None:
        if self._consumer is not None:
            self._consumer.cancel()

    async def _consume(self) -> None:
        assert self._queue is not None
        slots = asyncio.Semaphore(self.senders)
        sending: set[asyncio.Task[None]] = set()
        try:
            while True:
                batch = await self._next_batch(self._queue)
                await slots.acquire()
                task = asyncio.create_task(self._send(batch, slots))
                sending.add(task)
                task.add_done_callback(sending.discard)
        finally:
            for task in sending:
                task.cancel()

    async def _next_batch(self, queue: asyncio.Queue[dict[str, Any]]) -> list[dict[str, Any]]:
        batch = [await queue.get()]
        if queue.qsize() < self.batch_size - 1:
            await asyncio.sleep(self.linger)  # fewer, fuller batches when results trickle
        while len(batch) < self.batch_size and not queue.empty():
            batch.append(queue.get_nowait())
        return batch

    async def _send(self, batch: list[dict[str, Any]], slots: asyncio.Semaphore) -> None:
        assert self._queue is not None
        try:
            await self.endpoint.request("POST", "/v1/evaluation-results/batch",
                                        json={"evaluation_results": batch})
            self.exported += len(batch)
        except RemoteAPIError as exc:
            self._count_failed(len(batch), str(exc))
        finally:
            slots.release()
            for _ in batch:
                self._queue.task_done()

    def _result(self, record: Record) -> dict[str, Any]:
        """One evaluation record as the API's ``ExportEvaluationResult``."""
        spec, row = self._spec, record.row
        assert spec is not None, "start() first"
        task_meta = json.loads(record.task_metadata) if record.task_metadata else {}
        output = record.task_output if record.task_name else row.get("evaluated_model_output")
        return {
            "experiment_id": self.experiment_id,
            "evaluator_id": _evaluator_id(record.evaluator_name or ""),
            "criteria": record.criteria,
            **{name: _text(row.get(name)) for name in _ROW_FIELDS},
            "evaluated_model_retrieved_context": context_list(
                row.get("evaluated_model_retrieved_context")),
            "evaluated_model_output": _text(output),
            "pass": record.pass_, "score_raw": record.score,
            "text_output": record.text_output, "explanation": record.explanation,
            "evaluation_duration": _duration(record.evaluation_duration_s),
            "evaluation_metadata": json.loads(record.evaluation_metadata)
            if record.evaluation_metadata else None,
            **_model_facts(task_meta, row),
            "dataset_id": spec.dataset.dataset_id,
            "dataset_sample_id": int(record.sid) if record.sid.isdigit() else None,
            "tags": _tags(spec.tags, record),
        }


def _project_name(name: str) -> str:
    # The API takes letters, digits, '_', '-' and spaces, up to 50 (the SDK's sanitising).
    return re.sub(r"[^a-zA-Z0-9_ -]", "_", name.strip()[:50]) or "default"


def _evaluator_id(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9\-_./]", "-", name.strip()[:50])


def _link(who: Any, experiment_id: str) -> str:
    account = ((who or {}).get("caller") or {}).get("api_key", {}).get("account", {}).get("id")
    query = f"?{urllib.parse.urlencode({'account_id': account})}" if account else ""
    return f"{ui_url()}/experiments/{experiment_id}{query}"


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _duration(seconds: float | None) -> str | None:
    return None if seconds is None else f"PT{seconds:.6f}S"  # ISO 8601, as pydantic sends it


def _model_facts(task_meta: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    facts = {}
    for fact in _MODEL_FACTS:
        value = task_meta.get(f"evaluated_model_{fact}")
        facts[f"evaluated_model_{fact}"] = (
            value if value is not None else row.get(f"meta_evaluated_model_{fact}"))
    return facts


def _tags(base: dict[str, str], record: Record) -> dict[str, str]:
    extra = [json.loads(t) for t in (record.task_tags, record.evaluation_tags) if t]
    if record.repeat is not None:  # with repeats: which run of the sample this is
        extra.append({"repeat": record.repeat})
    return {k: str(v) for tags in (base, *extra) for k, v in tags.items()}
