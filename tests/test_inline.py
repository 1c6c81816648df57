"""Where sync steps run: threads for slow code, the event loop's thread for cheap code.

The decision from measured call times is tested on `InlinePolicy` with a clock the test
moves (a real clock under load can make any cheap call look slow); experiments check
that the runner follows the decision, with steps whose calls are slow beyond doubt or
whose ``inline`` is set.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from patronus_tasks import ConfigError, Evaluator, evaluator, run_experiment
from patronus_tasks.define.inline import FAST_SECONDS, PROBE_CALLS, SLOW_SECONDS, InlinePolicy


def _run(tmp_path: Path, *evaluators: Any, rows: int) -> Any:
    data = [{"evaluated_model_output": f"out {i}"} for i in range(rows)]
    return run_experiment("inline", data=data, evaluators=list(evaluators), max_concurrency=1,
                          backend="local", results_dir=tmp_path, print_summary=False)


def _threads_seen(calls: list[tuple[str, int]]) -> list[bool]:
    """For each call in order: did it run in the event loop's (main) thread?"""
    main = threading.main_thread().ident
    return [ident == main for _, ident in sorted(calls)]


def _recording(name: str, calls: list[tuple[str, int]], delay: float = 0.0, **options: Any) -> Any:
    @evaluator(name=name, **options)
    def check(evaluated_model_output: str) -> bool:
        if delay:
            time.sleep(delay)
        calls.append((f"{len(calls):05d}", threading.get_ident()))
        return True

    return check


class Clock:
    """Time as a test moves it: a call of `took` lasts exactly ``seconds``."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def took(self, seconds: float) -> bool:
        self.now += seconds
        return True


def _policy(inline: bool | None = None, has_timeout: bool = False) -> tuple[InlinePolicy, Clock]:
    clock = Clock()
    return InlinePolicy("step", inline, has_timeout, clock=clock), clock


def _calls(policy: InlinePolicy, clock: Clock, *seconds: float) -> list[bool]:
    """Whether the step ran inline before each of these calls (lasting ``seconds``)."""
    inline = []
    for s in seconds:
        inline.append(policy.inline)
        policy.call(clock.took, {"seconds": s})
    return inline


def test_a_cheap_step_moves_inline_after_its_probe_calls() -> None:
    policy, clock = _policy()
    fast = FAST_SECONDS / 2
    seen = _calls(policy, clock, *[fast] * (PROBE_CALLS + 5))
    assert seen == [False] * PROBE_CALLS + [True] * 5


def test_one_slow_probe_keeps_a_step_in_threads_for_good() -> None:
    policy, clock = _policy()
    fast = FAST_SECONDS / 2
    seen = _calls(policy, clock, *[fast] * 3, FAST_SECONDS * 1.5, *[fast] * (PROBE_CALLS * 2))
    assert not any(seen)


def test_a_slow_inline_call_sends_the_step_back_to_threads_for_good() -> None:
    policy, clock = _policy()
    fast = FAST_SECONDS / 2
    seen = _calls(policy, clock, *[fast] * PROBE_CALLS, fast, SLOW_SECONDS * 0.9, SLOW_SECONDS * 2,
                  *[fast] * PROBE_CALLS)
    assert seen[PROBE_CALLS:PROBE_CALLS + 3] == [True, True, True]  # a little slow is no cause
    assert not any(seen[PROBE_CALLS + 3:])


def test_set_or_timed_steps_are_not_measured_into_another_place() -> None:
    slow, fast = SLOW_SECONDS * 2, FAST_SECONDS / 2
    for inline, has_timeout, calls, expected in [(True, False, [slow] * 3, True),
                                                 (False, False, [fast] * (PROBE_CALLS + 3), False),
                                                 (None, True, [fast] * (PROBE_CALLS + 3), False)]:
        policy, clock = _policy(inline, has_timeout)
        assert set(_calls(policy, clock, *calls)) == {expected}, (inline, has_timeout)


def test_a_slow_sync_evaluator_stays_in_threads(tmp_path: Path) -> None:
    calls: list[tuple[str, int]] = []
    _run(tmp_path, _recording("slow", calls, delay=0.003), rows=PROBE_CALLS + 8)
    assert not any(_threads_seen(calls))


def test_inline_true_and_false_are_obeyed_from_the_first_call(tmp_path: Path) -> None:
    inline_calls: list[tuple[str, int]] = []
    thread_calls: list[tuple[str, int]] = []
    _run(tmp_path, _recording("always", inline_calls, inline=True),
         _recording("never", thread_calls, inline=False), rows=PROBE_CALLS + 4)
    assert all(_threads_seen(inline_calls))
    assert not any(_threads_seen(thread_calls))


def test_a_step_with_a_timeout_is_never_inline_and_inline_true_refuses_one(tmp_path: Path) -> None:
    calls: list[tuple[str, int]] = []
    _run(tmp_path, _recording("timed", calls, timeout_seconds=5), rows=PROBE_CALLS + 8)
    assert not any(_threads_seen(calls))
    with pytest.raises(ConfigError, match="inline=True cannot have a timeout_seconds"):
        _recording("both", [], inline=True, timeout_seconds=1)


def test_class_form_takes_the_option_and_errors_inline_are_recorded(tmp_path: Path) -> None:
    class Picky(Evaluator):
        inline = True

        def evaluate(self, evaluated_model_output: str) -> bool:
            if evaluated_model_output.endswith("3"):
                raise ValueError("no threes")
            return True

    df = _run(tmp_path, Picky(), rows=5).to_dataframe().sort_values("sid")
    assert df["status"].tolist() == ["ok", "ok", "ok", "error", "ok"]
    assert df["error_message"].iloc[3] == "no threes"


def test_the_collector_passes_less_often_while_rows_run_and_is_set_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    from patronus_tasks.run.garbage import ENV, YOUNG

    seen: list[int] = []

    @evaluator
    def threshold(evaluated_model_output: str) -> bool:
        seen.append(gc.get_threshold()[0])
        return True

    before = gc.get_threshold()
    try:
        gc.set_threshold(700, *before[1:])
        _run(tmp_path / "a", threshold, rows=3)
        assert seen == [YOUNG] * 3 and gc.get_threshold()[0] == 700
        gc.set_threshold(YOUNG * 2, *before[1:])  # the user's own, higher: kept
        _run(tmp_path / "b", threshold, rows=1)
        assert seen[-1] == YOUNG * 2 and gc.get_threshold()[0] == YOUNG * 2
        gc.set_threshold(700, *before[1:])
        monkeypatch.setenv(ENV, "default")  # Python's collector left as it is
        _run(tmp_path / "c", threshold, rows=1)
        assert seen[-1] == 700
    finally:
        gc.set_threshold(*before)


def test_a_long_run_is_followed_by_a_full_collection(monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    from patronus_tasks.run import garbage

    passes: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            passes.append(info["generation"])

    gc.callbacks.append(seen)
    try:
        with garbage.fewer_collections():  # a short run: no full pass after it
            pass
        assert 2 not in passes
        monkeypatch.setattr(garbage, "COLLECT_AFTER", 0.0)
        with garbage.fewer_collections():
            pass
        assert 2 in passes
    finally:
        gc.callbacks.remove(seen)
