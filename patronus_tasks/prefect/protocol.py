"""What an experiment's process and its recorder process say to each other.

To the recorder process (`recording`, `ToRecorder`): ``("open", Opening)`` once per
experiment, then ``("calls", [(key, CallItem), ...], {key: rows done})``, then
``("close", Closing)``; ``("stop",)`` when the experiment's process stops waiting for it.
Back (`recorder.main`, `FromRecorder`): ``("flow_run", key, (id, url, series))``,
``("progress", key, Progress)``, ``("verdict", key, note)`` (the `VerdictNote` pickled,
or the gates that failed when there is none: an empty list when there is no verdict)
and ``("done", key, Progress)``.

The post-run between them: the recorder asks the server what it needs and says
``("postrun", key, (Asked, parent flow run id, the UI's path))`` (a sweep's variant
learns its parent's there; the UI's path, read from Prefect's settings, would load
Prefect in the experiment's process); the experiment's process computes it and answers each change
to make as ``("write", key, Write)``, then ``("computed", key, Verdict)`` (or the error's
text). Pickled frames (`channel`): these types are the contract.
"""

from __future__ import annotations

import datetime as dt
import pickle
from dataclasses import InitVar, dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from patronus_tasks.prefect.states import RunState
from patronus_tasks.run.modes import RecordMode

if TYPE_CHECKING:
    from patronus_tasks.prefect.events import Call, State
    from patronus_tasks.record.location import Location
    from patronus_tasks.record.manifest import VerdictNote
    from patronus_tasks.results.verdict import Rule

#: A call's news: running (its run count), finished (its state, run count and end), or
#: a log record of it.
CallItem: TypeAlias = (tuple[Literal["running"], "Call", int]
                       | tuple[Literal["finished"], "Call", "State", int, dt.datetime]
                       | tuple[Literal["log"], dict[str, Any]])
#: What the rows' side queues for the writer thread: an experiment opened, a call's item
#: (by experiment key), an experiment closed, or stop.
Outgoing: TypeAlias = (tuple[Literal["o"], "Opening"] | tuple[Literal["i"], str, CallItem]
                       | tuple[Literal["c"], "Closing"] | tuple[Literal["stop"]]
                       | tuple[Literal["write"], str, "Write"]
                       | tuple[Literal["computed"], str, "Verdict | str"])
ToRecorder: TypeAlias = (tuple[Literal["open"], "Opening"]
                         | tuple[Literal["calls"], list[tuple[str, CallItem]], dict[str, int]]
                         | tuple[Literal["close"], "Closing"] | tuple[Literal["stop"]]
                         | tuple[Literal["write"], str, "Write"]
                         | tuple[Literal["computed"], str, "Verdict | str"])
#: The flow run made: its id, its URL in the UI, the series it is compared in.
FlowRunMade: TypeAlias = tuple[str, str | None, str]
FromRecorder: TypeAlias = (tuple[Literal["flow_run"], str, FlowRunMade]
                           | tuple[Literal["progress", "done"], str, "Progress"]
                           | tuple[Literal["verdict"], str, "bytes | list[str]"]
                           | tuple[Literal["postrun"], str, tuple["Asked", str | None, str]])

@dataclass(frozen=True)
class ParentRun:
    """The flow run an experiment runs inside (a user's ``@flow``, a deployment's)."""

    flow_run_id: str
    flow_name: str
    deployment_id: str | None = None
    #: Another opening of the same process (a sweep's), whose flow run the recorder process
    #: makes: ``flow_run_id`` is filled there, once it exists.
    key: str | None = None


@dataclass(frozen=True)
class Opening:
    """An experiment's flow run, to be created: what it shows and where its results are."""

    key: str
    project: str
    title: str  # ``<project>/<experiment>``
    flow_name: str
    run_name: str
    tags: tuple[str, ...]
    parameters: dict[str, Any]
    results: bytes  # the results' `Location`, pickled (`out_dir`)
    rows: int
    series: str | None = None  # given; else the parent's flow (and deployment) and project
    parent: ParentRun | None = None
    record: RecordMode = "all"
    persisting: bool | None = None  # whether the server stores events, if known here
    html_report: bool = True  # write report.html beside the results
    #: ``"sweep"``: a sweep's flow run, its variants' experiments its subflows; no calls of
    #: its own, its artifacts made by the sweep's process (`SweepEnd`).
    kind: Literal["experiment", "sweep"] = "experiment"
    baseline: str | None = None  # a run pinned to judge against (its results' link)

    @property
    def out_dir(self) -> Location:
        """Where the results are: loaded when the run is over (pyarrow: ~0.2 s of imports,
        which the recorder process spares its first task runs)."""
        return pickle.loads(self.results)


@dataclass(frozen=True)
class Closing:
    """How an experiment's rows ended, and what its final state must weigh."""

    key: str
    status: Literal["completed", "interrupted"]
    gate_failures: tuple[str, ...] = ()  # the gates checked here (errors, pass rates)
    fail_on_regression: bool = False
    calls: int = 0  # calls made, recorded or not
    why: str | None = None  # what interrupted it
    #: When it is worse than the previous run, and what that fails (`given_rule`).
    rule: InitVar[Rule | None] = None
    sweep: SweepEnd | None = None  # a sweep's end: what its flow run shows
    #: The rule, pickled: the recorder process reads a closing without loading the
    #: results' modules (~0.5 s of pandas), which only computing the post-run needs.
    rule_pickled: bytes | None = field(default=None, init=False)

    def __post_init__(self, rule: Rule | None) -> None:
        if rule is not None:
            object.__setattr__(self, "rule_pickled", pickle.dumps(rule))

    def given_rule(self) -> Rule | None:
        return pickle.loads(self.rule_pickled) if self.rule_pickled is not None else None


#: Where a sweep's Markdown links into the Prefect UI: the recorder process, which has
#: Prefect's settings loaded, puts the UI's path there (`ui.links.ui_prefix`); the sweep's
#: process makes the Markdown after its rows, when importing Prefect could be too late
#: (at the interpreter's exit it fails).
UI_PREFIX = "{{prefect-ui}}"


@dataclass(frozen=True)
class SweepEnd:
    """What a sweep's flow run ends with: its artifacts (key, markdown, description), its
    state's message, tags, whether it failed; ``children``: its variants' openings, whose
    flow runs end before it."""

    artifacts: tuple[tuple[str, str, str], ...] = ()
    message: str = ""
    tags: tuple[str, ...] = ()
    failed: bool = False
    children: tuple[str, ...] = ()


@dataclass
class Progress:
    """How far Prefect is with an experiment's task runs."""

    expected: int = 0  # calls sent to be recorded
    recorded: int = 0
    lost: int = 0
    logs_dropped: int = 0
    ended: bool = False  # nothing more will be recorded
    notes: list[str] = field(default_factory=list)  # what the user should know (rate limits)


# -- the post-run (`ui.postrun`): asked by the recorder, computed by the experiment's
# process, applied by the recorder -------------------------------------------------

@dataclass(frozen=True)
class PreviousRun:
    """Where the series' previous run keeps its results, and its flow run."""

    location: str
    flow_run_id: str | None


@dataclass(frozen=True)
class Found(PreviousRun):
    """A series' baseline (`ui.asking.find`): where its results are, its flow run, how it became
    the baseline (``accepted``, ``first run``, ``pinned``), its name if known."""

    how: str = "first run"
    name: str | None = None
    recorded: bool = True  # kept as the series' baseline (a series from before: not yet)


@dataclass(frozen=True)
class Asked:
    """The server's answers the post-run needs, asked before this run is published."""

    previous: PreviousRun | None = None
    found: Found | None = None
    earlier: list[dict[str, Any]] = field(default_factory=list)  # the history, as left


@dataclass(frozen=True)
class Write:
    """One change: an artifact of a flow run (``kind``, ``data``, ``key``,
    ``description``), tags put first among a flow run's (``data``: the tags), or log
    lines (``data``: Prefect's log dicts, each naming its flow run)."""

    what: Literal["artifact", "tags", "logs"]
    flow_run_id: str | None = None
    data: Any = None
    kind: str = "markdown"
    key: str | None = None
    description: str | None = None


@dataclass
class Verdict:
    """What the experiment's flow run ends with: its state, the lines it logs, the gates
    that failed (those checked here, ``fail_on_regression``, included) and the verdict
    against the previous run (`results.verdict`, pickled: the recorder process passes it
    on to the experiment's process without loading it)."""

    state: RunState
    lines: list[tuple[int, str]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    note: bytes | None = None

    @classmethod
    def of(cls, state: RunState, lines: list[tuple[int, str]], failures: list[str],
           note: VerdictNote) -> Verdict:
        return cls(state, lines, failures, pickle.dumps(note))

    def verdict_note(self) -> VerdictNote | None:
        return pickle.loads(self.note) if self.note is not None else None
