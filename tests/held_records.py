"""An experiment whose task-run records are held back (a slow Prefect server, played).

Run as a script by test_results_first.py: ``held_records.py RESULTS_DIR RELEASE_FILE
[LOSE_AFTER]``: see `hold`. Batches hold 20 events here, so there are several.
The script prints ``returned <flow run id>`` once ``run_experiment`` is back.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from patronus_tasks import evaluator, run_experiment
from patronus_tasks.integrations.prefect import recorder as _recorder

ROWS = 60


def hold(release: Path, lose_after: int | None = None) -> None:
    """Until ``release`` exists, posts of events are refused (as by a server that is down);
    with ``lose_after``, the first that many go through and later ones are taken and
    lost (as by a server that restarted before recording them)."""
    original = _recorder._Poster._send
    sent = [0]

    async def held(self: Any, batch: Any) -> bool:
        sent[0] += 1
        if release.exists() or (lose_after is not None and sent[0] <= lose_after):
            return await original(self, batch)
        if lose_after is not None:
            return True
        await asyncio.sleep(0.1)
        return False

    _recorder._BATCH_EVENTS = 20
    _recorder._Poster._send = held  # type: ignore[method-assign]


@evaluator
def short(evaluated_model_output: str) -> bool:
    return len(evaluated_model_output) < 3


@evaluator
def digits(evaluated_model_output: str) -> bool:
    return evaluated_model_output.isdigit()


def run(results_dir: Path, **options: Any) -> Any:
    return run_experiment("held", data=[{"evaluated_model_output": str(i)} for i in range(ROWS)],
                          evaluators=[short, digits], results_dir=results_dir,
                          experiment_name="held", print_summary=False, max_concurrency=4,
                          **options)


if __name__ == "__main__":
    hold(Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else None)
    exp = run(Path(sys.argv[1]))
    print("returned", exp.manifest["flow_run_id"], flush=True)
