"""Looking at results: charts of a run and of a series, figures and Markdown tables
(`cells`), and one self-contained HTML page per experiment (`write_report`,
``patronus-tasks report``).

May import: `results`, `record`, `define` and the ground modules; no Prefect.

The names below load `build` when first read: `markdown` (the escaping every artifact
uses) is then importable alone, without pandas, by the recorder process.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from patronus_tasks.report.build import REPORT_FILE, build_report, write_report

__all__ = ["REPORT_FILE", "build_report", "write_report"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("patronus_tasks.report.build"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
