"""Looking at results: charts of a run and of a series, figures and Markdown tables
(`cells`), and one self-contained HTML page per experiment (`write_report`,
``patronus-tasks report``).

May import: `results`, `record`, `define` and the ground modules; no Prefect.
"""

from patronus_tasks.report.build import REPORT_FILE, build_report, write_report

__all__ = ["REPORT_FILE", "build_report", "write_report"]
