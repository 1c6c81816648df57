"""ruff and mypy, as configured in pyproject.toml, are clean; the package keeps its import
contracts (pyproject's [tool.importlinter], checked by import-linter), and breaks them
when a module adds a forbidden import."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_ruff_is_clean() -> None:
    out = _run("ruff", "check", ".")
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_is_clean() -> None:
    out = _run("mypy")
    assert out.returncode == 0, out.stdout + out.stderr


def _lint_imports(root: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
                          cwd=root, capture_output=True, text=True, timeout=120, env=env)


def test_import_contracts_are_kept() -> None:
    out = _lint_imports(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


@pytest.mark.parametrize(("module", "line", "contract"), [
    ("run/_probe.py", "import prefect", "No Prefect (nor Dask) in define/"),
    ("define/_probe.py", "from patronus_tasks.run import loop", "define -> run -> record"),
    ("record/_probe.py", "from patronus_tasks.results import summary", "define -> run -> record"),
    ("prefect/ui/_probe.py", "from patronus_tasks.prefect.runs import flow",
     "Prefect's rooms"),
    ("prefect/recorder/taskruns.py", "import pandas", "The recorder process starts light"),
    ("results/_probe.py", "from patronus_tasks.results import _probe2",
     "No import circle"),
])
def test_a_forbidden_import_breaks_its_contract(tmp_path: Path, module: str, line: str,
                                                contract: str) -> None:
    """A copy of the package, one import added: its contract is broken, by name."""
    shutil.copytree(ROOT / "patronus_tasks", tmp_path / "patronus_tasks",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    target = tmp_path / "patronus_tasks" / module
    target.write_text((target.read_text() if target.exists() else "") + f"\n{line}\n")
    if module == "results/_probe.py":  # and back: a circle
        (target.parent / "_probe2.py").write_text("from patronus_tasks.results import _probe\n")
    out = _lint_imports(tmp_path, {**os.environ, "PYTHONPATH": str(tmp_path)})
    assert out.returncode == 1, out.stdout + out.stderr
    broken = out.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken and ("_probe" in broken or "pandas" in broken), out.stdout
