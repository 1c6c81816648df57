"""The types of the dataset's columns in the results: one per column, whatever a run holds.

The runs of a series are read as one table (DuckDB's ``read_parquet`` over a glob, a
``pyarrow.dataset``): a column must not change type because one night's rows had no value
in it, or one missing number. Arrow's own inference follows the data (an empty column is
``null``; pandas makes whole numbers with a gap ``float64`` and, since pandas 3, text
``large_string``), so each column's type is settled here, by these rules:

- a column its dataset declares (a Parquet file's schema) has the declared type;
- a column with no value at all: ``evaluated_model_retrieved_context`` (passages) is
  ``list<string>``, anything else ``string`` (the DataFrame's own dtype when it declares
  one: ``Int64``, ``boolean``, ``string``, a datetime; ``object`` and ``float64`` are
  what pandas makes of a column it found nothing in, and declare nothing);
- whole numbers with a missing value (``float64`` to pandas) are ``int64``;
- any other column has the type Arrow gives its values, text as ``string`` (never
  ``large_string``), a category as its values' type;
- a column Arrow cannot type (mixed values: numbers and text) is JSON text, ``string``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from patronus_tasks.record.records import dataset_column_name

#: The types this package gives the well-known columns it reads as more than text.
_PACKAGE_TYPES = {"evaluated_model_retrieved_context": pa.list_(pa.string())}
_UNTYPED = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError)


def dataset_schema(df: pd.DataFrame, declared: pa.Schema | None = None
                   ) -> tuple[pa.Schema, frozenset[str]]:
    """The Arrow fields of the dataset's columns (``declared``: the types its file gives
    them), and which of them are stored as JSON text."""
    fields, text = [], set()
    for column in df.columns:
        if column == "sid":
            continue
        name = dataset_column_name(str(column))
        typ = column_type(str(column), df[column], declared)
        if typ is None:
            typ = pa.string()
            text.add(name)
        fields.append(pa.field(name, typ))
    return pa.schema(fields), frozenset(text)


def column_type(name: str, values: pd.Series, declared: pa.Schema | None = None
                ) -> pa.DataType | None:
    """The column's type by the rules above; None when it is stored as JSON text."""
    if declared is not None and name in declared.names:
        return plain(declared.field(name).type)
    if _nothing_declared(values) and bool(values.isna().all()):
        return _PACKAGE_TYPES.get(name, pa.string())
    try:
        typ = pa.Schema.from_pandas(values.to_frame(), preserve_index=False).field(0).type
    except _UNTYPED:
        return None
    return pa.int64() if pa.types.is_floating(typ) and _whole_with_gaps(values) else plain(typ)


def _nothing_declared(values: pd.Series) -> bool:
    return values.dtype == object or values.dtype == np.float64


def _whole_with_gaps(values: pd.Series) -> bool:
    """Whole numbers and a missing one: a column of ints as pandas keeps it."""
    if values.dtype != np.float64 or not values.isna().any():
        return False
    given = values.dropna().to_numpy()
    return bool((np.abs(given) < 2**53).all() and (given == np.floor(given)).all())


def plain(typ: pa.DataType) -> pa.DataType:
    """``typ`` as the results keep it: text as ``string``, bytes as ``binary``, lists as
    ``list``, whatever their sizes; a dictionary (a category) as its values."""
    if pa.types.is_dictionary(typ):
        return plain(typ.value_type)
    if pa.types.is_large_string(typ) or pa.types.is_string_view(typ):
        return pa.string()
    if pa.types.is_large_binary(typ) or pa.types.is_binary_view(typ):
        return pa.binary()
    if pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_list_view(typ):
        return pa.list_(plain(typ.value_type))
    return typ
