"""An experiment as a Prefect flow run: the flow, the engine that runs each row's steps as
task runs (`engine`, `calls`), Prefect task runners and Dask (`taskrunner`, `dask`,
`dask_cluster`), the run's opening for the recorder (`opening`) and the steps' logs
(`steplogs`); `orchestrate.run_on_prefect` ties them together.

May import: Prefect, `prefect.recorder`, `prefect.ui`, `prefect.server`, and `define`,
`run`, `record`, `results` below it.
"""
