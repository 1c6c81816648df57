"""Which calls become Prefect task runs (``record=``): a name light enough for the
recorder process, which imports it before anything else."""

from __future__ import annotations

from typing import Literal

#: All of them, or only those that failed or did not pass (a server that limits the
#: rate, Prefect Cloud: the rest are counted in the figures).
RecordMode = Literal["all", "failures"]
RECORD_MODES = ("all", "failures")
