"""The Prefect servers this package starts: the built-in one in place of Prefect's
(`local`, installed by `hook` when Prefect loads its server module), and `stack`:
``patronus-tasks server up``, and its production topology (PostgreSQL, Redis, several API
processes, the services apart).

May import: Prefect (its server only inside functions: ~3 s of imports), `prefect.internal`
and the ground modules.
"""
