"""Artifact keys: a series' runs share them, so a key's history in the UI is the series'."""

from __future__ import annotations

import re

#: Characters of a key's series part: the UI lists keys in a narrow column.
KEY_CHARS = 40


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def series_slug(series: str) -> str:
    """The series as a short key: of ``<flow>/<deployment>/<project>`` the deployment and
    project (a deployment names its flow's runs), a part another one contains left out
    (``text-to-sql-nightly/text-to-sql`` is ``text-to-sql-nightly``), at most
    `KEY_CHARS` characters. Two series that shorten alike are still told apart by the
    full series each results link carries (`series.previous_run`)."""
    parts = [_slug(p) for p in series.split("/")]
    parts = parts[1:] if len(parts) == 3 else parts
    kept = [p for i, p in enumerate(parts) if p and not any(
        p in q and (p != q or j < i) for j, q in enumerate(parts) if j != i)]
    slug = "-".join(kept)
    if len(slug) > KEY_CHARS:
        slug = slug[:KEY_CHARS].rsplit("-", 1)[0] if "-" in slug[:KEY_CHARS] else slug[:KEY_CHARS]
    return slug.strip("-") or "experiment"


def artifact_key(series: str, kind: str) -> str:
    """``<series>-<kind>`` in the lowercase-and-dashes form Prefect requires."""
    return f"{series_slug(series)}-{kind}"
