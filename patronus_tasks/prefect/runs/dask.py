"""Dask, for ``backend="dask"``: one of Prefect's task runners, `DaskTaskRunner`.

The rows go through it as through any task runner (`prefect/taskrunner`): in batches,
each a Prefect task run on a Dask worker.
"""

from __future__ import annotations

from typing import Any

from patronus_tasks.exceptions import ConfigError


def dask_task_runner(address: str | None) -> Any:
    """A `DaskTaskRunner`: on the scheduler at ``address``, or on a local cluster of two
    worker processes."""
    try:
        from prefect_dask import DaskTaskRunner
    except ImportError:
        raise ConfigError("backend='dask' needs prefect-dask: pip install "
                          "'patronus-tasks[dask]'") from None
    if address:
        return DaskTaskRunner(address=address)
    from patronus_tasks.prefect.runs.dask_cluster import local_cluster

    # Not `LocalCluster`: its workers import the user's script again (see dask_cluster).
    return DaskTaskRunner(cluster_class=local_cluster,
                          cluster_kwargs={"n_workers": 2, "threads_per_worker": 1})
