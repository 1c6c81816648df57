"""What the post-run changes on the server, as values: made where the results are read,
applied where the client is.

The post-run computes (`postrun.compute`: the results read, compared, charted, the
verdict) in the experiment's process, which has pandas, pyarrow and the results loaded
already; the recorder process, which has the client, only asks (`asking`) and applies
these (`apply`). It never loads what computing takes (~1.4 s of CPU a run, measured,
the end of every small run's process). Light on purpose: no pandas, no Prefect.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from patronus_tasks.prefect import internal
from patronus_tasks.prefect.flowruns import add_tags
from patronus_tasks.prefect.protocol import Verdict, Write
from patronus_tasks.prefect.ui import made

if TYPE_CHECKING:
    from patronus_tasks.prefect.internal import ApiClient

__all__ = ["Verdict", "Write", "apply"]


async def apply(client: ApiClient, write: Write) -> None:
    """Make ``write`` on the server."""
    if write.what == "artifact":
        await made.create(client, write.kind, write.data, write.flow_run_id, key=write.key,
                          description=write.description)
    elif write.what == "tags":
        assert write.flow_run_id is not None
        await add_tags(client, write.flow_run_id, list(write.data))
    else:
        await internal.post_logs(client, list(write.data))
