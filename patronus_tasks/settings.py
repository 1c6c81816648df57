"""Environment settings of the package as a whole: where results go, whether they go to the
Patronus platform, and how a number of seconds is read from the environment (Prefect's
settings are in `patronus_tasks.prefect.settings`)."""

from __future__ import annotations

import os
from pathlib import Path

from patronus_tasks.exceptions import ConfigError

RESULTS_DIR_ENV = "PATRONUS_TASKS_RESULTS_DIR"
#: ``1`` (or true/yes/on) sends every `Client`'s experiment results to the Patronus
#: platform too, as ``Client(report_to_patronus=True)`` does.
REPORT_ENV = "PATRONUS_REPORT"

def default_results_dir() -> Path:
    """``$PATRONUS_TASKS_RESULTS_DIR``, else ``./results``."""
    return Path(os.environ.get(RESULTS_DIR_ENV) or "results")


def report_to_patronus() -> bool:
    """Whether ``$PATRONUS_REPORT`` asks for results on the Patronus platform."""
    return os.environ.get(REPORT_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def seconds_from_env(name: str, default: float) -> float:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:  # also NaN
        raise ConfigError(f"{name}={text!r} is not a number of seconds: set it to one above 0 "
                          f"(e.g. {default:g}), or unset it for the default ({default:g} s)")
    return value
