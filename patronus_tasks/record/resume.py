"""Resuming an experiment: reuse what a previous run of it completed, run the rest.

What is reused or run is a run of a row: a sample, and with ``repeats=N`` one of its N
repeats (records are matched by sample id and repeat).

A previous run leaves records in ``results.parquet`` (finished), or in parts and
journals (interrupted), or in ``previous.parquet`` plus newer parts (a resume that was
itself interrupted). `consolidate` merges them into ``previous.parquet``, newer records
winning per sample, so the new run can write a fresh set of parts beside it.

Rows whose records hold no error are reused whole, without any call. Rows with an error
run again, but every step that completed in them (a task's output, an evaluator's
verdict) is replayed from its record rather than requested again.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from patronus_tasks.define.step_results import EvaluationResult, TaskResult, Usage
from patronus_tasks.record import parquet as _parquet
from patronus_tasks.record.location import Location
from patronus_tasks.record.records import STATUS_ERROR, STATUS_OK, STATUS_SKIPPED, Record
from patronus_tasks.record.spans_file import SPANS_FILE
from patronus_tasks.trace.spans import SpanData, load_spans

PREVIOUS_FILE = _parquet.PREVIOUS_FILE
TASK = "\x00task"  # the task's key among a link's steps (no evaluator can have this name)


def _loads(text: str | None) -> Any:
    return json.loads(text) if text else None


def _usage(model: str | None, input_tokens: int | None, output_tokens: int | None) -> Usage | None:
    if model is None and input_tokens is None and output_tokens is None:
        return None
    return Usage(model=model, input_tokens=input_tokens, output_tokens=output_tokens)


def _task_result(record: Record) -> TaskResult | None:
    if record.status == STATUS_SKIPPED and record.evaluator_name is None:
        return None
    return TaskResult(evaluated_model_output=record.task_output,
                      metadata=_loads(record.task_metadata), tags=_loads(record.task_tags),
                      usage=_usage(record.task_model, record.task_input_tokens,
                                   record.task_output_tokens))


def _evaluation(record: Record) -> EvaluationResult | None:
    if record.status == STATUS_SKIPPED:
        return None
    return EvaluationResult(
        pass_=record.pass_, score_raw=record.score, text_output=record.text_output,
        explanation=record.explanation, metadata=_loads(record.evaluation_metadata),
        tags=_loads(record.evaluation_tags), evaluation_duration=record.evaluation_duration_s,
        usage=_usage(record.evaluation_model, record.evaluation_input_tokens,
                     record.evaluation_output_tokens))


@dataclass
class Replayed:
    """A step's outcome taken from a previous run's record (what it cost then, whether the
    cache answered it)."""

    value: Any
    attempts: int
    duration: float | None
    cached: bool = False
    cost: float | None = None
    spans: list[SpanData] | None = None


def _replayed(value: Any, attempts: int | None, duration: float | None, cached: bool | None,
              cost: float | None, spans: str | None) -> Replayed:
    """A step as its record left it: a call the cache answered made no attempt."""
    return Replayed(value, attempts or (0 if cached else 1), duration, bool(cached), cost,
                    load_spans(spans))


#: A run of a row: its sample id and repeat (None without repeats).
UnitKey = tuple[str, int | None]


@dataclass
class Replay:
    """What a previous run completed, by run of a row (sample id and repeat)."""

    rows: dict[UnitKey, list[Record]] = field(default_factory=dict)
    retry_errors_only: bool = False
    #: Runs of rows written already by this very run (a batch's attempt that died on its
    #: worker): never run, nor written, again, errors or not.
    written: frozenset[UnitKey] = frozenset()

    def complete(self, sid: str, repeat: int | None = None) -> bool:
        """Reuse this run of a row whole: it ran before and nothing in it failed."""
        records = self.rows.get((sid, repeat))
        return records is not None and all(r.status != STATUS_ERROR for r in records)

    def wanted(self, sid: str, repeat: int | None = None) -> bool:
        """Run this run of a row (again): missing ones only when not just retrying errors."""
        if (sid, repeat) in self.written or self.complete(sid, repeat):
            return False
        return (sid, repeat) in self.rows or not self.retry_errors_only

    def steps(self, sid: str, repeat: int | None = None) -> dict[tuple[int, str], Replayed]:
        """The completed steps of a run of a row that will run again, keyed (link, step)."""
        found: dict[tuple[int, str], Replayed] = {}
        for r in self.rows.get((sid, repeat), []):
            link = r.link_index or 0
            task_ok = r.task_name is not None and r.error_stage != "task"
            if task_ok and (r.status != STATUS_ERROR or r.error_stage == "evaluator"):
                found[(link, TASK)] = _replayed(_task_result(r), r.task_attempts,
                                                r.task_duration_s, r.task_cached,
                                                r.task_cost_usd, r.task_spans)
            if r.evaluator_name is not None and r.status in (STATUS_OK, STATUS_SKIPPED):
                found[(link, r.evaluator_name)] = _replayed(
                    _evaluation(r), r.evaluation_attempts, r.evaluation_duration_s,
                    r.evaluation_cached, r.evaluation_cost_usd, r.evaluation_spans)
        return found

    def reused_records(self) -> Iterator[list[Record]]:
        for (sid, repeat), records in self.rows.items():
            if self.complete(sid, repeat):
                yield records

    def of(self, sids: set[str]) -> Replay:
        """This replay for the rows ``sids`` only (a batch's)."""
        return Replay({k: v for k, v in self.rows.items() if k[0] in sids}, self.retry_errors_only,
                      frozenset(k for k in self.written if k[0] in sids))

    def with_written(self, units: set[UnitKey]) -> Replay:
        """This replay, and ``units`` written already by this run."""
        return Replay(self.rows, self.retry_errors_only, self.written | units)


def _by_unit(table: pa.Table | None) -> dict[UnitKey, list[Record]]:
    rows: dict[UnitKey, list[Record]] = defaultdict(list)
    if table is not None:
        for values in table.to_pylist():  # the file's boundary: records from here
            record = Record.from_row(values)
            rows[(record.sid, record.repeat)].append(record)
    return dict(rows)



def consolidate(out_dir: Path | Location) -> pa.Table | None:
    """Merge everything earlier runs left into ``previous.parquet``; return it.

    Each step leaves what a repeat of it reads the same: ``previous.parquet`` is written
    whole before the final file and the parts it holds are removed.
    """
    out_dir = Location.of(out_dir)
    older_path = out_dir / _parquet.RESULTS_FILE
    if not older_path.exists():
        older_path = out_dir / PREVIOUS_FILE
    older = older_path.read_table() if older_path.exists() else None
    newer_parts = _parquet.unfinished_tables(out_dir)
    newer = pa.concat_tables(newer_parts, promote_options="permissive") if newer_parts else None
    if newer is not None and older is not None:
        keep = pc.invert(pc.is_in(_parquet.unit_keys(older),
                                  value_set=pc.unique(_parquet.unit_keys(newer))))
        older = pa.concat_tables([older.filter(keep), newer], promote_options="permissive")
    merged = older if older is not None else newer
    if merged is None:
        return None
    (out_dir / PREVIOUS_FILE).write_table(merged.replace_schema_metadata(None))
    (out_dir / _parquet.RESULTS_FILE).remove()
    (out_dir / SPANS_FILE).remove()  # made again with the results
    _parquet.remove_parts(out_dir)
    return merged


def load_replay(out_dir: Path | Location, retry_errors_only: bool) -> Replay:
    """The previous run's records in ``out_dir``, ready to reuse."""
    return Replay(_by_unit(consolidate(out_dir)), retry_errors_only)


def finish(out_dir: Path | Location) -> None:
    """After the resumed run is final, the previous records are in it: drop them."""
    (Location.of(out_dir) / PREVIOUS_FILE).remove()
