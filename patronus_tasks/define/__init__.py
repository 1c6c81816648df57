"""Defining an experiment: the steps (`@task`, `@evaluator`, `Task`, `Evaluator`: `steps`,
`simple`), what they return (`step_results`), the row they are given (`row`, `params`),
chains of links (`chain`), datasets and their loaders (`dataset`), dataset-level metrics
(`metrics`), model prices (`prices`) and the inline-call policy (`inline`).

May import: the ground modules (`exceptions`) only; nothing of running or recording.
"""
