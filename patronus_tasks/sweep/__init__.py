"""Sweeps: which variant wins. Every variant of a grid of models, prompts and settings
(or a named list) over one dataset, together, then side by side.

- `sweep`, `asweep`: run them (one limit on calls for all, task outputs shared)
- `Sweep`: the result: ``experiments``, ``matrix()``, ``pareto()``, the headline
- `MATRIX_COLUMNS`: the matrix's columns

May import: the layers below (`api`, `prefect` and down); the command line imports it.
"""

import sys
import types
from typing import Any

from patronus_tasks.sweep.api import asweep, sweep
from patronus_tasks.sweep.matrix import COLUMNS as MATRIX_COLUMNS
from patronus_tasks.sweep.result import Sweep

__all__ = ["MATRIX_COLUMNS", "Sweep", "asweep", "sweep"]


class _CallableModule(types.ModuleType):
    """This package, callable as `sweep`: ``from patronus_tasks import sweep`` names the
    function, and Python binds a loaded subpackage's name on its parent, so the name may
    be this module instead; called, it is the function all the same."""

    def __call__(self, *args: Any, **kwargs: Any) -> Sweep:
        return sweep(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
