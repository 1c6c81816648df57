"""Which calls become Prefect task runs (``record=``): a name light enough for the
recorder process, which imports it before anything else."""

from __future__ import annotations

from typing import Literal

#: All of them and the spans inside them (each a task run nested in its call's); every
#: call but no spans; or only the calls that failed or did not pass (a server that limits
#: the rate, Prefect Cloud: the rest are counted in the figures). Coarser levels drop spans
#: first.
RecordMode = Literal["all", "calls", "failures"]
RECORD_MODES = ("all", "calls", "failures")
