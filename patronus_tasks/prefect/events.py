"""Calls as Prefect task-run events: the format Prefect's task-run recorder reads.

Prefect 3 orchestrates task runs on the client: its task engine reports each state change
as a ``prefect.task-run.<State>`` event, and the server's task-run recorder builds the
task run from it (keyed by the task run's id; the newest ``occurred`` wins; the event's id
becomes the state's id). This module makes the same events for calls that did
not go through the engine. The format is Prefect's internal contract, checked against
its task engine by ``tests/test_recording.py``; the Prefect range in ``pyproject.toml`` is
what that test passed on.

A call is recorded by one event, its final state, carrying the task run's name, key,
start and end, run count, tags, upstream call (``wait_for``) and parent (``__parents__``).
A call still running after `RUNNING_AFTER` seconds gets a ``Running`` event first, so the
UI shows it running; fast calls (most) cost one event, which is what the server's CPU,
not the client's, makes worth saving.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import time
import uuid
from dataclasses import dataclass
from typing import Any

import orjson

#: Seconds a call runs before it is shown as Running.
RUNNING_AFTER = 1.0
FINAL_TYPES = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def namespace_of(run_key: str) -> uuid.UUID:
    """The namespace of one experiment run's task-run ids (``run_key``: its flow run's id,
    or the key its recorder process knows it by)."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"patronus-tasks:{run_key}")


def task_run_id(namespace: uuid.UUID, name: str) -> str:
    """A call's task-run id, from its experiment run and its name (``<step>-<sid>``,
    unique in the run): both processes, and the artifacts' links to it, know it.

    ``str(uuid.uuid5(namespace, name))``, made without the `uuid.UUID` (3.4 against
    1.3 us; every call of a row makes one)."""
    digest = bytearray(hashlib.sha1(namespace.bytes + name.encode()).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # the RFC 4122 variant
    h = digest.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


@dataclass(frozen=True, slots=True)
class Call:
    """One call of a step as a task run: what its events say."""

    task_run_id: str
    name: str  # ``<step>-<sid>``
    task_key: str  # ``<kind>-<step>``
    upstream: str | None  # the task run this one waited for
    start: dt.datetime
    retries: int
    retry_delay: float
    inputs: dict[str, str] | None = None  # shown on the Task Inputs tab (`display`)
    parent: str | None = None  # the task run it is nested in (a span's call); else the flow's
    key: str | None = None  # its dynamic key, unique in the flow run per task key; else name

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled for every call on its way to the recorder process: a slotted
        # dataclass's own state (`dataclasses.fields` per object) cost 3x this.
        return (Call, (self.task_run_id, self.name, self.task_key, self.upstream, self.start,
                       self.retries, self.retry_delay, self.inputs, self.parent, self.key))


@dataclass(frozen=True, slots=True)
class State:
    """A task run's state: Prefect's type (``COMPLETED``...) and name, and a message."""

    type: str
    name: str
    message: str | None = None
    #: Tags of this call's task run besides the flow run's (a verdict that did not pass:
    #: `display.NOT_PASSED_TAG`, which the UI's tag filters list on their own).
    tags: tuple[str, ...] = ()

    def __reduce__(self) -> tuple[Any, ...]:
        return (State, (self.type, self.name, self.message, self.tags))  # as `Call`'s

    @property
    def final(self) -> bool:
        return self.type in FINAL_TYPES


RUNNING = State("RUNNING", "Running")
#: The tag of a verdict that did not pass (see `display`).
NOT_PASSED_TAG = "verdict:not-passed"
#: What a verdict that did not pass shows before its name. Prefect's UI colours a task run
#: by its state's type only (a finding is of the completed type: green, with a tick, in
#: the lists and the graph); its name is what a client can set, and the graph writes it.
#: ASCII: the v1 UI's run graph draws names with a bitmap font of ASCII characters only
#: ("✗ " left a blank before the plain name on its green bar; screenshots of both UIs'
#: graphs in Chromium). Its id still derives from the plain name.
NOT_PASSED_MARK = "(x) "


def shown_name(name: str, state: State) -> str:
    """A call's task-run name as the UI lists it: marked when its verdict did not pass."""
    return NOT_PASSED_MARK + name if NOT_PASSED_TAG in state.tags else name


class EventFormat:
    """Builds the events of one flow run's calls (its id, tags and parent task run)."""

    def __init__(self, flow_run_id: str, tags: list[str],
                 parent_task_run_id: str | None = None) -> None:
        self.tags = sorted(tags)
        self.parent_task_run_id = parent_task_run_id
        self._related = [{"prefect.resource.id": f"prefect.flow-run.{flow_run_id}",
                          "prefect.resource.role": "flow-run"}]
        self._related += [{"prefect.resource.id": f"prefect.tag.{t}",
                           "prefect.resource.role": "tag"} for t in self.tags]

    def event(self, call: Call, state: State, run_count: int, when: dt.datetime,
              end: dt.datetime | None = None) -> dict[str, Any]:
        """The event of ``call`` entering ``state`` at ``when`` (``end``: a final state's)."""
        message = state.message[:10_000] if state.message else None
        return {
            "id": str(uuid.uuid4()), "occurred": when.isoformat(),
            "event": f"prefect.task-run.{state.name}",
            "resource": {
                "prefect.resource.id": f"prefect.task-run.{call.task_run_id}",
                "prefect.resource.name": shown_name(call.name, state),
                "prefect.orchestration": "client",
                "prefect.state-name": state.name, "prefect.state-type": state.type,
                "prefect.run-count": str(run_count),
                "prefect.state-message": message or "",
                "prefect.state-timestamp": when.isoformat(),
            },
            "related": self._related,
            "payload": {
                "intended": {"from": None, "to": state.type},
                "validated_state": {"type": state.type, "name": state.name, "message": message,
                                    "state_details": {}, "data": None},
                "task_run": self._task_run(call, run_count, end, state),
            },
        }

    def _task_run(self, call: Call, run_count: int, end: dt.datetime | None,
                  state: State) -> dict[str, Any]:
        tags = state.tags
        inputs: dict[str, Any] = {}
        if call.upstream:
            inputs["wait_for"] = [{"input_type": "task_run", "id": call.upstream}]
        parent = call.parent or self.parent_task_run_id
        if parent:
            inputs["__parents__"] = [{"input_type": "task_run", "id": parent}]
        for name, shown in (call.inputs or {}).items():
            inputs[name] = [{"input_type": "constant", "type": shown}]
        run: dict[str, Any] = {
            "name": shown_name(call.name, state), "task_key": call.task_key,
            "dynamic_key": call.key or call.name,
            "tags": [*self.tags, *tags] if tags else self.tags, "task_inputs": inputs, "run_count": run_count,
            "empirical_policy": {"retries": call.retries, "retry_delay": call.retry_delay},
            "start_time": call.start.isoformat(), "expected_start_time": call.start.isoformat(),
        }
        if end is not None:
            run.update(end_time=end.isoformat(), total_run_time=(end - call.start).total_seconds())
        return run


class EventBatch:
    """Events serialised into one JSON array body (without its brackets), and its mark.

    Copied into one buffer as they come: each ``orjson.dumps`` result keeps an 8 KB
    allocation whatever its length, so holding them one by one cost 8x their size. The
    mark is the batch's last event and its task run, and whether that event is a final
    state: once the server holds that state, it took the whole batch (`backlog`).
    """

    __slots__ = ("count", "data", "final", "finals", "keep_ids", "mark", "missing", "opened",
                 "overtaken_at", "posts", "queue")

    def __init__(self, queue: int = 0) -> None:
        self.queue = queue  # which queue of the recorder it waits in (rows first)
        self.opened = time.monotonic()  # when its first event came
        self.data, self.count = bytearray(), 0
        self.finals = 0  # final-state events: task runs this batch completes
        self.mark = ("", "")  # (event id, task run id) of the last event
        self.final = False  # whether the last event is a final state
        self.posts = 0  # times sent (more than once after a server restart)
        self.keep_ids = False  # sent again under the same ids (`backlog.still_needed`)
        self.overtaken_at = 0.0  # when a batch posted after it was first seen recorded
        self.missing = (0, 0)  # task runs and events of it the server lacked when last asked

    def add(self, event: dict[str, Any], final: bool) -> int:
        """Append one event; return the bytes it took."""
        before = len(self.data)
        if self.count:
            self.data += b","
        self.data += orjson.dumps(event)
        self.count += 1
        self.finals += final
        self.final = final
        self.mark = (event["id"], event["resource"]["prefect.resource.id"].removeprefix(
            "prefect.task-run."))
        return len(self.data) - before

    def body(self) -> bytes:
        return b"[" + self.data + b"]"

    def split(self) -> tuple[EventBatch, EventBatch]:
        """Two batches of half the events each, in order (a server that limits the rate
        may refuse a batch bigger than what it allows in its window, for ever)."""
        events = orjson.loads(self.body())
        halves = (EventBatch(self.queue), EventBatch(self.queue))
        for i, event in enumerate(events):
            halves[i >= len(events) // 2].add(
                event, event["resource"]["prefect.state-type"] in FINAL_TYPES)
        return halves

    def renew(self, events: list[dict[str, Any]], held: set[str]) -> bytes:
        """Give ``events`` (this batch's) new ids but for those in ``held``, and hold them
        in their place; return the body of the renewed ones, to send again.

        Why new ids: the server's broker drops an event whose id it took in the last five
        minutes (a cache of 1,000 ids), so an event sent again with its id to the server
        that lost it is dropped without a word; only a restarted server takes it again.
        """
        self.data, self.count, self.finals = bytearray(), 0, 0
        renewed = []
        for event in events:
            if event["id"] not in held:
                event = {**event, "id": str(uuid.uuid4())}
                renewed.append(event)
            self.add(event, event["resource"]["prefect.state-type"] in FINAL_TYPES)
        return orjson.dumps(renewed)
