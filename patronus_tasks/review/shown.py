"""A row's facts as a person reads them: in the pause form (Prefect's two UIs) and in a
terminal. Model output and dataset text are untrusted: never Markdown, never a terminal's
control sequence.

Prefect's UIs differ on the form (seen in Chromium, Prefect 3.9.1): v1 renders a field's
description as Markdown (links and images live), v2 shows it as plain text; both show a
field's title as text and render the form's description as Markdown. So what a field
shows goes through `report.markdown.inert` (invisible marks: a backslash would show in
v2) and what the description shows through `report.markdown.text`.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from patronus_tasks.report.markdown import cut, fold, inert, text

#: C0 and C1 controls but tab and newline, and DEL: a terminal's escape sequences.
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")

#: Characters of each fact shown (the rest cut, with an ellipsis): a row reads in about
#: a screen of the ~510 px form at most.
CUTS = {"judge": 200, "explanation": 400, "input": 400, "output": 800, "gold answer": 300,
        "context": 600}


def as_text(value: Any) -> str:
    """A cell's value as text, control characters dropped: a list of passages numbered
    (``[1] ... [2] ...``), None empty."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if value is None:
        return ""
    if isinstance(value, list | tuple):
        value = " ".join(f"[{i}] {v}" for i, v in enumerate(value, 1))
    return _CONTROLS.sub("", str(value))


def in_field(value: Any, width: int | None = None) -> str:
    """``value`` for a form field's title or description: one line, cut at ``width``."""
    return str(inert(cut(fold(as_text(value)), width)))


def in_markdown(value: Any, width: int | None = None) -> str:
    """``value`` in the form's description (Markdown): one line, cut at ``width``."""
    return text(cut(fold(as_text(value)), width))


def in_terminal(value: Any, width: int | None = None) -> str:
    """``value`` for a terminal: its own line breaks kept, control characters dropped."""
    lines = [" ".join(line.split()) for line in as_text(value).splitlines()]
    return cut("\n".join(line for line in lines if line), width)
