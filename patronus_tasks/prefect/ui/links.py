"""Links into the Prefect UI, for the markdown of artifacts (the UI renders them as links).

Links are paths from the server's root (``/runs/flow-run/<id>``), with the UI's own
path in front when it has one (Prefect Cloud's account and workspace): they then open on
whatever host name the browser reached the UI by. A task run's page needs its id, which
follows from its experiment run and its name (`events.task_run_id`); the list of an
experiment's findings or errors needs only its tags (``verdict:not-passed``,
``experiment:<name>``) and when it ran, which the UI's runs page takes in its address.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from urllib.parse import urlencode

from patronus_tasks.define.names import run_tag
from patronus_tasks.prefect.clients import ui_path
from patronus_tasks.prefect.ui.display import NOT_PASSED_TAG
from patronus_tasks.results.experiment import Experiment
from patronus_tasks.run.invocation import call_name

#: The UI's path, when given by the process that knows it: the recorder process's, to the
#: experiment's process computing a post-run, where reading Prefect's settings would
#: import Prefect (1.5 s of a 10-row script's end, measured).
_GIVEN: ContextVar[str | None] = ContextVar("patronus_tasks_ui_prefix", default=None)


def ui_prefix() -> str:
    """The UI's path on its host: empty for a self-hosted server, Prefect Cloud's account
    and workspace otherwise (`clients.ui_path`, unless `prefix_given`)."""
    given = _GIVEN.get()
    return given if given is not None else ui_path()


@contextmanager
def prefix_given(prefix: str) -> Iterator[None]:
    """`ui_prefix` is ``prefix`` meanwhile (in this thread's context)."""
    token = _GIVEN.set(prefix)
    try:
        yield
    finally:
        _GIVEN.reset(token)


def flow_run(flow_run_id: str) -> str:
    return f"{ui_prefix()}/runs/flow-run/{flow_run_id}"


def task_run(task_run_id: str) -> str:
    return f"{ui_prefix()}/runs/task-run/{task_run_id}"


def _window(experiment: Experiment) -> list[tuple[str, str]]:
    """The runs page's date range around the experiment (its default is the past week)."""
    m = experiment.manifest
    try:
        start = dt.datetime.fromisoformat(m.started_at) - dt.timedelta(minutes=1)
        end = dt.datetime.fromisoformat(m.ended_at or m.started_at)
    except ValueError:
        return []
    end += dt.timedelta(hours=1)
    iso = "%Y-%m-%dT%H:%M:%S.000Z"
    return [("type", "range"), ("startDate", start.astimezone(dt.UTC).strftime(iso)),
            ("endDate", end.astimezone(dt.UTC).strftime(iso))]


def task_runs(experiment: Experiment, tags: Iterable[str] = (),
              states: Iterable[str] = ()) -> str:
    """The UI's list of the experiment's task runs with all of ``tags`` and one of
    ``states`` (state names)."""
    run = run_tag(experiment.location.name, experiment.name)
    query = [("tab", "task-runs"), *(("tag", t) for t in tags),
             ("tag", f"experiment:{experiment.name}"), *([("tag", run)] if run else []),
             *(("state", s) for s in states), *_window(experiment)]
    return f"{ui_prefix()}/runs?{urlencode(query)}"


def findings(experiment: Experiment) -> str:
    """The list of the experiment's verdicts that did not pass."""
    return task_runs(experiment, tags=[NOT_PASSED_TAG])


def errors(experiment: Experiment) -> str:
    """The list of the experiment's calls that failed (errors, timeouts)."""
    return task_runs(experiment, states=["Failed", "TimedOut"])


def run_name(step: str, sid: str, link_index: int, repeat: int | None = None) -> str:
    """A call's task-run name (`Invocation.run_name`, `runner.call_name`): ``<step>-<sid>``,
    later links ``-link<N>``, repeats ``-r<k>``."""
    return call_name(step, sid, link_index, repeat)
