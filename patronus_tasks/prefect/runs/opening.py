"""What an experiment's flow run is: its name, tags, parameters, parent and series.

The same on both paths: the flow run the recorder process creates through the API, and
the one Prefect's engine runs for rows on a task runner.
"""

from __future__ import annotations

import datetime as dt
import pickle
import sys
import uuid
from typing import Any

from patronus_tasks.prefect.protocol import Opening, ParentRun
from patronus_tasks.prefect.server import hook as server_hook
from patronus_tasks.run.spec import ExperimentSpec

_BANNED_IN_NAMES = str.maketrans({c: "_" for c in "/%&<>"})


def flow_name(project: str) -> str:
    """The flow a project's runs are under (a name without the characters Prefect bans)."""
    return project.translate(_BANNED_IN_NAMES)


def flow_parameters(spec: ExperimentSpec) -> dict[str, Any]:
    """What the experiment's flow run shows as its parameters: what ran, on what data."""
    tasks = [lk.task.name for lk in spec.links if lk.task]
    return {
        "project": spec.project_name, "experiment_name": spec.experiment_name,
        "dataset": spec.dataset.source or "(in memory)",
        "dataset_sha256": spec.dataset.content_hash(), "rows": len(spec.dataset),
        "tags": spec.tags, "task": ", ".join(tasks) or None,
        "evaluators": [e.name for lk in spec.links for e in lk.evaluators],
        "max_concurrency": spec.max_concurrency, "series": spec.series,
        "fail_on_regression": spec.fail_on_regression,
        **({"variant": spec.variant.shown} if spec.variant is not None else {}),
    }


def parent_run() -> ParentRun | None:
    """The flow run this code runs in (a user's ``@flow``, a deployment's), if any.

    Only a process that loaded Prefect can be in one: others never import it here."""
    if "prefect.context" not in sys.modules:
        return None
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    if ctx is None or ctx.flow_run is None:
        return None
    deployment = ctx.flow_run.deployment_id
    return ParentRun(str(ctx.flow_run.id), ctx.flow.name if ctx.flow else ctx.flow_run.name,
                     str(deployment) if deployment else None)


def _tags(spec: ExperimentSpec) -> tuple[str, ...]:
    """The experiment's tags, and those of a ``prefect.tags`` block it runs in."""
    return with_context_tags(spec.prefect_tags)


def with_context_tags(own: list[str]) -> tuple[str, ...]:
    """``own`` tags, and those of a ``prefect.tags`` block the code runs in."""
    tags = list(own)
    if "prefect.context" in sys.modules:
        from prefect.context import TagsContext

        tags += sorted(TagsContext.get().current_tags)
    return tuple(dict.fromkeys(tags))


def opening(spec: ExperimentSpec, parent: ParentRun | None) -> Opening:
    """The experiment's flow run, to be created (or run by Prefect's engine)."""
    started = dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    return Opening(
        key=uuid.uuid4().hex, project=spec.project_name,  # this run's: a resume is another
        title=f"{spec.project_name}/{spec.experiment_name}",
        flow_name=flow_name(spec.project_name),
        run_name=f"{spec.experiment_name} @ {started}", tags=_tags(spec),
        parameters=flow_parameters(spec), results=pickle.dumps(spec.out_dir), rows=spec.runs,
        series=spec.series, parent=parent, record=spec.record, persisting=_persisting(),
        html_report=spec.html_report, baseline=spec.baseline)


def _persisting() -> bool | None:
    """Whether the server stores events: known when it is this process's built-in one."""
    server = server_hook.built_in()
    return None if server is None else bool(server.persisting)
