"""A finished experiment, read back from its folder (local or in object storage):
manifest, records, summary."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from patronus_tasks.exceptions import ConfigError
from patronus_tasks.record import labels as _labels
from patronus_tasks.record import parquet as _parquet
from patronus_tasks.record.location import Location
from patronus_tasks.record.manifest import Manifest, MetricValue
from patronus_tasks.record.manifest_file import ManifestFile, read_manifest
from patronus_tasks.record.spans_file import SPANS_FILE, read_spans, spans_table
from patronus_tasks.results.summary import SUMMARY_COLUMNS, Summary, summarize
from patronus_tasks.results.usage import USAGE_COLUMNS


class Recorded(Protocol):
    """A recording of the experiment's task runs still catching up (run here)."""

    @property
    def lost(self) -> int: ...
    def wait(self, timeout: float | None = None) -> bool: ...


class Experiment:
    """A finished experiment: its folder, manifest and results.

    ``to_dataframe()`` reads the records back from Parquet: one row per (sample, chain
    link, evaluator), with the dataset's columns beside the results.
    """

    def __init__(self, path: str | Path | Location, recording: Recorded | None = None,
                 live: ManifestFile | None = None) -> None:
        self.location = Location.of(path)  # a folder, or a URL of object storage
        self._recording = recording  # a recording still catching up, when run here
        self._live = live  # the manifest file being kept current meanwhile
        # Read now: a later run in the same folder (a retry) rewrites the file.
        self._read, self._unreadable = _read(self.location) \
            if live is None or live.current is None else (None, None)

    @property
    def manifest(self) -> Manifest:
        """What ran, on what data, with what totals (`Manifest`, from ``manifest.json``).

        While Prefect catches up (this process ran it), as last written: its flow run and
        the task runs Prefect holds so far; read it again for the current one.
        """
        known = self._known
        if known is None and self._unreadable is not None:
            raise self._unreadable  # the records stay readable
        if known is None:
            raise FileNotFoundError(f"no manifest.json (nor results) in {self.location}: not "
                                    "an experiment's folder, or its run never started")
        return known

    @property
    def info(self) -> Manifest:
        """The manifest (`manifest`): its name while that was a dict, kept."""
        return self.manifest

    def wait_recorded(self, timeout: float | None = None) -> bool:
        """Wait until Prefect has recorded every task run of this experiment (it returned
        with its results while Prefect caught up); True when it has (or nothing was due).
        Then `manifest` says so (``prefect.complete``), as ``manifest.json`` does."""
        recording = self._recording
        if recording is None:
            return True
        return bool(recording.wait(timeout)) and not recording.lost

    def __repr__(self) -> str:
        return f"Experiment({self.name!r}, path={str(self.location)!r})"

    @property
    def path(self) -> Path | Location:
        """The experiment's folder: a `Path` when local, else its `Location`."""
        return _local_or(self.location)

    @property
    def name(self) -> str:
        known = self._known
        return known.experiment_name if known is not None else self.location.name

    @property
    def project(self) -> str:
        known = self._known
        return known.project if known is not None else self.location.parent.name

    @property
    def _known(self) -> Manifest | None:
        """The manifest, if there is one (the names fall back to the folder's)."""
        live = self._live.current if self._live is not None else None
        return live if live is not None else self._read

    @property
    def results_path(self) -> Path | Location:
        """The results file: a `Path` when local, else its `Location` (``str()`` shows
        its URL, credentials left out)."""
        return _local_or(self.location / _parquet.RESULTS_FILE)

    def to_dataframe(self, columns: Sequence[str] | None = None) -> pd.DataFrame:
        """The records (``columns``: only these), as a DataFrame."""
        return _parquet.read_frame(self.location, list(columns) if columns else None)

    def spans(self) -> pd.DataFrame:
        """Every span of the experiment, one row each (``spans.parquet``): where it ran
        (``sid``, ``repeat``, ``link_index``, ``step``), ``span_id``, ``parent_id``,
        ``name``, ``kind``, ``started_at``, ``ended_at`` (seconds since the epoch, as the
        results' times), ``arguments``, ``output``, ``error``, the model's
        ``input_tokens``/``output_tokens`` and ``cost``, ``attributes`` as JSON. A file
        written before these names (``sample_id``, ``start``, ``end``) is read as them."""
        final = self.location / SPANS_FILE
        if final.exists():
            return read_spans(final).to_pandas()
        return spans_table(_parquet.read_results(self.location)).to_pandas()  # not finished

    def labels(self) -> pd.DataFrame:
        """What people said of its rows (``labels.parquet``, written by `review`): one row
        per (``sid``, ``evaluator``, ``reviewer``) with the ``label``, the reviewer's
        ``note`` and when (``reviewed_at``, UTC); empty when no one reviewed it."""
        return _labels.read_labels(self.location)

    def to_csv(self, path_or_buf: Any = None, **kwargs: Any) -> str | None:
        """Write (or return, with no path) the records as CSV."""
        return self.to_dataframe().to_csv(path_or_buf, index=False, **kwargs)

    def to_json(self, path_or_buf: Any = None, **kwargs: Any) -> str | None:
        """Write (or return, with no path) the records as JSON Lines."""
        kwargs = {"orient": "records", "lines": True, "force_ascii": False, **kwargs}
        return self.to_dataframe().to_json(path_or_buf, **kwargs)

    def summary(self, df: pd.DataFrame | None = None) -> Summary:
        """Per (link, evaluator) statistics of the records (``df``: already read records)."""
        known = self._known
        links = known.links if known is not None else []
        order = [(i, e.name) for i, lk in enumerate(links) for e in lk.evaluators]
        # A finished run's manifest has its usage, counted from this very file: not
        # counted again (150 MB more at a million records), nor its columns read.
        usage = known.usage if known is not None and known.status == "completed" else None
        wanted = [c for c in SUMMARY_COLUMNS if usage is None or c not in USAGE_COLUMNS]
        # Only what the summary reads: the dataset's columns can be most of the records.
        records = self.to_dataframe(wanted) if df is None else df
        return summarize(records, order, location=self._where(), metrics=self.metrics,
                         usage=usage)

    def _where(self) -> str:
        """The results file; for a run not finished (interrupted, or running), its folder:
        the rows done are parts there until a resume merges them."""
        if self._known is None or self._known.status == "completed":
            return str(self.results_path)
        return (f"{_local_or(self.location)} ({self._known.status}: its rows done are in "
                f"parts/ until it is resumed)")

    @property
    def metrics(self) -> list[MetricValue]:
        """The dataset-level metrics computed after the rows (``metrics=``)."""
        return (self._known.metrics or []) if self._known is not None else []

    def format_summary(self, display_hist: bool = True) -> str:
        """The summary as text (``display_hist``: with score histograms)."""
        summary = self.summary()
        title = f"Experiment {self.project}/{self.name}"
        known = self._known
        if known is not None and known.status != "completed":
            title += f" ({known.status}: {summary.runs} of {known.dataset.rows * known.repeats} rows)"
        return summary.format(title, histograms=display_hist)


def _read(location: Location) -> tuple[Manifest | None, ConfigError | None]:
    """The manifest, or why it cannot be read (said when it is asked for)."""
    try:
        return read_manifest(location), None
    except ConfigError as exc:
        return None, exc


def _local_or(location: Location) -> Path | Location:
    # Local results keep giving `Path`s, as they always did.
    return location.local if location.local is not None else location
