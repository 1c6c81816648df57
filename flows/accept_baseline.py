"""Accept a run as its series' baseline, from the Prefect UI's Run form: the nights after
it are judged against it (and against the night before), and a regression against the
old baseline stops being kept.

A night worse than its series' baseline stays Regressed, night after night, until
someone accepts a run: give this deployment's Run form the run's name (its flow run's
name before the ``@``, e.g. ``exp-20260301-020000``; `patronus-tasks list` shows them),
or run ``patronus-tasks accept RUN``, which does the same.
"""

from __future__ import annotations

from prefect import flow, get_run_logger

from patronus_tasks.prefect import accept_baseline, use_built_in_server


@flow(name="accept-baseline", flow_run_name="accept {run}")
def accept(run: str, results_dir: str | None = "results") -> str:
    """Make a run the baseline of its series; return (and log) the series' new baseline.

    Args:
        run: The run to hold as good: its experiment name (its latest run), its run
            folder's name, or a path to it.
        results_dir: Where the runs' results are: a folder (relative to the working
            directory; a deployment's is the project folder) or an object-storage URL;
            empty for `$PATRONUS_TASKS_RESULTS_DIR`, else `./results`.
    """
    said = accept_baseline(run, results_dir or None)
    get_run_logger().info("%s", said)
    return said


if __name__ == "__main__":
    import sys

    use_built_in_server()
    accept(sys.argv[1])
