"""People in the loop: `review` asks people to label an experiment's judged rows in the
Prefect UI (or a terminal: ``patronus-tasks review``), keeps what they say beside the
results (``labels.parquet``, `Experiment.labels`), holds the judge to it (kappa, and
the reviewers' own agreement) and grows the labelled set its calibration reads.

    select.py    which rows: disagreements, uncertain, failed, a stratified sample, a function
    rows.py      a row to review (`Reviewable`) and the scale a person answers on
    form.py      a page of rows as the pause form, its answer read back
    shown.py     a row's facts as text: in the form (never Markdown), in a terminal
    run.py       `review`, `review_in_terminal`, `reviewed_experiment`
    terminal.py  the terminal's questions
    into.py      reviewed rows appended to a labelled dataset

May import: the package's layers below it (Prefect's pause and artifacts through
`patronus_tasks.prefect`, when asked; none of Prefect for the terminal's review).

``from patronus_tasks import review`` gives the function; this module stands for it too
(it is callable), since importing any of its modules makes ``patronus_tasks.review``
this package.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from patronus_tasks.review.form import MAX_PAGE_SIZE, PAGE_SIZE
from patronus_tasks.review.rows import Reviewable
from patronus_tasks.review.run import Review, review, review_in_terminal, reviewed_experiment


class _Callable(types.ModuleType):
    """This package, callable as `review` (see the module)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Review:
        return review(*args, **kwargs)


sys.modules[__name__].__class__ = _Callable

__all__ = ["MAX_PAGE_SIZE", "PAGE_SIZE", "Review", "Reviewable", "review", "review_in_terminal",
           "reviewed_experiment"]
