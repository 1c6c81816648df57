"""The ``<series>-progress`` artifact: how many of an experiment's rows are done.

Apart from the other artifacts (`artifacts`, which read the results with pandas): the
recorder process moves it from the start, when a second of imports would hold back the
first task runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from patronus_tasks.prefect import internal
from patronus_tasks.prefect.ui.keys import artifact_key
from patronus_tasks.prefect.ui.made import create

if TYPE_CHECKING:
    from patronus_tasks.prefect.internal import ApiClient


class ProgressArtifact:
    """The ``<series>-progress`` artifact: rows completed (%), moved as they are told."""

    def __init__(self, series: str, total: int, flow_run_id: str) -> None:
        self.key, self.flow_run_id = artifact_key(series, "progress"), flow_run_id
        self._total = max(total, 1)
        self._id: str | None = None
        self._shown = -1.0

    async def show(self, done: int, client: ApiClient) -> None:
        """Show ``done`` rows (made on the first call; unchanged figures are not sent)."""
        percent = min(100.0, max(0.0, round(100.0 * done / self._total, 2)))
        if self._id is None:
            made = await create(client, "progress", percent, self.flow_run_id, key=self.key,
                                description="rows completed (%)")
            self._id, self._shown = made, percent
        elif percent != self._shown:
            await internal.update_artifact(client, self._id, {"data": percent})
            self._shown = percent
