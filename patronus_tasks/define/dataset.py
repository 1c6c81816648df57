"""Datasets: loading rows from lists, DataFrames, CSV, JSONL and Parquet, with stable ids."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union, cast

import pandas as pd

from patronus_tasks.define.params import ROW_FIELDS
from patronus_tasks.define.row import Row, Sample
from patronus_tasks.define.wide import (
    check_csv,
    check_json_line,
    check_parquet,
    check_records,
    check_width,
)
from patronus_tasks.exceptions import DatasetError

if TYPE_CHECKING:
    import pyarrow as pa

DataInput = Union["Dataset", "DatasetLoader", pd.DataFrame, Sequence[Mapping[str, Any]], str, Path]
_FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}


class Dataset:
    """A DataFrame of samples with a unique string ``sid`` column.

    Build one with `load_dataset`, `read_csv` or `read_jsonl`; experiments accept the
    same inputs as `load_dataset` directly.
    """

    def __init__(self, df: pd.DataFrame, source: str | None = None,
                 dataset_id: str | None = None, declared: pa.Schema | None = None) -> None:
        self.source = source
        self.dataset_id = dataset_id  # a Patronus dataset's id (`Client.remote_dataset`)
        check_width(len(df.columns), _where(source))
        #: The column types its file declares (a Parquet file's schema), which the results
        #: keep whatever a run's rows hold (pandas reads ints with a gap as floats).
        self.declared = declared
        self.df = _with_sid(df, source)
        self._hash: str | None = None

    def __len__(self) -> int:
        return len(self.df)

    def __repr__(self) -> str:
        return f"Dataset({len(self)} rows, source={self.source!r})"

    @property
    def columns(self) -> list[str]:
        return [str(c) for c in self.df.columns]

    def rows(self) -> Iterator[Row]:
        """Yield each sample as a `Row`."""
        return (sample.row for sample in self.samples())

    def samples(self) -> Iterator[Sample]:
        """Yield each sample as the runner carries it (values, `Row` on demand)."""
        columns = self.df.columns
        for values in self.df.itertuples(index=False, name=None):
            yield Sample(columns, values)

    def content_hash(self) -> str:
        """A SHA-256 of the rows' content, to tell whether two runs saw the same data.

        Computed once: it serialises every row, and each manifest write asks for it.
        """
        if self._hash is None:
            text = self.df.to_json(orient="records", default_handler=str)
            self._hash = hashlib.sha256(text.encode()).hexdigest()
        return self._hash


class DatasetLoader:
    """A dataset fetched when the experiment starts, once (`Client.remote_dataset`).

    Subclasses implement ``fetch``; experiments accept a loader wherever they take data.
    """

    def __init__(self) -> None:
        self.dataset: Dataset | None = None

    async def fetch(self) -> Dataset:
        raise NotImplementedError

    async def load(self) -> Dataset:
        """The dataset, fetched on first use."""
        if self.dataset is None:
            self.dataset = await self.fetch()
        return self.dataset


async def aload_data(data: DataInput | None) -> DataInput | None:
    """``data`` with a `DatasetLoader` loaded (in the caller's loop); anything else as is."""
    return await data.load() if isinstance(data, DatasetLoader) else data


def _loaded(loader: DatasetLoader) -> Dataset:
    if loader.dataset is not None:
        return loader.dataset
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(loader.load())
    raise DatasetError(f"{loader!r} is not loaded yet: `await loader.load()` first "
                       "(experiments load it themselves).")


def _where(source: str | None) -> str:
    return f"dataset {source}" if source else "dataset"


def _with_sid(df: pd.DataFrame, source: str | None) -> pd.DataFrame:
    if len(df) == 0:
        raise DatasetError(f"{_where(source)} is empty: an experiment needs at least one row.")
    df = df.reset_index(drop=True)
    if "sid" not in df.columns:
        return df.assign(sid=[str(i + 1) for i in range(len(df))])
    missing = df.index[df["sid"].isna()].tolist()
    if missing:
        raise DatasetError(
            f"{_where(source)}: rows at positions {missing[:10]} have no 'sid'. "
            "Give every row a sample id, or drop the 'sid' column to number rows 1..N."
        )
    sids = df["sid"].astype(str)
    dups = sorted(set(sids[sids.duplicated()]))
    if dups:
        raise DatasetError(
            f"{_where(source)}: duplicate sample ids {dups[:10]} in column 'sid'. "
            "Sample ids must be unique: fix them, or drop the column to number rows 1..N."
        )
    return df.assign(sid=sids.astype(object))


def _renames(df: pd.DataFrame, mapping: Mapping[str, str | None], source: str) -> dict[str, str]:
    renames = {}
    for target, column in mapping.items():
        if column is None or column == target:
            continue
        if column not in df.columns:
            raise DatasetError(
                f"{_where(source)} has no column {column!r} (given as {target}_field). "
                f"Columns are: {', '.join(map(str, df.columns))}."
            )
        renames[column] = target
    return renames


def _field_mapping(sid_field: str | None, fields: Mapping[str, str | None]) -> dict[str, str | None]:
    mapping: dict[str, str | None] = {"sid": sid_field}
    for name in ROW_FIELDS:
        mapping[name] = fields.get(f"{name}_field")
    return mapping


def _read_jsonl(path: Path) -> pd.DataFrame:
    records = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            check_json_line(line, f"{path}:{lineno}")  # before json.loads: 1.2 s for 10^6 keys
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}:{lineno}: not valid JSON ({exc.msg}).") from None
            if not isinstance(record, dict):
                raise DatasetError(f"{path}:{lineno}: each line must be a JSON object.")
            records.append(record)
    check_records(records, str(path))
    return pd.DataFrame.from_records(records)


def _read_file(path: Path, fmt: str, texts: Sequence[str] = (), **kwargs: Any) -> pd.DataFrame:
    if fmt == "csv":
        check_csv(path, kwargs)  # its header, before pandas reads it (152 s for 10^6 fields)
        # Keep "NA", "null" and friends as text: only empty cells are missing. The
        # well-known fields (``texts``: their columns) are read as written, as a JSON Lines
        # file gives them: pandas' guess made "007" 7, "42.0" 42 and "True" a bool.
        kwargs.setdefault("dtype", dict.fromkeys(texts, str))
        return pd.read_csv(path, keep_default_na=False, na_values=[""], **kwargs)
    if fmt == "jsonl":
        return _read_jsonl(path)
    check_parquet(path)
    return pd.read_parquet(path)


def _check_path(path: str | Path, fmt: str | None = None) -> tuple[Path, str]:
    path = Path(path)
    fmt = fmt or _FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise DatasetError(
            f"{path}: unknown dataset format {path.suffix!r}. "
            "Use .csv, .jsonl (or .ndjson) or .parquet, or pass a list of dicts or a DataFrame."
        )
    if not path.is_file():
        where = "" if path.is_absolute() else f" (looked for {path.resolve()})"
        raise DatasetError(f"{path}: no such dataset file{where}.")
    return path, fmt


def _load_file(path: str | Path, fmt: str | None, sid_field: str | None, fields: Mapping[str, Any],
               **kwargs: Any) -> Dataset:
    checked, fmt = _check_path(path, fmt)
    mapping = _field_mapping(sid_field, fields)
    texts = [mapping.get(name) or name for name in ROW_FIELDS]
    df = _read_file(checked, fmt, texts, **kwargs)
    renames = _renames(df, mapping, str(checked))
    df = df.rename(columns=renames)
    if fmt == "csv" and _CONTEXT in df.columns:
        df[_CONTEXT] = df[_CONTEXT].map(_json_list)
    declared = _parquet_schema(checked, renames) if fmt == "parquet" else None
    return Dataset(df, source=str(checked), declared=declared)


def _parquet_schema(path: Path, renames: Mapping[str, str]) -> pa.Schema:
    """The Parquet file's column types, by the names the dataset gives its columns."""
    import pyarrow as pa  # here: only Parquet datasets need it at load
    import pyarrow.parquet as pq

    return pa.schema([f.with_name(renames.get(f.name, f.name)) for f in pq.read_schema(path)])


_CONTEXT = "evaluated_model_retrieved_context"


def _json_list(cell: Any) -> Any:
    """A CSV cell holding a JSON list of passages, as the list (as a JSON Lines file and
    the SDK 0.1.x's ``read_csv`` give it); any other cell as it is."""
    if not isinstance(cell, str) or not cell.lstrip().startswith("["):
        return cell
    try:
        parsed = json.loads(cell)
    except ValueError:
        return cell
    # Passages are texts: a list of anything else ("[1, 2]") stays the cell it was.
    return parsed if isinstance(parsed, list) and all(isinstance(p, str) for p in parsed) else cell


def read_csv(path: str | Path, *, sid_field: str | None = None, **fields: Any) -> Dataset:
    """Read a CSV file, mapping columns onto the well-known fields.

    ``evaluated_model_input_field="question"`` reads column ``question`` as
    ``evaluated_model_input`` (likewise for every ``evaluated_model_*`` field);
    ``sid_field`` names the sample-id column. Other keywords go to `pandas.read_csv`.
    """
    mapped = {k: fields.pop(k) for k in list(fields) if k.endswith("_field")}
    _check_field_names(mapped)
    return _load_file(path, "csv", sid_field, mapped, **fields)


def read_jsonl(path: str | Path, *, sid_field: str | None = None, **fields: str) -> Dataset:
    """Read a JSON Lines file (one object per line), mapping fields like `read_csv`."""
    _check_field_names(fields)
    return _load_file(path, "jsonl", sid_field, fields)


def _check_field_names(fields: Mapping[str, Any]) -> None:
    allowed = {f"{name}_field" for name in ROW_FIELDS}
    unknown = sorted(set(fields) - allowed)
    if unknown:
        raise DatasetError(
            f"unknown field mapping {unknown}; allowed: sid_field, {', '.join(sorted(allowed))}."
        )


def check_rows(rows: Sequence[Any]) -> None:
    """Every row of a list is a dict (a mapping of column to value); say which is not."""
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise DatasetError(
                f"data is a list, but row {i} is a {type(row).__name__} ({str(row)[:60]!r}), "
                "not a dict: give each row as a dict of columns, e.g. "
                "{'evaluated_model_input': 'question', 'evaluated_model_gold_answer': 'answer'}.")


def load_dataset(data: DataInput) -> Dataset:
    """Turn any accepted ``data=`` value into a `Dataset`.

    Accepts a `Dataset`, a `DatasetLoader`, a DataFrame, a list of dicts, or a path to
    CSV, JSONL or Parquet.
    """
    if isinstance(data, Dataset):
        return data
    if isinstance(data, DatasetLoader):
        return _loaded(data)
    if isinstance(data, pd.DataFrame):
        check_width(len(data.columns), "the DataFrame")
        return Dataset(data.copy())
    if isinstance(data, (str, Path)):
        return _load_file(data, None, None, {})
    if isinstance(data, Sequence):
        check_rows(data)
        check_records(cast(Sequence[Mapping[str, Any]], data), "data (a list of dicts)")
        return Dataset(pd.DataFrame.from_records([dict(cast(Mapping[str, Any], r)) for r in data]))
    raise DatasetError(
        f"data must be a list of dicts, a DataFrame, a Dataset or a file path, "
        f"not {type(data).__name__}."
    )
