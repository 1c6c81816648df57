"""A sweep's folder: ``<results_dir>/<project>/<sweep name>.sweep/``, holding ``sweep.json``
(its variants, each one's experiment folder and how it ended), its matrix as CSV and its
HTML report. Each variant's experiment is an experiment of its own beside it
(``<sweep name>/<label>``), which every other command reads as usual.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from patronus_tasks.define.names import safe_name
from patronus_tasks.exceptions import ConfigError
from patronus_tasks.record.location import Location

SWEEP_FILE = "sweep.json"
MATRIX_FILE = "matrix.csv"
REPORT_FILE = "report.html"
SUFFIX = ".sweep"
VariantStatus = Literal["pending", "completed", "failed", "interrupted"]


@dataclass
class VariantEntry:
    """One variant as the sweep's file keeps it."""

    label: str
    shown: dict[str, str] = field(default_factory=dict)
    experiment: str | None = None  # its experiment's folder, beside the sweep's
    experiment_id: str | None = None
    status: VariantStatus = "pending"
    error: str | None = None  # why it failed
    gate_failures: list[str] = field(default_factory=list)


@dataclass
class SweepFile:
    """``sweep.json``."""

    project: str
    sweep_name: str
    baseline: str
    keys: list[str]
    variants: list[VariantEntry]
    status: Literal["running", "completed", "interrupted"] = "running"
    started_at: str = field(default_factory=lambda: dt.datetime.now(dt.UTC).isoformat())
    ended_at: str | None = None
    dataset_sha256: str | None = None
    series: str | None = None  # its artifacts' keys; each variant's is <series>/<label>
    flow_run_id: str | None = None
    shared_calls: int = 0  # task calls a variant took from another's output

    def entry(self, label: str) -> VariantEntry:
        return next(v for v in self.variants if v.label == label)

    def write(self, folder: Location) -> None:
        (folder / SWEEP_FILE).write_bytes(json.dumps(asdict(self), indent=1).encode())

    @classmethod
    def read(cls, folder: Location) -> SweepFile:
        try:
            raw: dict[str, Any] = json.loads((folder / SWEEP_FILE).read_text())
            raw["variants"] = [VariantEntry(**v) for v in raw["variants"]]
            return cls(**raw)
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise ConfigError(f"the sweep's file {folder / SWEEP_FILE} cannot be read ({exc}): "
                              "run the sweep again without resume=True.") from None


def sweep_folders(root: Location, project: str, name: str) -> list[Location]:
    """The folders of earlier sweeps of this name: ``name.sweep``, ``name-2.sweep``, ..."""
    base, n = safe_name(name), 1
    found: list[Location] = []
    while True:
        folder = root / safe_name(project) / f"{base}{'' if n == 1 else f'-{n}'}{SUFFIX}"
        if not (folder / SWEEP_FILE).exists():
            return found
        found.append(folder)
        n += 1


def new_folder(root: Location, project: str, name: str) -> Location:
    """The first folder of this sweep name no sweep has used."""
    n = len(sweep_folders(root, project, name)) + 1
    folder = root / safe_name(project) / f"{safe_name(name)}{'' if n == 1 else f'-{n}'}{SUFFIX}"
    folder.mkdir()
    return folder


def variant_name(sweep_name: str, label: str) -> str:
    """A variant's experiment name: ``<sweep name>/<label>``."""
    return f"{sweep_name}/{label}"
