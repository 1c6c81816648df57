"""The recorder process's entry point: ``python -m patronus_tasks.prefect.recorder``.

Its start-up is on the path of a small experiment's figures (task runs visible after the
return: ~2 s for 10 rows, of which ~1 s is importing Prefect). coolname, which Prefect
imports for random run names (ours are given), is loaded only if something reads it
(`lazy.defer`): its word lists took 0.12 s. (Prefect's notification blocks, 0.10 s, cannot
be deferred so: finding them imports `prefect.blocks`, which imports them.) Measured with
``python -X importtime``.
"""

from patronus_tasks.prefect.recorder.lazy import defer

defer("coolname")

from patronus_tasks.prefect.recorder.main import main  # noqa: E402  (after the deferral)

main()
