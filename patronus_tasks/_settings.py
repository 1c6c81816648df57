"""Environment settings: results location, and Prefect server defaults for many task runs."""

from __future__ import annotations

import os
from pathlib import Path

RESULTS_DIR_ENV = "PATRONUS_TASKS_RESULTS_DIR"

#: Server-side settings for Prefect's built-in local server. With Prefect's defaults the
#: server records ~25 task runs/s and, stopped at process exit, silently loses the rest;
#: bigger batches and short flush intervals let it keep up. Only unset variables are set,
#: and only server processes read them.
SERVER_DEFAULTS = {
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "500",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_READ_BATCH_SIZE": "100",
    "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_READ_BATCH_SIZE": "100",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL": "1",
    "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_BATCH_SIZE": "500",
    "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_FLUSH_INTERVAL": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
}


def apply_server_defaults() -> None:
    """Set `SERVER_DEFAULTS` for any server this process starts (ephemeral or test)."""
    for key, value in SERVER_DEFAULTS.items():
        os.environ.setdefault(key, value)


def default_results_dir() -> Path:
    """``$PATRONUS_TASKS_RESULTS_DIR``, else ``./results``."""
    return Path(os.environ.get(RESULTS_DIR_ENV) or "results")
