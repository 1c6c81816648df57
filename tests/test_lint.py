"""ruff and mypy, as configured in pyproject.toml, are clean."""

from __future__ import annotations

import subprocess
import sys

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
