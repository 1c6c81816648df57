"""Trajectory evaluators: how an agent reached its answer, read from the task's spans.

Each reads the task's `Trace` (its ``tool`` spans are the trajectory: name, arguments,
output, error, in call order; a task that records none but returns a ``trajectory`` in its
metadata, as `AgentTask` does, is read from there). Expected trajectories are a dataset
column (a list of ``{"name", "arguments"}``, or that list as JSON text) or given inline.
The matching modes are LangChain agentevals' trajectory match: ``strict`` (the same calls
in the same order), ``unordered`` (the same calls, any order), ``subset`` (no call beyond
the expected ones), ``superset`` (at least the expected ones).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from patronus_tasks.agents.tools import Tool, ToolError, tools_of
from patronus_tasks.define.row import Row, clean
from patronus_tasks.define.step_results import EvaluationResult, TaskResult
from patronus_tasks.evaluators.base import Check, check_choice, verdict
from patronus_tasks.evaluators.forms import PassFail
from patronus_tasks.evaluators.judge import Judge, split_options
from patronus_tasks.exceptions import ConfigError, DatasetError
from patronus_tasks.trace.tree import ToolCall, Trace

MODES = ("strict", "unordered", "subset", "superset")
ArgsMatch = str | Callable[[Any, Any], bool]


def trajectory(trace: Trace | None, task_result: TaskResult | None = None) -> list[ToolCall]:
    """The task's tool calls: its tool spans, else its result's ``trajectory`` metadata."""
    calls = trace.tool_calls() if trace is not None else []
    if calls or task_result is None or not isinstance(task_result.metadata, dict):
        return calls
    kept = task_result.metadata.get("trajectory") or []
    return [ToolCall(str(c.get("name")), c.get("arguments"), c.get("output"), c.get("error"))
            for c in kept if isinstance(c, dict)]


def expected_calls(expected: str | Sequence[Any], row: Row | None, owner: str) -> list[ToolCall]:
    """The expected tool calls: inline, or from the row's ``expected`` column."""
    value: Any = expected
    if isinstance(expected, str):
        value = clean(row.get(expected)) if row is not None else None
        if value is None:
            raise DatasetError(f"row sid={row.sid if row is not None else '?'}: {owner} reads the "
                               f"expected tool calls from column {expected!r}, which is empty or "
                               "missing. Fill it with a list of {\"name\", \"arguments\"} objects.")
        if isinstance(value, str):
            value = json.loads(value)
    if hasattr(value, "tolist"):  # from Parquet: a struct per call, every key of any call
        return [ToolCall(str(c["name"]), _unpadded(c.get("arguments"))) for c in value.tolist()]
    return [ToolCall(str(c["name"]), c.get("arguments")) if isinstance(c, dict) else ToolCall(str(c))
            for c in value]


def _unpadded(arguments: Any) -> Any:
    """Arguments read from Parquet without the keys other calls had (null here)."""
    if not isinstance(arguments, dict):
        return arguments
    return {k: _unpadded(v) for k, v in arguments.items() if v is not None}


def _shown(calls: Sequence[ToolCall]) -> str:
    return ", ".join(f"{c.name}({json.dumps(c.arguments, default=str)})" for c in calls) or "none"


class ToolCallsMatch(Check):
    factory: ClassVar[str] = "tool_calls_match"

    def same(self, got: ToolCall, want: ToolCall) -> bool:
        if got.name != want.name:
            return False
        args = self.options["args"]
        if args == "ignore":
            return True
        if callable(args):
            return bool(args(got.arguments, want.arguments))
        if args == "subset":  # the arguments the expected call names, equal; others free
            made = got.arguments if isinstance(got.arguments, dict) else {}
            return all(made.get(k) == v for k, v in (want.arguments or {}).items())
        return bool(got.arguments == want.arguments)

    def _unmatched(self, got: list[ToolCall], want: list[ToolCall]) -> tuple[list[ToolCall], list[ToolCall]]:
        left = list(got)
        missing = []
        for w in want:
            hit = next((i for i, g in enumerate(left) if self.same(g, w)), None)
            if hit is None:
                missing.append(w)
            else:
                left.pop(hit)
        return missing, left  # expected calls not made, calls made beyond them

    def evaluate(self, trace: Trace | None = None, task_result: TaskResult | None = None,
                 row: Row | None = None) -> EvaluationResult:
        got = trajectory(trace, task_result)
        want = expected_calls(self.options["expected"], row, self.factory)
        mode = self.options["mode"]
        missing, extra = self._unmatched(got, want)
        if mode == "strict":
            ok = len(got) == len(want) and all(self.same(g, w) for g, w in zip(got, want, strict=True))
        else:
            ok = {"unordered": not missing and not extra, "subset": not extra,
                  "superset": not missing}[mode]
        why = (f"{mode}: made {_shown(got)}; expected {_shown(want)}"
               + (f"; missing {_shown(missing)}" if missing else "")
               + (f"; beyond {_shown(extra)}" if extra else ""))
        return verdict(ok, why, calls=len(got), expected=len(want))


def tool_calls_match(expected: str | Sequence[Any] = "expected_tool_calls", *, mode: str = "strict",
                     args: ArgsMatch = "exact", **step: Any) -> ToolCallsMatch:
    """Did the task make the expected tool calls? ``expected``: a dataset column's name or a
    list of ``{"name", "arguments"}``; ``mode``: ``strict`` | ``unordered`` | ``subset`` |
    ``superset``; ``args``: ``exact`` (equal arguments), ``subset`` (the arguments an expected
    call names are equal; others may be anything), ``ignore`` (names only) or a function
    ``(made, expected) -> bool``. Pass or fail (score 1 or 0), the difference explained."""
    check_choice("tool_calls_match", "mode", mode, MODES)
    if not callable(args):
        check_choice("tool_calls_match", "args", args, ("exact", "subset", "ignore"))
    if not isinstance(expected, str | list | tuple):
        raise ConfigError("tool_calls_match: expected must be a column name or a list of "
                          "{'name', 'arguments'} objects.")
    return ToolCallsMatch({"expected": expected, "mode": mode, "args": args},
                          f"tool calls match ({mode})", step)


class ToolArgsValid(Check):
    factory: ClassVar[str] = "tool_args_valid"

    def problem(self, call: ToolCall, tools: dict[str, Tool]) -> str | None:
        if not tools:  # judged from what the agent met when it checked them
            bad = call.error or ""
            return bad if bad.startswith("ToolError:") else None
        tool = tools.get(call.name)
        if tool is None:
            return f"no tool named {call.name!r}"
        try:
            tool.check(call.arguments)
        except ToolError as exc:
            return str(exc)
        return None

    def evaluate(self, trace: Trace | None = None,
                 task_result: TaskResult | None = None) -> EvaluationResult:
        calls = trajectory(trace, task_result)
        problems = [p for c in calls if (p := self.problem(c, self.options["tools"])) is not None]
        if not calls:
            return verdict(True, "no tool calls to check", calls=0)
        score = 1 - len(problems) / len(calls)
        return verdict(not problems, "; ".join(problems) or f"all {len(calls)} calls valid",
                       score=score, calls=len(calls), invalid=len(problems))

    def cache_identity(self) -> dict[str, Any]:
        return {"check": self.factory, "tools": [t.schema() for t in self.options["tools"].values()]}


def tool_args_valid(tools: Sequence[Callable[..., Any] | Tool] | None = None, **step: Any) -> ToolArgsValid:
    """Does every tool call's arguments fit its tool's schema (``tools``: the functions, or
    `Tool`s)? Without ``tools``, the calls `AgentTask` found malformed or unknown. Score: the
    share of valid calls; passes when all are."""
    return ToolArgsValid({"tools": tools_of(tools)}, "tool arguments fit their schemas", step)


class Budget(Check):
    factory: ClassVar[str] = "budget"

    def measures(self, trace: Trace, task_result: TaskResult | None) -> dict[str, float | None]:
        usage = task_result.usage if task_result is not None else None
        tokens = trace.input_tokens + trace.output_tokens
        if not tokens and usage is not None:
            tokens = (usage.input_tokens or 0) + (usage.output_tokens or 0)
        return {"max_steps": float(len(trace.llm_calls())), "max_tokens": float(tokens),
                "max_cost": trace.cost, "max_seconds": trace.duration}

    def evaluate(self, trace: Trace | None = None,
                 task_result: TaskResult | None = None) -> EvaluationResult:
        measured = self.measures(trace or Trace(None), task_result)
        over, said = [], []
        for limit_name, limit in self.options.items():
            if limit is None:
                continue
            value = measured[limit_name]
            if value is None:
                raise ValueError(f"budget: {limit_name} is set but the task's "
                                 f"{limit_name.removeprefix('max_')} is unknown (a model whose "
                                 "price is not in the price table: give prices=, or drop it)")
            said.append(f"{limit_name.removeprefix('max_')} {value:g} of {limit:g}")
            if value > limit:
                over.append(limit_name)
        return verdict(not over, ("over " + ", ".join(over) + ": " if over else "") + "; ".join(said),
                       **{k.removeprefix("max_"): v for k, v in measured.items()})


def budget(*, max_steps: int | None = None, max_tokens: int | None = None,
           max_cost: float | None = None, max_seconds: float | None = None, **step: Any) -> Budget:
    """Did the task stay within its budget: model calls (``max_steps``), input and output
    tokens (``max_tokens``), cost in USD (``max_cost``), wall time (``max_seconds``)? A limit
    set on a measure that is unknown (an unpriced model's cost) is the row's error, never a
    pass."""
    limits = {"max_steps": max_steps, "max_tokens": max_tokens, "max_cost": max_cost,
              "max_seconds": max_seconds}
    if all(v is None for v in limits.values()):
        raise ConfigError("budget: set at least one of max_steps, max_tokens, max_cost, max_seconds.")
    for k, v in limits.items():
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or v < 0):
            raise ConfigError(f"budget: {k} must be a number >= 0, not {v!r}.")
    return Budget(limits, "within budget", step)


class SpanMatches(Check):
    factory: ClassVar[str] = "span_matches"

    def evaluate(self, trace: Trace | None = None) -> EvaluationResult:
        o = self.options
        found = (trace or Trace(None)).find(o["span_name"], o["kind"], o["attributes"])
        if o["failed"] is not None:
            found = [s for s in found if (s.error is not None) == o["failed"]]
        wanted = "at least one" if o["present"] else "none"
        what = ", ".join(f"{k}={v!r}" for k, v in o.items() if v is not None and k != "present")
        return verdict(bool(found) == o["present"], f"{len(found)} span(s) with {what}; wanted "
                       f"{wanted}", matches=len(found))


def span_matches(span_name: str | None = None, *, kind: str | None = None,
                 attributes: dict[str, Any] | None = None, failed: bool | None = None,
                 present: bool = True, **step: Any) -> SpanMatches:
    """Is there a span named ``span_name``, of ``kind``, with ``attributes`` (and, with
    ``failed``, that raised or not)? ``present=False``: is there none? (pydantic-evals'
    HasMatchingSpan.) ``name=`` names the evaluator, as for every other one (two of them in
    one experiment need two names)."""
    if span_name is None and kind is None and not attributes and failed is None:
        raise ConfigError("span_matches: give span_name, kind, attributes or failed to match "
                          "spans by (name= names the evaluator).")
    return SpanMatches({"span_name": span_name, "kind": kind, "attributes": attributes,
                        "failed": failed, "present": present},
                       "span present" if present else "span absent", step)


class NoLoops(Check):
    factory: ClassVar[str] = "no_loops"

    def evaluate(self, trace: Trace | None = None,
                 task_result: TaskResult | None = None) -> EvaluationResult:
        calls = trajectory(trace, task_result)
        counts = Counter((c.name, json.dumps(c.arguments, sort_keys=True, default=str)) for c in calls)
        loops = {k: n for k, n in counts.items() if n > self.options["max_repeats"]}
        if not loops:
            return verdict(True, f"no tool call made more than {self.options['max_repeats']} times")
        said = "; ".join(f"{name}({args}) {n} times" for (name, args), n in loops.items())
        return verdict(False, f"repeated: {said}", repeated=sum(loops.values()))


def no_loops(*, max_repeats: int = 2, **step: Any) -> NoLoops:
    """Did the task avoid calling one tool with the same arguments over and over (more than
    ``max_repeats`` times)?"""
    if isinstance(max_repeats, bool) or not isinstance(max_repeats, int) or max_repeats < 1:
        raise ConfigError(f"no_loops: max_repeats must be an integer >= 1, not {max_repeats!r}.")
    return NoLoops({"max_repeats": max_repeats}, "no repeated tool calls", step)


TRAJECTORY_PROMPT = """Judge how an AI agent worked on a task, by these criteria:
{criteria}

Answer on this scale: {scale}

The task (user input):
{input}

The agent's trajectory (its tool calls in order, with their arguments and results):
{trajectory}

A reference trajectory (how it may be done; other good ways exist):
{reference}

The agent's final answer:
{output}"""
DEFAULT_TRAJECTORY_CRITERIA = ("The agent took sensible steps toward the user's goal: each tool "
                               "call was needed and well-formed, it used the results correctly, "
                               "did not loop, and its final answer follows from what it found.")


def _trajectory_text(calls: Sequence[ToolCall], outputs: bool = True) -> str:
    """The calls, one a line; with ``outputs``, what each returned (a reference's expected
    calls have none: "-> null" told the judge every tool returned null)."""
    lines = [f"{i}. {c.name}({json.dumps(c.arguments, default=str)})"
             + ((" -> " + (f"ERROR {c.error}" if c.error else json.dumps(c.output, default=str)[:500]))
                if outputs else "")
             for i, c in enumerate(calls, 1)]
    return "\n".join(lines) or "(no tool calls)"


class TrajectoryJudge(Judge):
    factory = "trajectory_judge"
    default_prompt = TRAJECTORY_PROMPT

    async def evaluate(self, trace: Trace | None = None, task_result: TaskResult | None = None,
                       row: Row | None = None, evaluated_model_input: Any = None,
                       evaluated_model_output: str | None = None) -> EvaluationResult:
        column = self.reference_column
        reference = "(none given)"
        if column is not None and row is not None and clean(row.get(column)) is not None:
            reference = _trajectory_text(expected_calls(column, row, self.factory), outputs=False)
        return await self.judge({"input": evaluated_model_input, "output": evaluated_model_output,
                                 "trajectory": _trajectory_text(trajectory(trace, task_result)),
                                 "reference": reference})

    reference_column: str | None = None


def trajectory_judge(criteria: str = DEFAULT_TRAJECTORY_CRITERIA, *,
                     reference: str | None = "expected_tool_calls", threshold: float = 0.5,
                     **options: Any) -> TrajectoryJudge:
    """An LLM judge reading the whole trajectory (each tool call, its arguments and result),
    the input and the final answer, with the row's ``reference`` trajectory column when it
    has one. Judge options as `llm_judge`'s; a judge that gives no verdict is the row's
    `JudgeError`, never a pass."""
    own, step = split_options(options)
    made = TrajectoryJudge(form=PassFail(), criteria=criteria.strip(), threshold=threshold,
                           opts=own, step=step)
    made.reference_column = reference
    return made
