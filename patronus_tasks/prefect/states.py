"""The final states the recorder gives an experiment's flow run, without Prefect's models:
what ``POST /flow_runs/<id>/set_state`` takes (`RunState.body`, as Prefect's client
sends a state) and what the logs say of it (as Prefect's `State` prints)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prefect.states import State


@dataclass(frozen=True)
class RunState:
    """A state: its type (``COMPLETED``...), its name and its message."""

    type: str
    name: str
    message: str | None = None

    def is_completed(self) -> bool:
        return self.type == "COMPLETED"

    def __str__(self) -> str:
        shown = [repr(self.message)] if self.message else []
        if self.type.lower() != self.name.lower():
            shown.append(f"type={self.type}")
        return f"{self.name}({', '.join(shown)})"

    def body(self, flow_run_id: str | None = None, task_run_id: str | None = None) -> dict[str, Any]:
        """The state as the API takes it (Prefect's `StateCreate`; the server stamps it)."""
        details = {"flow_run_id": flow_run_id, "task_run_id": task_run_id,
                   "transition_id": str(uuid.uuid4())}
        return {"type": self.type, "name": self.name, "message": self.message,
                "state_details": details, "data": None}

    def to_prefect(self) -> State[Any]:
        """The same state as Prefect's (a flow returns it)."""
        from prefect import states

        made = {"COMPLETED": states.Completed, "FAILED": states.Failed,
                "CANCELLED": states.Cancelled, "CRASHED": states.Crashed}[self.type]
        return made(message=self.message)


def completed(message: str) -> RunState:
    return RunState("COMPLETED", "Completed", message)


def failed(message: str) -> RunState:
    return RunState("FAILED", "Failed", message)


def cancelled(message: str) -> RunState:
    return RunState("CANCELLED", "Cancelled", message)


def crashed(message: str) -> RunState:
    return RunState("CRASHED", "Crashed", message)
