"""What a Prefect flow that runs experiments may want from this package."""

from patronus_tasks.integrations.prefect import server_hook
from patronus_tasks.integrations.prefect.runs import experiment_flow_run_name


def use_built_in_server() -> None:
    """Let Prefect's built-in server, when this process starts one, be this package's:
    it waits up to 120 s for a new database's migrations (Prefect's own gives up after
    20 s, which a fresh 2-core machine needs), runs lean, below normal priority, and dies
    with the process. Call it before a ``@flow`` of yours runs without
    ``PREFECT_API_URL``; experiments and ``patronus-tasks run`` do it themselves."""
    server_hook.install()


__all__ = ["experiment_flow_run_name", "use_built_in_server"]
