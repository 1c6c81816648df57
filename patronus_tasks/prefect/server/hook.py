"""Puts `local.LocalServer` in Prefect's place when Prefect loads its server module.

Prefect imports ``prefect.server.api.server`` only when it is about to start its built-in
server (~3 s of imports: the whole server application). Importing it to replace the
server would make everyone pay that; instead `install` leaves a finder that waits for
Prefect to import it, and installs `LocalServer` right after. Nothing installs it on
import: the recorder process does at its start, an experiment when it runs, ``patronus-tasks
run`` before it loads a file, and a script of one's own with `patronus_tasks.prefect.
use_built_in_server` (a ``@flow`` starts Prefect's server before any experiment runs).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # it imports Prefect's server module: only once that is loaded
    from patronus_tasks.prefect.server.local import LocalServer

from patronus_tasks.prefect.internal import SERVER_MODULE


class _InstallAfter(importlib.abc.Loader):
    """Prefect's loader of its server module, then `LocalServer` installed."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _install()


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != SERVER_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _InstallAfter(spec.loader)
        return spec


def _install() -> None:
    from patronus_tasks.prefect.server import local

    if not hasattr(local, "install"):
        return  # `local` is importing Prefect's server module: `install` goes on
    local.install()


def install() -> None:
    """Install `LocalServer` now if Prefect's server module is loaded, else when it is."""
    if SERVER_MODULE in sys.modules:
        _install()
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    if SERVER_MODULE in sys.modules:  # loaded meanwhile, by `local` itself
        _install()


def built_in() -> LocalServer | None:
    """This process's built-in server (a `LocalServer`), if it runs one."""
    if SERVER_MODULE not in sys.modules:
        return None
    from patronus_tasks.prefect.server import local

    return local.built_in()


def startup_note() -> str | None:
    """Once per process, when experiments run on the built-in server: what it costs and
    how to keep a server instead (a line for the flow run's log)."""
    server = built_in()
    if server is None or server.hinted:
        return None
    server.hinted = True
    return (f"This runs on Prefect's built-in server, started in {server.started_in:.1f} s for "
            "this process and stopped with it. To skip that start and keep every run in a UI: "
            "`patronus-tasks server up`, then `eval \"$(patronus-tasks server env)\"` (its "
            "API's URL and auth string); the UI is then at http://127.0.0.1:4200")
