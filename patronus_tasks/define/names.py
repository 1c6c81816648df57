"""Names on disk and in Prefect: an experiment's folder name, a run's tag. Light (no
pyarrow): the recorder process and the UI's links use them too."""

from __future__ import annotations

import re


def safe_name(name: str) -> str:
    """A file-system-safe version of ``name``: no separators, no leading dots."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._")
    return cleaned[:120] or "unnamed"


def run_tag(folder: str, experiment: str) -> str | None:
    """The Prefect tag of a run in a folder not named after its experiment (``try-1-2``,
    a second run of ``try-1``): ``run:try-1-2``, so that lists of one run's task runs
    (its findings, its errors) are not also the other run's. None for the first run."""
    return None if folder == safe_name(experiment) else f"run:{folder}"
