"""The Prefect releases supported: pyproject's dependency, the range the code checks at
run time and the versions CI tests are one and the same; one outside it is accepted with
a warning that names the range and the fix."""

from __future__ import annotations

import tomllib
import warnings

import pytest

from patronus_tasks.prefect import internal

from .conftest import ROOT


def test_pyproject_allows_the_supported_range() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (low, high) = internal.SUPPORTED_PREFECT
    assert f"prefect>={low[0]}.{low[1]},<{high[0]}.{high[1]}" in deps


def test_ci_tests_both_ends_of_the_range() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    lowest, newest = internal.TESTED_PREFECT
    assert f"prefect=={lowest}" in ci  # the contract tests on the lowest release
    assert internal.prefect_outside_range(lowest) is None
    assert internal.prefect_outside_range(newest) is None


@pytest.mark.parametrize("version", ["3.7.8", "3.10.0", "4.0.0", "3.10.0rc1"])
def test_a_release_outside_the_range_is_named_with_the_fix(version: str) -> None:
    said = internal.prefect_outside_range(version)
    assert said is not None and f"Prefect {version} is outside" in said
    assert ">=3.8,<3.10" in said and "pip install 'prefect>=3.8,<3.10'" in said


def test_it_is_a_warning_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "3.10.2")
    monkeypatch.setattr(internal, "_WARNED", False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        internal.warn_outside_range()
        internal.warn_outside_range()
    assert [str(w.message)[:31] for w in seen] == ["Prefect 3.10.2 is outside the r"]
    assert seen[0].category is RuntimeWarning
