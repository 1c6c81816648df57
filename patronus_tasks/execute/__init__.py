"""An experiment executed, top to bottom, whatever runs its rows: `setup` checks every
argument and builds the `run.spec.ExperimentSpec` (the backend resolved, an earlier run
found to resume); `run` runs the rows through a backend into Parquet, then the metrics,
the gates and the verdict (`run_kept`, with a `Keeper` the backend provides).

May import: `define`, `run`, `record`, `results` and the ground modules; Prefect only
inside functions, to tell a task runner or find prefect-dask. `prefect/`, `api` and the
command line import it.
"""
