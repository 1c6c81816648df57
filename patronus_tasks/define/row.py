"""`Row`: one dataset sample as a `pandas.Series` with helpers for the well-known fields.

`Sample` is how the runner carries a row: plain values, with the `Row` built only for
a step that asks for ``row`` (a Series costs ~0.1 ms to build and each pandas read
~20 us: a dict is what most calls need).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd


def clean(value: Any) -> Any:
    """Missing values (NaN, NA, NaT) as None, so user code tests ``is None`` only."""
    if value is None:
        return None
    if isinstance(value, float) and math.isnan(value):
        return None
    if value is pd.NA or value is pd.NaT:
        return None
    return value


class Row(pd.Series):
    """A dataset row. Any column is readable as ``row[name]`` or ``row.name``.

    The ``evaluated_model_*`` properties return None when the column is absent or empty.
    ``sid`` is the sample id: the dataset's ``sid`` column, or the 1-based row position.
    """

    @property
    def _constructor(self) -> type[pd.Series]:
        return pd.Series

    def __getattr__(self, name: str) -> Any:
        # Columns read as attributes give None for missing values, like the properties.
        try:
            value = super().__getattr__(name)
        except AttributeError:
            if name.startswith("_"):
                raise
            raise AttributeError(f"the row has no column {name!r}; its columns: "
                                 f"{', '.join(map(str, self.index))}") from None
        return value if name.startswith("_") else clean(value)

    def _field(self, name: str) -> Any:
        return clean(self.get(name))

    @property
    def sid(self) -> str:
        """The stable sample id of this row."""
        return str(self["sid"])

    @property
    def evaluated_model_system_prompt(self) -> Any:
        return self._field("evaluated_model_system_prompt")

    @property
    def evaluated_model_retrieved_context(self) -> Any:
        return self._field("evaluated_model_retrieved_context")

    @property
    def evaluated_model_input(self) -> Any:
        return self._field("evaluated_model_input")

    @property
    def evaluated_model_output(self) -> Any:
        return self._field("evaluated_model_output")

    @property
    def evaluated_model_gold_answer(self) -> Any:
        return self._field("evaluated_model_gold_answer")


class Sample:
    """One dataset row as the runner uses it: its sid, its cleaned values by column,
    and its `Row` on demand."""

    __slots__ = ("_columns", "_raw", "_row", "sid", "values")

    def __init__(self, columns: pd.Index, raw: Sequence[Any]) -> None:
        self._columns, self._raw = columns, raw
        self.values: dict[str, Any] = {str(k): clean(v) for k, v in zip(columns, raw, strict=True)}
        self.sid = str(self.values["sid"])
        self._row: Row | None = None

    @property
    def row(self) -> Row:
        """The row as a `Row` (a `pandas.Series`), built on first use."""
        if self._row is None:
            self._row = Row(list(self._raw), index=self._columns, dtype=object)
        return self._row
