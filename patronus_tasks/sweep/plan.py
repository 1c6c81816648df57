"""A sweep's variants, from its grid or its named list: labels, values, the options each
overrides, the baseline; every mistake a `ConfigError` naming the culprit and the fix,
before any call is made.

A grid ``{"model": ["a", "b"], "prompt": {"terse": P1, "polite": P2}}`` is every
combination, in the grid's order (the last key moving fastest), each labelled
``model=a,prompt=terse``. A key that is one of ``run_experiment``'s own options (``task``,
``evaluators``, ``chain``, ``tags``, ``repeats``, ...) overrides the sweep's for that
variant; every other key is a parameter its steps read from ``variant``.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from patronus_tasks.define.names import safe_name
from patronus_tasks.define.steps import Step
from patronus_tasks.define.variant import Variant
from patronus_tasks.exceptions import ConfigError

#: ``run_experiment`` options a variant may set for itself.
VARIANT_OPTIONS = frozenset({
    "task", "evaluators", "chain", "tags", "repeats", "fail_on_error", "min_pass_rates",
    "fail_on_regression", "regression_threshold", "reporters", "record", "html_report",
    "cache", "prices", "metrics", "min_metrics", "metadata"})
#: Options that are the sweep's, one for all its variants.
SWEEP_ONLY = frozenset({
    "data", "dataset", "max_concurrency", "results_dir", "backend", "resume", "retry_errors",
    "experiment_id", "experiment_name", "dask_address", "on_progress", "series",
    "print_summary", "display_hist"})


@dataclass(frozen=True)
class Cell:
    """One variant: what its steps see (`Variant`) and the options it overrides."""

    variant: Variant
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.variant.label


@dataclass(frozen=True)
class Plan:
    """The variants in order, the baseline's label, and the grid's keys (none for a
    named list)."""

    cells: tuple[Cell, ...]
    baseline: str
    keys: tuple[str, ...] = ()

    @property
    def labels(self) -> list[str]:
        return [c.label for c in self.cells]


def value_label(value: Any) -> str | None:
    """How a value reads in a label: itself (text, numbers), a step's or function's name,
    evaluators' names joined; None when it has no readable name."""
    if value is None or isinstance(value, str | int | float | bool):
        return str(value)
    if isinstance(value, Step):
        return value.name
    if isinstance(value, Sequence) and value and all(isinstance(v, Step) for v in value):
        return "+".join(v.name for v in value)
    name = getattr(value, "__name__", None)
    return name if isinstance(name, str) and callable(value) else None


def _axis(key: str, given: Any) -> list[tuple[str, Any]]:
    """One grid key's (label, value) pairs."""
    if not isinstance(key, str) or not key:
        raise ConfigError(f"grid keys must be non-empty strings, not {key!r}.")
    if isinstance(given, Mapping):
        pairs = [(label, value) for label, value in given.items()]
        bad = [label for label, _ in pairs if not isinstance(label, str) or not label]
        if bad:
            raise ConfigError(f"grid[{key!r}]: labels must be non-empty strings, not {bad[0]!r}.")
    elif isinstance(given, Sequence) and not isinstance(given, str | bytes):
        pairs = [(_labelled(key, value), value) for value in given]
    else:
        raise ConfigError(f"grid[{key!r}] must be a list of values or a dict of label -> value, "
                          f"not {type(given).__name__}: e.g. grid={{{key!r}: [{given!r}]}}.")
    if not pairs:
        raise ConfigError(f"grid[{key!r}] is empty: give it at least one value, or drop the key.")
    return pairs


def _labelled(key: str, value: Any) -> str:
    label = value_label(value)
    if label is None:
        raise ConfigError(f"grid[{key!r}] holds a {type(value).__name__} with no name to label "
                          f"its variant by: give grid[{key!r}] as a dict of label -> value.")
    return label


def _check_key(key: str, where: str) -> None:
    if key in SWEEP_ONLY:
        raise ConfigError(f"{where} sets {key!r}, which is the sweep's, one for all its variants: "
                          f"give it to sweep(..., {key}=...) instead.")


def _cell(label: str, params: Mapping[str, Any], shown: Mapping[str, str]) -> Cell:
    options = {k: v for k, v in params.items() if k in VARIANT_OPTIONS}
    values = {k: v for k, v in params.items() if k not in VARIANT_OPTIONS}
    return Cell(Variant(label, values, dict(shown)), options)


def from_grid(grid: Mapping[str, Any]) -> tuple[list[Cell], tuple[str, ...]]:
    """Every combination of the grid, in its order."""
    if not isinstance(grid, Mapping):
        raise ConfigError(f"grid must be a dict of key -> values, not {type(grid).__name__}.")
    if not grid:
        raise ConfigError("the grid is empty: give at least one key and its values, e.g. "
                          "grid={'model': ['gpt-4o-mini', 'llama-3.1-8b']}.")
    axes = {key: _axis(key, given) for key, given in grid.items()}
    for key in axes:
        _check_key(key, f"grid key {key!r}")
    cells = []
    for combo in itertools.product(*axes.values()):
        shown = {key: label for key, (label, _) in zip(axes, combo, strict=True)}
        params = {key: value for key, (_, value) in zip(axes, combo, strict=True)}
        cells.append(_cell(",".join(f"{k}={v}" for k, v in shown.items()), params, shown))
    return cells, tuple(axes)


def from_variants(variants: Mapping[str, Mapping[str, Any]]) -> list[Cell]:
    """A named list: ``{name: {key: value, ...}}``, each name its label."""
    if not isinstance(variants, Mapping):
        raise ConfigError(f"variants must be a dict of name -> {{key: value}}, not "
                          f"{type(variants).__name__}.")
    if not variants:
        raise ConfigError("variants is empty: give at least one, e.g. variants={'small': "
                          "{'model': 'gpt-4o-mini'}}.")
    cells = []
    for name, params in variants.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"variant names must be non-empty strings, not {name!r}.")
        if not isinstance(params, Mapping):
            raise ConfigError(f"variants[{name!r}] must be a dict of key -> value, not "
                              f"{type(params).__name__}.")
        for key in params:
            _check_key(key, f"variants[{name!r}]")
        shown = {k: value_label(v) or type(v).__name__ for k, v in params.items()}
        cells.append(_cell(name, params, shown))
    return cells


def _unique(cells: list[Cell]) -> None:
    """No two variants with one label, nor with one folder name (their results would mix)."""
    seen: dict[str, str] = {}
    for cell in cells:
        folder = safe_name(cell.label)
        if folder in seen:
            twice = cell.label if seen[folder] == cell.label else f"{seen[folder]!r} and {cell.label!r}"
            raise ConfigError(f"two variants are labelled {twice} (their results folders would be "
                              "one): give each value its own label, as a dict of label -> value "
                              "(grid) or a name of its own (variants).")
        seen[folder] = cell.label


def _baseline(cells: list[Cell], keys: tuple[str, ...], given: str | Mapping[str, Any] | None) -> str:
    labels = [c.label for c in cells]
    if given is None:
        return labels[0]
    if isinstance(given, Mapping):
        return _cell_of(cells, keys, given)
    if given not in labels:
        raise ConfigError(f"baseline {given!r} is not one of the sweep's variants: "
                          f"{', '.join(map(repr, labels))}.")
    return given


def _cell_of(cells: list[Cell], keys: tuple[str, ...], given: Mapping[str, Any]) -> str:
    """The label of the cell whose every grid key has the given label (or value)."""
    if not keys:
        raise ConfigError("baseline as a dict names a grid cell; with variants=, give its name.")
    if set(given) != set(keys):
        raise ConfigError(f"baseline must give every grid key once ({', '.join(keys)}), not "
                          f"{', '.join(map(str, given)) or 'none'}.")
    for cell in cells:
        if all(_matches(cell, k, v) for k, v in given.items()):
            return cell.label
    raise ConfigError(f"baseline {dict(given)!r} is not in the grid; its variants: "
                      f"{', '.join(c.label for c in cells)}.")


def _matches(cell: Cell, key: str, given: Any) -> bool:
    if cell.variant.shown.get(key) == given:
        return True
    value = cell.variant.values.get(key, cell.options.get(key))
    try:
        return value is given or bool(value == given)
    except Exception:  # a value whose == does not answer a bool (an array)
        return False


def make_plan(grid: Mapping[str, Any] | None, variants: Mapping[str, Mapping[str, Any]] | None,
              baseline: str | Mapping[str, Any] | None) -> Plan:
    """The sweep's variants and baseline, checked."""
    if (grid is None) == (variants is None):
        raise ConfigError("a sweep needs grid= (every combination of values) or variants= "
                          "(a named list), one of them.")
    keys: tuple[str, ...] = ()
    if grid is not None:
        cells, keys = from_grid(grid)
    else:
        assert variants is not None
        cells = from_variants(variants)
    _unique(cells)
    return Plan(tuple(cells), _baseline(cells, keys, baseline), keys)
