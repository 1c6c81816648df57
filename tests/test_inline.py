"""Where sync steps run: threads for slow code, the event loop's thread for cheap code."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from patronus_tasks import ConfigError, Evaluator, evaluator, run_experiment
from patronus_tasks.define.inline import PROBE_CALLS, SLOW_SECONDS

ROWS = 3 * PROBE_CALLS


def _run(tmp_path: Path, *evaluators: Any, rows: int = ROWS) -> Any:
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


def test_a_cheap_sync_evaluator_moves_inline_after_its_probe_calls(tmp_path: Path) -> None:
    calls: list[tuple[str, int]] = []
    exp = _run(tmp_path, _recording("cheap", calls))
    inline = _threads_seen(calls)
    assert inline[:PROBE_CALLS] == [False] * PROBE_CALLS
    assert all(inline[PROBE_CALLS + 1:]), inline
    assert exp.summary().evaluators[0].passed == ROWS


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


def test_a_slow_inline_call_sends_the_step_back_to_threads(tmp_path: Path) -> None:
    calls: list[tuple[str, int]] = []
    slow_at = PROBE_CALLS + 4

    @evaluator
    def sometimes_slow(evaluated_model_output: str) -> bool:
        if len(calls) == slow_at:
            time.sleep(SLOW_SECONDS * 2)
        calls.append((f"{len(calls):05d}", threading.get_ident()))
        return True

    _run(tmp_path, sometimes_slow)
    inline = _threads_seen(calls)
    assert inline[slow_at] is True  # it ran inline, and was slow...
    assert not any(inline[slow_at + 2:])  # ...so later calls run in threads


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
