"""The Patronus SDK 0.1.x's datasets (`patronus.datasets`): its `Row`, `Dataset`, loaders
and readers, over this package's datasets.

Its field names map onto this package's columns, so one engine runs both:
``task_input`` is ``evaluated_model_input``, ``task_output`` ``evaluated_model_output``,
``gold_answer`` ``evaluated_model_gold_answer``, ``task_context``
``evaluated_model_retrieved_context`` and ``system_prompt``
``evaluated_model_system_prompt``; the results keep this package's names, and
`patronus_tasks.experiments.Experiment.to_dataframe` shows the SDK's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict

import pandas as pd

from patronus_tasks.define import dataset as _dataset
from patronus_tasks.define.row import clean
from patronus_tasks.define.wide import check_csv, check_jsonl, check_records
from patronus_tasks.exceptions import DatasetError

#: The SDK's field name -> this package's column.
FIELDS = {
    "system_prompt": "evaluated_model_system_prompt",
    "task_input": "evaluated_model_input",
    "task_output": "evaluated_model_output",
    "gold_answer": "evaluated_model_gold_answer",
    "task_context": "evaluated_model_retrieved_context",
}
#: This package's column -> the SDK's field name.
SDK_NAMES = {ours: theirs for theirs, ours in FIELDS.items()}
_OTHER_FIELDS = ("task_attachments", "task_metadata", "tags")


class Attachment(TypedDict, total=False):
    """A file given with a row's input (the SDK's ``task_attachments``)."""

    url: str
    media_type: str
    usage_type: str | None


class Fields(TypedDict, total=False):
    """The SDK's column names, as `read_csv` / `read_jsonl` map them."""

    sid: str
    system_prompt: str
    task_input: str
    task_context: str
    task_attachments: str
    task_output: str
    gold_answer: str
    task_metadata: str
    tags: str


class Row:
    """One sample as the SDK's tasks and evaluators read it: ``row.task_input``,
    ``row.gold_answer``... (None when the column is absent or empty), any other column as
    ``row.<name>`` (a missing one is a `KeyError`), the whole sample as ``row.row``."""

    def __init__(self, row: pd.Series, dataset_id: str | None = None) -> None:
        self.row, self._dataset_id = row, dataset_id

    def __repr__(self) -> str:
        return f"Row(sid={self.sid!r})"

    def _get(self, name: str) -> Any:
        column = FIELDS.get(name, name)
        return clean(self.row.get(column)) if column in self.row.index else None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "row":
            raise AttributeError(name)
        column = FIELDS.get(name, name)
        if column not in self.row.index:
            raise KeyError(f"the row has no column {name!r}; it has: "
                           f"{', '.join(SDK_NAMES.get(str(c), str(c)) for c in self.row.index)}")
        return clean(self.row[column])

    @property
    def sid(self) -> str:
        return str(self.row["sid"])

    @property
    def dataset_id(self) -> str | None:
        return self._dataset_id

    @property
    def system_prompt(self) -> str | None:
        return self._get("system_prompt")

    @property
    def task_input(self) -> str | None:
        return self._get("task_input")

    @property
    def task_output(self) -> str | None:
        return self._get("task_output")

    @property
    def gold_answer(self) -> str | None:
        return self._get("gold_answer")

    @property
    def task_context(self) -> list[str] | None:
        return context_list(self._get("task_context"))

    @property
    def task_attachments(self) -> list[Attachment] | None:
        return self._get("task_attachments")

    @property
    def task_metadata(self) -> dict[str, Any] | None:
        return self._get("task_metadata")

    @property
    def tags(self) -> dict[str, str] | None:
        return _json_dict(self._get("tags"), "tags")


def context_list(value: Any) -> list[str] | None:
    """A context as the SDK gives it: a list of str (one str is a list of one; a JSON
    list in a str is read)."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                parsed = json.loads(text)
            except ValueError:
                return [value]
            return [str(v) for v in parsed] if isinstance(parsed, list) else [value]
        return [value]
    return [str(v) for v in value]


def _json_dict(value: Any, field: str) -> dict[str, Any] | None:
    if value is None or isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            return parsed
    raise DatasetError(f"{field} must be a dict (or its JSON), not {value!r}")


class Dataset(_dataset.Dataset):
    """A dataset in the SDK's terms (``Dataset.from_records``, ``from_dataframe``): this
    package's `Dataset`, its SDK field names mapped onto this package's columns, ``sid``
    added as 1..n when absent. Rows keep their order (the SDK sorts them by ``sid`` as
    text: "10" before "2")."""

    def __init__(self, df: pd.DataFrame, dataset_id: str | None = None,
                 source: str | None = None) -> None:
        super().__init__(_to_columns(df), source=source, dataset_id=dataset_id)

    @classmethod
    def from_records(cls, records: Sequence[Mapping[str, Any]],
                     dataset_id: str | None = None) -> Dataset:
        _dataset.check_rows(records)
        check_records(records, "the records")
        return cls(pd.DataFrame.from_records([dict(r) for r in records]), dataset_id)

    @classmethod
    def from_dataframe(cls, df: pd.DataFrame, dataset_id: str | None = None) -> Dataset:
        return cls(df.copy(), dataset_id)

    def to_dataframe(self) -> pd.DataFrame:
        """The rows with the SDK's column names."""
        return self.df.rename(columns=SDK_NAMES)


def _to_columns(df: pd.DataFrame) -> pd.DataFrame:
    """The SDK's field names as this package's columns (a column under both names is
    refused: which one is meant?)."""
    both = [name for name, ours in FIELDS.items() if name in df.columns and ours in df.columns]
    if both:
        raise DatasetError(f"the dataset has both {both[0]!r} and {FIELDS[both[0]]!r}: keep one "
                           "(they are the same field).")
    df = df.rename(columns=FIELDS)
    if "sid" in df.columns:
        df["sid"] = df["sid"].astype(str)
    return df


class DatasetLoader(_dataset.DatasetLoader):
    """A dataset fetched when the experiment starts (override ``fetch``, async)."""


class RemoteDatasetLoader(DatasetLoader):
    """A dataset stored on the Patronus platform, by name or id (``PATRONUS_API_KEY``)."""

    def __init__(self, by_name: str | None = None, *, by_id: str | None = None) -> None:
        super().__init__()
        if (by_name is None) == (by_id is None):
            raise DatasetError("RemoteDatasetLoader takes a dataset name or by_id=, one of them.")
        self.by_name, self.by_id = by_name, by_id

    def __repr__(self) -> str:
        return f"RemoteDatasetLoader({self.by_name or self.by_id!r})"

    async def fetch(self) -> _dataset.Dataset:
        from patronus_tasks.patronus import RemoteDataset, patronus_endpoint

        endpoint = patronus_endpoint()
        dataset_id = self.by_id or await _dataset_id_of(endpoint, str(self.by_name))
        fetched = await RemoteDataset(dataset_id, endpoint).fetch()
        return Dataset(fetched.df, dataset_id=dataset_id, source=fetched.source)


async def _dataset_id_of(endpoint: Any, name: str) -> str:
    body, _ = await endpoint.request("GET", "/v1/datasets")
    for found in body.get("datasets", []) if isinstance(body, dict) else []:
        if name in (found.get("name"), found.get("id")):
            return str(found["id"])
    raise DatasetError(f"Patronus has no dataset named {name!r} (GET /v1/datasets lists them).")


def _read(path: str | Path, fmt: str, dataset_id: str | None, fields: Mapping[str, Any],
          pandas_kwargs: Mapping[str, Any]) -> Dataset:
    """A file read with the SDK's ``<field>_field=`` options (the column holding each)."""
    known = {f"{name}_field" for name in ("sid", *FIELDS, *_OTHER_FIELDS)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise DatasetError(f"unknown field option {unknown[0]!r}; known: {', '.join(sorted(known))}")
    if fmt == "csv":  # their width, before pandas reads them (see `define.wide`)
        check_csv(Path(path), pandas_kwargs)
    else:
        check_jsonl(Path(path))
    df = pd.read_csv(path, **pandas_kwargs) if fmt == "csv" else pd.read_json(
        path, lines=True, **pandas_kwargs)
    renames = {str(column): option[:-len("_field")] for option, column in fields.items()
               if column is not None}
    missing = [c for c in renames if c not in df.columns]
    if missing:
        raise DatasetError(f"{path} has no column {missing[0]!r}; its columns: "
                           f"{', '.join(map(str, df.columns))}")
    return Dataset(df.rename(columns=renames), dataset_id, source=str(path))


def read_csv(path: str | Path, *, dataset_id: str | None = None, sid_field: str = "sid",
             system_prompt_field: str = "system_prompt", task_input_field: str = "task_input",
             task_context_field: str = "task_context",
             task_attachments_field: str = "task_attachments",
             task_output_field: str = "task_output", gold_answer_field: str = "gold_answer",
             task_metadata_field: str = "task_metadata", tags_field: str = "tags",
             **pandas_kwargs: Any) -> Dataset:
    """A CSV file as the SDK reads it: ``<field>_field=`` names the column of each field
    (a field whose default-named column is absent is simply not there)."""
    fields = _given(locals())
    return _read(path, "csv", dataset_id, fields, pandas_kwargs)


def read_jsonl(path: str | Path, *, dataset_id: str | None = None, sid_field: str = "sid",
               system_prompt_field: str = "system_prompt", task_input_field: str = "task_input",
               task_context_field: str = "task_context",
               task_attachments_field: str = "task_attachments",
               task_output_field: str = "task_output", gold_answer_field: str = "gold_answer",
               task_metadata_field: str = "task_metadata", tags_field: str = "tags",
               **pandas_kwargs: Any) -> Dataset:
    """A JSON Lines file as the SDK reads it (see `read_csv`)."""
    fields = _given(locals())
    return _read(path, "jsonl", dataset_id, fields, pandas_kwargs)


def _given(arguments: Mapping[str, Any]) -> dict[str, str | None]:
    """The ``<field>_field`` options that name another column than the field's own."""
    return {k: v for k, v in arguments.items()
            if k.endswith("_field") and v != k[:-len("_field")]}
