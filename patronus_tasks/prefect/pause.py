"""A flow run paused for a form a person answers in the Prefect UI (`review`), or, on a
deployment, suspended: its process ends and the worker is free until someone answers.

A pause here waits ``timeout`` seconds, then resumes the run itself with no answer: the
flow goes on (Prefect's own pause fails the run once its deadline passes: its pause
expiration service, then any transition out of it, refuse). So Prefect is told a later
deadline (`MARGIN` more) than the one kept here. A suspended run ends its process, so it
cannot resume itself: a run of the bundled `WAKE_DEPLOYMENT`, scheduled at the deadline,
resumes it if the page is still unanswered. Once resumed, it runs again from the start,
and the same pause (same key) then reads the answer given, or finds none, instead of
asking again (Prefect refuses a key that has fired).

The answer is validated by the form's model (Prefect's resume call checks it against the
form's schema first: a label off the scale is refused there).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
import pydantic

if TYPE_CHECKING:
    from uuid import UUID

    from prefect.client.orchestration import SyncPrefectClient

logger = logging.getLogger("patronus_tasks.review")

#: Seconds Prefect's deadline is given past the one kept here: the run resumes itself
#: first (Prefect checks for expired pauses every few seconds).
MARGIN = 120
#: The flow run input holding the experiment a suspended review asks about.
EXPERIMENT_KEY = "patronus-review-experiment"
#: Seconds between two looks at whether the run was resumed.
POLL_SECONDS = 2.0
#: The bundled deployment (prefect.yaml, flows/review_timeout.py) that goes on with a
#: suspended review nobody answered by its deadline.
WAKE_DEPLOYMENT = "review-timeout/review-timeout"


@dataclass(frozen=True)
class Asked:
    """What a pause gave: the answer (validated), or None and why there is none."""

    answer: dict[str, Any] | None
    why_none: str = ""


def current_flow_run() -> Any:
    """The flow run this code runs in (None: outside any)."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    return ctx.flow_run if ctx is not None else None


def can_suspend(flow_run: Any) -> bool:
    """A deployment's run that is no subflow: Prefect suspends only those."""
    return flow_run.deployment_id is not None and flow_run.parent_task_run_id is None


def form_model(fields: dict[str, Any], description: str) -> type[Any]:
    """The form as Prefect's ``RunInput``, its description shown above it."""
    from prefect.input import RunInput

    made: type[Any] = pydantic.create_model("Review", __base__=RunInput, **fields)
    made._description = description
    return made


def ask(fields: dict[str, Any], description: str, *, key: str, timeout: int) -> Asked:
    """Pause the current flow run for the form (suspend it, on a deployment) and wait for
    the answer: ``timeout`` seconds, then the run goes on with none."""
    flow_run = current_flow_run()
    model = form_model(fields, description)
    if can_suspend(flow_run):
        return _suspend(model, key, timeout)
    return _pause(flow_run.id, model, key, timeout, POLL_SECONDS)


def _suspend(model: type[Any], key: str, timeout: int) -> Asked:
    from prefect.client.orchestration import get_client
    from prefect.flow_runs import suspend_flow_run

    flow_run_id = current_flow_run().id
    with get_client(sync_client=True) as client:
        if key in (client.read_flow_run(flow_run_id).empirical_policy.pause_keys or ()):
            return _answered_before(client, flow_run_id, model, key, timeout)
        woken = _wake_at_deadline(client, flow_run_id, key, timeout)
    _say_waiting(timeout, "suspended (its process ends; a worker runs it again once answered)",
                 goes_on=woken)
    # Returns only when this pause fired before (the run resumed and running again); else
    # the process ends here, the run Suspended. Prefect's deadline comes after the wake's.
    answered = suspend_flow_run(wait_for_input=model, key=key,
                                timeout=timeout + MARGIN if woken else timeout)
    return Asked(answered.model_dump(mode="json"))


def _say_waiting(timeout: int, how: str, goes_on: bool) -> None:
    """In the run's Logs tab, where a reviewer looks: that the run waits for its form, where
    it is, and until when (the run page said only Prefect's "Suspending flow run")."""
    import datetime as dt

    until = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=timeout)).strftime("%H:%M:%S UTC")
    then = "it goes on without" if goes_on else "Prefect fails it"
    run_log(f"review: the run is {how}, waiting for its form until {until}: in the Prefect UI, "
            f"this run's Resume button opens it. Nobody answering by then, {then}.")


def run_log(line: str, level: int = logging.INFO) -> None:
    """A line in the current flow run's logs (its Logs tab), else this package's log."""
    try:
        from prefect.logging import get_run_logger

        run_logger: Any = get_run_logger()
    except Exception:  # outside a run: the package's logger
        run_logger = logger
    run_logger.log(level, line)


def _answered_before(client: SyncPrefectClient, flow_run_id: UUID, model: type[Any], key: str,
                     timeout: int) -> Asked:
    """A page this run asked before it was suspended: its answer, or none (resumed by
    `wake_unanswered` at the deadline)."""
    from prefect.input import keyset_from_paused_state
    from prefect.states import Suspended

    keyset: Any = keyset_from_paused_state(Suspended(pause_key=key))
    found = _answer(client, flow_run_id, model, keyset["response"])
    return found if found.answer is not None else Asked(None, f"nobody answered within {timeout} s")


def _wake_at_deadline(client: SyncPrefectClient, flow_run_id: UUID, key: str, timeout: int) -> bool:
    """A run of the bundled `WAKE_DEPLOYMENT` scheduled at the deadline, to resume the
    run if nobody answered; False (said) where that deployment is not deployed."""
    import datetime as dt

    from prefect.exceptions import ObjectNotFound
    from prefect.states import Scheduled

    try:
        wake = client.read_deployment_by_name(WAKE_DEPLOYMENT)
    except ObjectNotFound:
        logger.warning("review: deploy prefect.yaml's %s too: without it, a page nobody answers "
                       "within %d s fails this run (Prefect's pause deadline)", WAKE_DEPLOYMENT, timeout)
        return False
    at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=timeout)
    client.create_flow_run_from_deployment(
        wake.id, parameters={"flow_run_id": str(flow_run_id), "pause_key": key, "timeout": timeout},
        state=Scheduled(scheduled_time=at), tags=["patronus-tasks"],
        idempotency_key=f"review-timeout-{flow_run_id}-{key}")  # a retried post: still one
    return True


def wake_unanswered(flow_run_id: str, pause_key: str, timeout: int) -> str:
    """Resume the suspended run if it still waits on page ``pause_key`` (as Prefect's
    resume does, with no answer): it runs again and goes on; say what was done."""
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.states import Scheduled

    with get_client(sync_client=True) as client:
        state = client.read_flow_run(UUID(flow_run_id)).state
        if state is None or not state.is_paused() or state.state_details.pause_key != pause_key:
            return f"review page {pause_key} of {flow_run_id}: answered (or the run ended) in time"
        client.set_flow_run_state(UUID(flow_run_id), Scheduled(
            name="Resuming", message=f"review: nobody answered within {timeout} s; the flow goes on"))
    return f"review page {pause_key} of {flow_run_id}: nobody answered within {timeout} s, resumed"


def _pause(flow_run_id: UUID, model: type[Any], key: str, timeout: int, poll: float) -> Asked:
    from prefect.client.orchestration import get_client
    from prefect.input import keyset_from_paused_state
    from prefect.states import Paused

    state: Any = Paused(timeout_seconds=timeout + MARGIN, pause_key=key)
    keyset: Any = keyset_from_paused_state(state)
    state.state_details.run_input_keyset = keyset
    with get_client(sync_client=True) as client:
        result = client.set_flow_run_state(flow_run_id, state)
        if result.state is not None and result.state.is_running():  # fired before: answered
            return _answer(client, flow_run_id, model, keyset["response"])
        if result.state is None or not result.state.is_paused():
            return Asked(None, f"Prefect would not pause the run: {result.details}")
        model.save(keyset, flow_run_id=flow_run_id)
        _say_waiting(timeout, "paused", goes_on=True)
        if not _resumed(client, flow_run_id, timeout, poll):
            return _go_on(client, flow_run_id, model, keyset["response"], timeout)
        return _answer(client, flow_run_id, model, keyset["response"])


def _resumed(client: SyncPrefectClient, flow_run_id: UUID, timeout: float, poll: float) -> bool:
    """Whether the run was resumed within ``timeout`` (else it is still paused, or was
    cancelled meanwhile)."""
    deadline = time.monotonic() + timeout
    while True:
        state = client.read_flow_run(flow_run_id).state
        if state is not None and state.is_running():
            return True
        if state is None or not state.is_paused() or time.monotonic() >= deadline:
            return False
        time.sleep(min(poll, max(deadline - time.monotonic(), 0.01)))


def _go_on(client: SyncPrefectClient, flow_run_id: UUID, model: type[Any], key: str,
           timeout: int) -> Asked:
    """Nobody answered in time: the run resumed with no answer (one given meanwhile is
    read all the same)."""
    from prefect.states import Running

    state = client.read_flow_run(flow_run_id).state
    if state is not None and state.is_paused():
        client.set_flow_run_state(flow_run_id, Running(
            message=f"review: nobody answered within {timeout} s; the flow goes on"))
    found = _answer(client, flow_run_id, model, key)
    if found.answer is not None:
        return found
    cancelled = state is not None and not state.is_paused() and not state.is_running()
    return Asked(None, f"the run was {state.name if state else 'ended'} meanwhile" if cancelled
                 else f"nobody answered within {timeout} s")


def _answer(client: SyncPrefectClient, flow_run_id: UUID, model: type[Any], key: str) -> Asked:
    """The answer stored under ``key``, validated by the form's model."""
    try:
        value = client.read_flow_run_input(flow_run_id, key)
    except httpx.HTTPStatusError as exc:
        if exc.response.status_code == 404:
            return Asked(None, "the run was resumed with no answer")
        raise
    try:
        return Asked(model.model_validate(json.loads(value)).model_dump(mode="json"))
    except (ValueError, pydantic.ValidationError) as exc:
        return Asked(None, f"the answer does not fit the form: {exc}")


def remember_experiment(location: str) -> None:
    """Keep, on the current flow run, which experiment its review asks about (read again
    by `reviewed_experiment` when a suspended run runs again)."""
    from prefect.client.orchestration import get_client

    flow_run = current_flow_run()
    with get_client(sync_client=True) as client:
        if _read(client, flow_run.id, EXPERIMENT_KEY) is None:
            client.create_flow_run_input(flow_run.id, EXPERIMENT_KEY, json.dumps(location))


def remembered_experiment() -> str | None:
    """The experiment the current flow run's review asked about before it was suspended."""
    from prefect.client.orchestration import get_client

    flow_run = current_flow_run()
    if flow_run is None:
        return None
    with get_client(sync_client=True) as client:
        value = _read(client, flow_run.id, EXPERIMENT_KEY)
    return str(json.loads(value)) if value is not None else None


def _read(client: SyncPrefectClient, flow_run_id: UUID, key: str) -> str | None:
    try:
        return client.read_flow_run_input(flow_run_id, key)
    except httpx.HTTPStatusError as exc:
        if exc.response.status_code == 404:
            return None
        raise
