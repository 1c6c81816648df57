"""What the post-run asks the server before this run is published: the series' previous
run, its baseline, its history table (`Asked`).

Light on purpose (httpx through `internal`, no pandas, no Prefect): the recorder process
asks, and the experiment's process, which has the results' modules loaded, computes the
post-run from the answers (`postrun.compute`).
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import TYPE_CHECKING, Any

from patronus_tasks.prefect import internal
from patronus_tasks.prefect.protocol import Asked, Found, PreviousRun
from patronus_tasks.prefect.ui.keys import artifact_key
from patronus_tasks.report.markdown import plain, text

if TYPE_CHECKING:
    from patronus_tasks.prefect.internal import ApiClient

#: Latest results links of a key read to find the series' own (keys are short: two
#: series may share one).
LINKS_READ = 20
#: Columns of the history's rows from before, now said otherwise ("33.3% worse", the
#: verdict): kept, they made the table wider than the UI shows.
_HISTORY_BEFORE = frozenset({"regressed", "rows", "task errors", "evaluator errors"})


async def ask(series: str, client: ApiClient, pinned: str | None = None) -> Asked:
    """The previous run, the baseline (``pinned``: a run's results link given in code)
    and the history of ``series``, asked at once."""
    previous, found, earlier = await asyncio.gather(
        previous_run(series, client), find(series, client, pinned), earlier_history(series, client))
    return Asked(previous, found, earlier)


def _of_series(artifact: dict[str, Any], series: str) -> bool:
    said = re.search(r"\(series (.*)\)$", artifact.get("description") or "")
    # A link from before says no series, or says it unescaped.
    return said is None or said.group(1) in (text(series), series)


async def series_link(series: str, kind: str, client: ApiClient,
                      oldest: bool = False) -> tuple[PreviousRun, str] | None:
    """The latest (or ``oldest``: every version read, newest first, a page at a time) of
    the series' ``kind`` link artifact: where it points and its flow run, its description."""
    key = artifact_key(series, kind)
    mine: list[dict[str, Any]] = []
    size, read = (200 if oldest else LINKS_READ), 0  # Prefect sorts them newest first only
    while True:
        found = await internal.latest_artifacts(client, key, size, offset=read)
        mine, read = mine + [a for a in found if _of_series(a, series)], read + len(found)
        if not oldest or len(found) < size:
            break
    if not mine:
        return None
    chosen = mine[-1] if oldest else mine[0]
    # The target after the last "](": the link's text may hold one.
    data, flow_run_id = chosen.get("data"), chosen.get("flow_run_id")
    written = re.search(r".*\]\((.*)\)$", str(data or ""))
    target = written.group(1) if written else str(data)
    run = str(flow_run_id) if flow_run_id else None
    return PreviousRun(target, run), str(chosen.get("description") or "")


async def previous_run(series: str, client: ApiClient) -> PreviousRun | None:
    """The latest results link of ``series`` (ask before publishing this run's)."""
    found = await series_link(series, "results", client)
    return found[0] if found is not None else None


async def find(series: str, client: ApiClient, pinned: str | None = None) -> Found | None:
    """The run ``series`` is judged against: ``pinned`` (a run's results link, given in
    code), else its baseline (accepted, or its first run; None: it has no run yet)."""
    if pinned is not None:
        return Found(pinned, None, "pinned")
    kept = await series_link(series, "baseline", client)
    if kept is not None:
        run, said = kept
        how = "accepted" if ": accepted " in said else "first run"
        return Found(run.location, run.flow_run_id, how)
    first = await series_link(series, "results", client, oldest=True)  # from before baselines
    return None if first is None else Found(first[0].location, first[0].flow_run_id,
                                            "first run", recorded=False)


async def earlier_history(series: str, client: ApiClient) -> list[dict[str, Any]]:
    """The rows of ``<series>-history`` as the series' previous run left them (ask before
    publishing this run's)."""
    found = await internal.latest_artifacts(client, artifact_key(series, "history"), 1)
    return [{k: v for k, v in r.items() if k not in _HISTORY_BEFORE}
            for r in (read_table(found[0].get("data")) if found else [])]


def read_table(data: Any) -> list[dict[str, Any]]:
    """A table artifact's rows, as they were given to `artifacts.table_artifact`; none
    from a table that is not one (edited by hand, or cut): the series' history then starts
    anew, and the run's own artifacts are still published (it is read before them)."""
    try:
        rows = json.loads(data) if isinstance(data, str) else data
    except ValueError:
        return []
    if not isinstance(rows, list):
        return []
    return [{k: plain(v) for k, v in r.items()} for r in rows if isinstance(r, dict)]


__all__ = ["Asked", "Found", "PreviousRun", "ask", "earlier_history", "find", "previous_run",
           "read_table", "series_link"]
