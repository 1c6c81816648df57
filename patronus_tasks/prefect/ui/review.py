"""A review in the Prefect UI: ``<series>-review``, a Markdown artifact on the flow run
that asked people (`review`): what was asked and answered, the judge against its
reviewers (and theirs among themselves), and the reviewed rows, each reviewer's label
beside the judge's answer."""

from __future__ import annotations

import warnings
from typing import Any

from patronus_tasks.prefect.ui.keys import artifact_key
from patronus_tasks.report.cells import markdown_table
from patronus_tasks.report.markdown import text
from patronus_tasks.results.reviewed import Reviewed


def review_markdown(title: str, said: str, reviewed: Reviewed, rows: list[dict[str, Any]]) -> str:
    """The artifact's Markdown: the review's outcome, the figures, the rows."""
    lines = [f"# Review of {text(reviewed.evaluator)}: {text(title)}", "", text(said), "",
             text(reviewed.headline())]
    if reviewed.agreement is not None and len(reviewed.agreement.categories):
        lines += ["", "## Judge against the reviewers", "",
                  *markdown_table(reviewed.agreement.confusion_rows())]
    if rows:
        lines += ["", "## Reviewed rows (disagreements first)", "", *markdown_table(rows)]
    return "\n".join(lines)


def publish_review(series: str, title: str, markdown: str, said: str) -> None:
    """Create the artifact on the current flow run (its Artifacts tab)."""
    from prefect.artifacts import MarkdownArtifact

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        MarkdownArtifact(markdown=markdown, key=artifact_key(series, "review"),
                         description=f"{title}: {said}").create()
