"""What a Prefect flow that runs experiments may want from this package."""

from patronus_tasks.integrations.prefect.runs import experiment_flow_run_name

__all__ = ["experiment_flow_run_name"]
