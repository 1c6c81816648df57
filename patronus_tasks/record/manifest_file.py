"""``manifest.json`` as a file: read into a `Manifest`, written whole from one, and kept
current while Prefect records the run (the only place the manifest is a dict)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Protocol

from pydantic import ValidationError

from patronus_tasks.exceptions import ConfigError
from patronus_tasks.record import parquet as _parquet
from patronus_tasks.record.location import Location
from patronus_tasks.record.manifest import Manifest, PrefectRecords, VerdictNote

#: Seconds between writes of the manifest for Prefect's task-run counts alone (each write
#: is the whole file, and on object storage a request): the flow run, the verdict and
#: the end are written at once.
PROGRESS_EVERY = 5.0


class RecordsProgress(Protocol):
    """How far Prefect is with an experiment's task runs (the recording's view)."""

    @property
    def flow_run_id(self) -> str | None: ...
    @property
    def series(self) -> str | None: ...
    @property
    def expected(self) -> int: ...
    @property
    def recorded(self) -> int: ...
    @property
    def lost(self) -> int: ...
    @property
    def ended(self) -> bool: ...


def read_manifest(out_dir: Path | Location) -> Manifest | None:
    """The experiment's manifest: ``manifest.json``, else (only the results file was kept)
    the one the results file holds as written with its records; None: neither."""
    location = Location.of(out_dir)
    path, results = location / _parquet.MANIFEST_FILE, location / _parquet.RESULTS_FILE
    if path.exists():
        return _validated(path.read_bytes(), path, "fix it, or remove it to read the one the "
                          "results file keeps")
    meta = (results.read_schema().metadata or {}) if results.exists() else {}
    if _parquet.METADATA_KEY not in meta:
        return None
    return _validated(meta[_parquet.METADATA_KEY], results, "its records are still readable (to_dataframe)")


def _validated(text: bytes, where: Location, fix: str) -> Manifest:
    try:
        return Manifest.model_validate_json(text)
    except ValidationError as exc:
        wrong = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'the file'}: {e['msg']}"
                          for e in exc.errors(include_url=False))
        raise ConfigError(f"{where} holds no manifest patronus-tasks reads ({wrong}); "
                          f"{fix}") from None


class ManifestFile:
    """The experiment's ``manifest.json``, rewritten whole (atomically: a new file renamed
    over it, or one object written whole) on every change.

    Two writers, one lock: the experiment's loop writes each state of the run (`write`:
    running, then completed or interrupted, then with the reporters' outcome), and the
    thread that hears how far Prefect is notes its flow run and task runs in it
    (`note_records`), also after the run returned. ``current`` is the manifest as last
    written: what `Experiment.manifest` shows meanwhile.
    """

    #: One lock for every manifest of the process: the recorder of an earlier run in the
    #: same folder (before a resume or a retry) may still be catching up.
    _lock = threading.Lock()

    def __init__(self, out_dir: Path | Location) -> None:
        self.path = Location.of(out_dir) / _parquet.MANIFEST_FILE
        self.current: Manifest | None = None
        self._noted = _Noted()  # what the recording said: flow run, series, task runs
        self._saved_at = 0.0

    def write(self, manifest: Manifest) -> Manifest:
        """``manifest`` written, with what the recording said (where it says nothing)."""
        with self._lock:
            self.current = self._noted.onto(manifest)
            self._save(self.current)
            return self.current

    def note_records(self, progress: RecordsProgress) -> None:
        """The flow run, and how many task runs Prefect holds (a recording's progress):
        written at once when the flow run, the verdict or the end is new, else (counts
        only) at most every `PROGRESS_EVERY` seconds."""
        with self._lock:
            self._noted.hear(progress)
            if self.current is None:
                return
            before, after = self.current, self._noted.onto(self.current, over=True)
            if after == before:
                return
            news = (after.flow_run_id, after.verdict, progress.ended) != (
                before.flow_run_id, before.verdict, False)
            if not news and time.monotonic() - self._saved_at < PROGRESS_EVERY:
                self.current = after  # shown by `Experiment.manifest`; on disk with the next
                return
            ours = self._still_ours(before)  # before the change: it compares with the file
            self.current = after
            if ours:
                self._save(after)

    def _still_ours(self, current: Manifest) -> bool:
        """Whether the file is still this run's: a later run in the same folder (resume,
        ``retry_errors``) owns it once it has written it."""
        try:
            on_disk = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return True
        return bool(on_disk.get("started_at") == current.started_at)

    def _save(self, manifest: Manifest) -> None:
        self._saved_at = time.monotonic()
        self.path.write_bytes(json.dumps(manifest.to_json(), indent=2, default=str).encode())


class _Noted:
    """What the recording said of the run, to keep in every manifest written after."""

    def __init__(self) -> None:
        self.flow_run_id: str | None = None
        self.series: str | None = None
        self.prefect: PrefectRecords | None = None
        self.verdict: VerdictNote | None = None

    def hear(self, progress: RecordsProgress) -> None:
        self.flow_run_id = progress.flow_run_id or self.flow_run_id
        self.series = progress.series or self.series
        self.verdict = getattr(progress, "verdict_note", None) or self.verdict
        self.prefect = PrefectRecords(
            task_runs=progress.expected, task_runs_recorded=progress.recorded,
            task_runs_lost=progress.lost, complete=progress.ended and not progress.lost)

    def onto(self, manifest: Manifest, over: bool = False) -> Manifest:
        """``manifest`` with what was noted: where it says nothing, or (``over``) over it."""
        noted = {"flow_run_id": self.flow_run_id, "series": self.series, "prefect": self.prefect,
                 "verdict": self.verdict}
        update = {k: v for k, v in noted.items()
                  if v is not None and (over or getattr(manifest, k) is None)}
        return manifest.model_copy(update=update) if update else manifest


def note_verdict(out_dir: Path | Location, note: VerdictNote) -> None:
    """Add the verdict to the manifest written in ``out_dir`` (rows run by Prefect's engine:
    no recording hears it)."""
    current = read_manifest(out_dir)
    if current is not None:
        ManifestFile(out_dir).write(current.model_copy(update={"verdict": note}))
