"""The same questions in a terminal (``patronus-tasks review RUN``): one row at a time,
its facts, then the label (a value of the scale; Enter or "skip" for none; "quit" to
stop) and an optional note. Each label is written as soon as it is given (the same
``labels.parquet``): an interrupted review keeps what was answered."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TextIO

from patronus_tasks.record.labels import Label
from patronus_tasks.review.form import facts
from patronus_tasks.review.rows import Reviewable
from patronus_tasks.review.shown import CUTS, in_terminal

QUIT = ("quit", "q")
SKIP = ("", "skip", "s")


class Stop(Exception):
    """The reviewer quit (or the input ended)."""


@dataclass
class Terminal:
    """Questions asked on ``out``, answers read from ``inp`` (a line each)."""

    inp: TextIO
    out: TextIO

    def say(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def ask(self, prompt: str) -> str:
        self.out.write(prompt)
        self.out.flush()
        line = self.inp.readline()
        if not line:  # the input ended (Ctrl-D)
            raise Stop
        return line.strip()


def read_label(answer: str, scale: Sequence[str]) -> str | None:
    """The label ``answer`` gives (None: skip); a `ValueError` when it is off the scale."""
    if answer.lower() in SKIP and answer.lower() not in scale:
        return None
    if answer.lower() in QUIT and answer.lower() not in scale:
        raise Stop
    found = next((v for v in scale if v == answer or v.lower() == answer.lower()), None)
    if found is None:
        raise ValueError(answer)
    return found


def reviewer_name(t: Terminal, given: str | None) -> str:
    name = " ".join((given or "").split())
    while not name:
        name = " ".join(t.ask("Your name (your labels are kept under it): ").split())
    return name[:100]


def show_row(t: Terminal, row: Reviewable, index: int, total: int) -> None:
    t.say(f"\n── Row {index} of {total}: sid {in_terminal(row.sid, 80)} " + "─" * 20)
    for name, value in facts(row):
        t.say(f"{name}: {in_terminal(value, CUTS.get(name, 400))}")


def review_rows(t: Terminal, rows: Sequence[Reviewable], scale: Sequence[str], reviewer: str,
                keep: Callable[[Label], None]) -> int:
    """Ask each row in turn; ``keep`` each label at once. How many were labelled."""
    choices = "/".join(scale)
    given = 0
    try:
        for i, row in enumerate(rows, 1):
            show_row(t, row, i, len(rows))
            label = _label(t, choices, scale)
            if label is None:
                continue
            note = " ".join(t.ask("Note (Enter for none): ").split()) or None
            keep(Label(row.sid, row.evaluator, label, reviewer, note))
            given += 1
    except (Stop, KeyboardInterrupt):
        t.say("\nStopped: the labels given are kept.")
    return given


def _label(t: Terminal, choices: str, scale: Sequence[str]) -> str | None:
    while True:
        answer = t.ask(f"Your label [{choices}; Enter: skip; quit]: ")
        try:
            return read_label(answer, scale)
        except ValueError:
            t.say(f"{in_terminal(answer, 40)!r} is not on the scale: answer one of {choices}.")
