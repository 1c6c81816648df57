"""ruff and mypy, as configured in pyproject.toml, are clean; the package keeps its import
contracts (pyproject's [tool.importlinter], checked by import-linter), and breaks them
when a module adds a forbidden import."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

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


#: One forbidden import per contract: (module, the import added, the contract it breaks).
PROBES = [
    ("run/_probe.py", "import prefect", "No Prefect (nor Dask) in define/"),
    ("define/_probe.py", "from patronus_tasks.run import loop", "define -> run -> record"),
    ("prefect/ui/_probe.py", "from patronus_tasks.prefect.runs import flow", "Prefect's rooms"),
    ("prefect/recorder/taskruns.py", "import pandas", "The recorder process starts light"),
    # Prefect in the recorder's start-up (its progress artifact): ~1.0 s of imports.
    ("prefect/ui/progress.py", "import prefect", "The recorder process starts light"),
    ("results/_probe.py", "from patronus_tasks.results import _probe2", "No import circle"),
    # A circle one of whose sides imports for type hints alone (the poster and the
    # recorder it posts for were one, issue 49).
    ("prefect/recorder/poster.py", "import typing\nif typing.TYPE_CHECKING:\n"
     "    from patronus_tasks.prefect.recorder import taskruns", "No import circle"),
]


def test_a_forbidden_import_breaks_its_contract(tmp_path: Path) -> None:
    """A copy of the package with one forbidden import per contract: every contract is
    broken, each naming its import (one lint of the copy: ~0.5 s, not one per contract)."""
    shutil.copytree(ROOT / "patronus_tasks", tmp_path / "patronus_tasks",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    (tmp_path / "tests").mkdir()  # the project's own contract types (pyproject's contract_types)
    for helper in ("__init__.py", "import_contracts.py"):
        shutil.copy(ROOT / "tests" / helper, tmp_path / "tests")
    for module, line, _ in PROBES:
        target = tmp_path / "patronus_tasks" / module
        target.write_text((target.read_text() if target.exists() else "") + f"\n{line}\n")
    # ...and back from the circle's second module.
    (tmp_path / "patronus_tasks" / "results" / "_probe2.py").write_text(
        "from patronus_tasks.results import _probe\n")
    out = _lint_imports(tmp_path, {**os.environ, "PYTHONPATH": str(tmp_path), "COLUMNS": "400"})
    assert out.returncode == 1, out.stdout + out.stderr
    broken = out.stdout.split("Broken contracts", 1)[-1]
    for module, line, contract in PROBES:
        start = next(m.end() for m in re.finditer(rf"^{re.escape(contract)}.*\n-+\n", broken, re.M))
        section = broken[start:].split("\n\n\n", 1)[0]
        named = module.rsplit("/", 1)[-1].removesuffix(".py")
        assert named in section or line.split()[-1] in section, (contract, section)
    assert "0 kept" in out.stdout, out.stdout  # every contract broken
