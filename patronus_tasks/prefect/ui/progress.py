"""The ``<series>-progress`` artifact: how many of an experiment's rows are done.

Apart from the other artifacts (`artifacts`, which read the results with pandas): the
recorder process moves it from the start, when a second of imports would hold back the
first task runs.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from prefect.artifacts import ProgressArtifact as _Progress
from prefect.artifacts import aupdate_progress_artifact

from patronus_tasks.prefect.ui.keys import artifact_key

if TYPE_CHECKING:
    from uuid import UUID

    from prefect.client.orchestration import PrefectClient
    from prefect.client.schemas.objects import Artifact as ArtifactResponse


class ProgressArtifact:
    """The ``<series>-progress`` artifact: rows completed (%), moved as they are told."""

    def __init__(self, series: str, total: int, flow_run_id: str) -> None:
        self.key, self.flow_run_id = artifact_key(series, "progress"), flow_run_id
        self._total = max(total, 1)
        self._id: UUID | None = None
        self._shown = -1.0

    async def show(self, done: int, client: PrefectClient) -> None:
        """Show ``done`` rows (made on the first call; unchanged figures are not sent)."""
        percent = round(100.0 * done / self._total, 2)
        if self._id is None:
            made = await _create(_Progress(progress=percent, key=self.key,
                                           flow_run_id=self.flow_run_id,
                                           description="rows completed (%)"), client)
            self._id, self._shown = made.id, percent
        elif percent != self._shown:
            await aupdate_progress_artifact(self._id, percent, client=client)
            self._shown = percent


async def _create(artifact: _Progress, client: PrefectClient) -> ArtifactResponse:
    with warnings.catch_warnings():  # made outside a run context, for its flow run
        warnings.simplefilter("ignore", FutureWarning)
        return await artifact.acreate(client)
