"""What the Prefect UI shows of an experiment: the artifacts (summary, rows, comparison,
calibration), their charts and the series across nights and its baseline (`baselines`),
links, artifact keys, the progress artifact, and the states a recorded call is shown in
(`display`);
`postrun` publishes them once the rows are done.

May import: Prefect's client side, `prefect.internal`, `record`, `results`, `report`
and the ground modules; not `prefect.runs` or `prefect.recorder`.
"""
