"""Reviewed rows appended to a labelled dataset (``review(..., into="datasets/labels.jsonl")``):
the calibration set a nightly checks its judge on (`calibrate`) grows from each review.

Each row is what the judge saw (``evaluated_model_input``, ``evaluated_model_output``,
``evaluated_model_gold_answer``, ``evaluated_model_retrieved_context``) and the people's
``label`` (their most common one; a row they split evenly on is not added), with the
``evaluator``, the ``reviewers`` and where it came from. A row already in the file (the
same evaluator, sample id and output) is not added again; the same sample id with
another output gets an id of its own (``<sid>~<hash>``). One file holds one judge's
rows: `calibrate` reads every label as one of that judge's.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from patronus_tasks.exceptions import ConfigError
from patronus_tasks.results.reviewed import consensus
from patronus_tasks.review.rows import Reviewable


@dataclass(frozen=True)
class Appended:
    """What `append` did: rows added, rows already there, rows the reviewers split on."""

    path: Path
    added: int
    known: int
    split: int

    def said(self) -> str:
        more = [f"{self.known} there already" if self.known else "",
                f"{self.split} the reviewers split on (not added)" if self.split else ""]
        return f"{self.added} reviewed rows added to {self.path}" + "".join(f"; {m}" for m in more if m)


def _plain(value: Any) -> Any:
    """A cell as JSON takes it (a Parquet list column is read back as an array)."""
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _digest(value: Any) -> str:
    text = json.dumps(_plain(value), sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _existing(path: Path, evaluator: str) -> tuple[set[tuple[str, str]], set[str]]:
    """The (sid, output digest) pairs and the sids in the file; a `ConfigError` when it
    holds another evaluator's rows or a line that is no JSON object."""
    pairs: set[tuple[str, str]] = set()
    sids: set[str] = set()
    if not path.exists():
        return pairs, sids
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not isinstance(row, dict):
            raise ConfigError(f"review: {path} line {number} is no JSON object; into= appends to a "
                              "JSON Lines file of labelled rows (fix the line, or name a new file).")
        if row.get("evaluator") not in (None, evaluator):
            raise ConfigError(f"review: {path} holds rows labelled for {row.get('evaluator')!r}, not "
                              f"{evaluator!r}: one file per judge (calibrate reads every label as "
                              "that judge's); name another file.")
        sids.add(str(row.get("sid")))
        pairs.add((str(row.get("source_sid", row.get("sid"))), str(row.get("output_digest", ""))))
    return pairs, sids


def check_target(into: str | Path) -> Path:
    text = str(into)
    if "://" in text or not text.endswith(".jsonl"):
        raise ConfigError(f"review: into= is a local JSON Lines file (…/labels.jsonl) the reviewed "
                          f"rows are appended to, not {text!r}.")
    return Path(text)


def append(into: str | Path, rows: list[Reviewable], labels: pd.DataFrame, source: str) -> Appended:
    """Append the labelled ``rows`` (see the module) to ``into``."""
    path = check_target(into)
    evaluator = rows[0].evaluator if rows else ""
    agreed, _ = consensus(labels, evaluator)
    known, sids = _existing(path, evaluator)
    lines, already, split = [], 0, 0
    labelled = set(labels[labels["evaluator"] == evaluator]["sid"].astype(str))
    for r in rows:
        if r.sid not in agreed.index:
            split += r.sid in labelled  # labelled, but the reviewers split evenly
            continue
        digest = _digest(r.output)
        if (r.sid, digest) in known:
            already += 1
            continue
        sid = r.sid if r.sid not in sids else f"{r.sid}~{digest[:8]}"
        sids.add(sid)
        known.add((r.sid, digest))
        lines.append(json.dumps(_row(r, sid, str(agreed[r.sid]), labels, source, digest),
                                ensure_ascii=False, default=str))
    if lines:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as out:
            out.write("".join(line + "\n" for line in lines))
    return Appended(path, len(lines), already, split)


def _row(r: Reviewable, sid: str, label: str, labels: pd.DataFrame, source: str,
         digest: str) -> dict[str, Any]:
    mine = labels[(labels["evaluator"] == r.evaluator) & (labels["sid"].astype(str) == r.sid)]
    return {"sid": sid, "evaluated_model_input": _plain(r.input),
            "evaluated_model_output": _plain(r.output),
            "evaluated_model_gold_answer": _plain(r.gold_answer),
            "evaluated_model_retrieved_context": _plain(r.context), "label": label,
            "evaluator": r.evaluator, "reviewers": sorted(set(mine["reviewer"])),
            "source": source, "source_sid": r.sid, "output_digest": digest,
            "added_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
