"""Datasets stored on the Patronus platform (``GET /v1/datasets/{id}/data``)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from patronus_tasks.define.dataset import Dataset, DatasetLoader
from patronus_tasks.define.wide import check_records
from patronus_tasks.exceptions import DatasetError, RemoteAPIError
from patronus_tasks.http import Endpoint


class RemoteDataset(DatasetLoader):
    """A Patronus dataset, fetched when the experiment starts (or on ``await load()``).

    Its ``sid``s are the sample ids; its ``meta_evaluated_model_*`` columns are kept, and
    fill the task result's model facts (name, provider, params, selected model) that the
    task does not set itself.
    """

    def __init__(self, dataset_id: str, endpoint: Endpoint) -> None:
        super().__init__()
        if not dataset_id or not isinstance(dataset_id, str):
            raise DatasetError(f"remote_dataset needs a dataset id (a non-empty str), not {dataset_id!r}.")
        self.dataset_id, self.endpoint = dataset_id, endpoint

    def __repr__(self) -> str:
        return f"RemoteDataset({self.dataset_id!r})"

    async def fetch(self) -> Dataset:
        path = f"/v1/datasets/{self.dataset_id}/data"
        try:
            body, _ = await self.endpoint.request("GET", path)
        except RemoteAPIError as exc:
            raise _explained(exc, self.dataset_id) from None
        rows = body.get("data") if isinstance(body, dict) else None
        if not isinstance(rows, list):
            raise DatasetError(f"GET {path} answered without a 'data' list; is "
                               f"{self.endpoint.base_url} the Patronus API?")
        check_records(rows, f"patronus:{self.dataset_id}")  # before the frame is made
        return Dataset(_frame(rows), source=f"patronus:{self.dataset_id}",
                       dataset_id=self.dataset_id)


def _explained(exc: RemoteAPIError, dataset_id: str) -> Exception:
    if exc.status == 404:
        return DatasetError(f"Patronus has no dataset {dataset_id!r} (HTTP 404): check the id "
                            "(the Datasets page of the Patronus app lists them).")
    if exc.status in (401, 403):
        return DatasetError(f"the Patronus API refused the key for dataset {dataset_id!r} "
                            f"(HTTP {exc.status}): check PATRONUS_API_KEY.")
    return exc


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    df = pd.DataFrame.from_records(rows)
    if "sid" in df.columns:
        df["sid"] = df["sid"].astype(str)
    return df.drop(columns=["dataset_id"], errors="ignore")
