"""A sweep's variant as its steps see it: the ``variant`` parameter.

A step that asks for ``variant`` (by name, like ``row``) gets a read-only mapping of its
sweep cell's parameter values (``{"model": "gpt-4o-mini", "prompt": "Be terse."}``); run
outside a sweep, an empty one. The mapping can note which keys a call read: a sweep shares
a task's output between variants that differ only in keys the task never read.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any


class VariantValues(Mapping[str, Any]):
    """The sweep cell's parameter values, read-only; ``read`` (when noting) holds the keys
    a call asked for (iterating reads them all)."""

    __slots__ = ("_values", "read")

    def __init__(self, values: Mapping[str, Any] | None = None, noting: bool = False) -> None:
        self._values = dict(values or {})
        self.read: set[str] | None = set() if noting else None

    def __getitem__(self, key: str) -> Any:
        if self.read is not None:
            self.read.add(key)  # a key missing is read too: its absence is what the call saw
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        if self.read is not None:
            self.read.update(self._values)
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def noting(self) -> VariantValues:
        """The same values, noting the keys read (one per call)."""
        return VariantValues(self._values, noting=True)

    def cache_key(self) -> dict[str, Any]:
        """The values, for the cache's key of a call (`record.cache.call_key`)."""
        return dict(self._values)

    def __repr__(self) -> str:
        return f"VariantValues({self._values!r})"


@dataclass(frozen=True)
class Variant:
    """One variant of a sweep: its label, the values its steps get (``variant``), and
    those values as shown (their labels: JSON, for manifests and Prefect parameters)."""

    label: str
    values: Mapping[str, Any] = field(default_factory=dict)
    shown: dict[str, str] = field(default_factory=dict)

    def view(self) -> VariantValues:
        return VariantValues(self.values)
