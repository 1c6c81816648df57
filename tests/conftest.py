"""Shared fixtures. Prefect tests share one real Prefect server (prefect_test_harness)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import patronus_tasks  # noqa: F401  (sets the server defaults before any server starts)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[str]:
    """A real Prefect server on 127.0.0.1 with a temporary database, for the session."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield str(PREFECT_API_URL.value())


@pytest.fixture
def results_dir(tmp_path: Path) -> Path:
    return tmp_path / "results"


@pytest.fixture(autouse=True)
def _no_ambient_results_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PATRONUS_TASKS_RESULTS_DIR", raising=False)
    os.environ.setdefault("PREFECT_LOGGING_TO_API_ENABLED", "false")
