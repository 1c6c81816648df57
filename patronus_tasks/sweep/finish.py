"""After a sweep's rows: its matrix as CSV, its HTML report and, on Prefect, its flow
run's artifacts and state, in a thread the process waits for before it exits (the sweep
returns as soon as its variants' results are written)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

# Imported here, in the caller's thread: the work runs in a thread that may still be
# at it when the interpreter exits, when an import that registers an exit hook fails.
from patronus_tasks.prefect.protocol import UI_PREFIX
from patronus_tasks.prefect.ui.keys import artifact_key
from patronus_tasks.run.background import Afterwards
from patronus_tasks.sweep.charts import cost_axis, pareto_chart
from patronus_tasks.sweep.markdown import matrix_markdown, pareto_markdown
from patronus_tasks.sweep.report import write_sweep_report

if TYPE_CHECKING:
    from patronus_tasks.sweep.on_prefect import SweepRun
    from patronus_tasks.sweep.result import Sweep

logger = logging.getLogger("patronus_tasks")


#: Seconds the artifacts wait for the variants' flow runs to exist (they link to them).
FLOW_RUNS_WAIT = 30.0


def _flow_runs_known(sweep: Sweep, timeout: float = FLOW_RUNS_WAIT) -> None:
    """Until each variant's flow run is made (the recorder makes them one at a time, maybe
    after the rows are done), or it is done without one."""
    deadline = time.monotonic() + timeout
    for e in sweep.experiments.values():
        while e.manifest.flow_run_id is None and not e.wait_recorded(0.1):
            if time.monotonic() > deadline:
                return


def _flow_run_link(flow_run_id: str) -> str:
    """A flow run's page in the UI (the recorder process fills the UI's path in)."""
    return f"{UI_PREFIX}/runs/flow-run/{flow_run_id}"


def _artifacts(sweep: Sweep) -> list[tuple[str, str, str]]:
    """The sweep flow run's artifacts: (key, markdown, description)."""
    _flow_runs_known(sweep)
    matrix, series = sweep.matrix(), sweep.file.series or f"{sweep.project}/{sweep.name}"
    headline = f"{sweep.project}/{sweep.name}: {sweep.headline()}"
    found = [(artifact_key(series, "matrix"), matrix_markdown(sweep, matrix, _flow_run_link),
              headline)]
    axis = cost_axis(matrix)
    if axis is not None:
        png = pareto_chart(matrix, sweep.baseline)
        found.append((artifact_key(series, "pareto"),
                      pareto_markdown(sweep, matrix, png, axis[0]), headline))
    return found


def _tags(sweep: Sweep) -> list[str]:
    best = sweep.best()
    return ([f"best:{best.label}"] if best is not None else []) + (
        ["variant-failed"] if sweep.failed else [])


def finish(sweep: Sweep, run: SweepRun | None, html_report: bool) -> None:
    """The matrix's CSV and the report; the sweep's end handed to Prefect (always, said
    what went wrong: its flow run must end)."""
    artifacts: list[tuple[str, str, str]] = []
    message, tags = "", []
    try:
        sweep.matrix_path.write_bytes(sweep.matrix().to_csv(index=False).encode("utf-8"))
        message, tags = sweep.headline(), _tags(sweep)
        if html_report:
            write_sweep_report(sweep)
        if run is not None:
            artifacts = _artifacts(sweep)
    except Exception as exc:  # the variants' results stand; say what could not be made
        logger.warning("could not finish the sweep %s: %s: %s", sweep.name, type(exc).__name__, exc)
        message = message or f"the matrix could not be made: {type(exc).__name__}: {exc}"
    finally:
        if run is not None:
            run.end(artifacts, message, tags, not sweep.experiments)


def finish_afterwards(sweep: Sweep, run: SweepRun | None, html_report: bool) -> Afterwards:
    return Afterwards(f"the matrix and report of sweep {sweep.project}/{sweep.name}",
                      lambda: finish(sweep, run, html_report))
