"""Modules loaded when first read, not when imported (`importlib.util.LazyLoader`)."""

from __future__ import annotations

import importlib.util
import sys


def defer(*names: str) -> None:
    """Have each module (if installed, and not imported yet) load on its first attribute
    read instead of at its import: ``import x`` then binds a module that loads itself when
    ``x.something`` is read."""
    for name in names:
        if name in sys.modules:
            continue
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):  # its parent package failed, or is not there
            continue
        if spec is None or spec.loader is None:
            continue
        loader = importlib.util.LazyLoader(spec.loader)
        spec.loader = loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        loader.exec_module(module)
