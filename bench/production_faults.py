"""The production stack's fault scenario at full size, run by hand: two experiment
processes x 1,000 rows (a task and two evaluators: 6,000 task runs) against
`patronus-tasks server up --production` (PostgreSQL, Valkey, 2 API processes, services
apart), one API process killed once the server holds 1/8 of the task runs, Redis killed
and started again once both experiments have returned and it holds half; then every row
and every task run is checked, each once. It is tests/test_stack.py's scenario (the
suite runs it with 200 rows), run here with PATRONUS_STACK_ROWS:

    .venv/bin/python bench/production_faults.py [ROWS]      # default 1000
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    rows = sys.argv[1] if len(sys.argv) > 1 else "1000"
    env = {**os.environ, "PATRONUS_STACK_ROWS": rows}
    test = "tests/test_stack.py::test_every_row_and_task_run_kept_through_an_api_process_and_redis_dying"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-n", "0", "-p",
                           "no:cacheprovider", "--durations=0", test], cwd=ROOT, env=env)
    sys.exit(done.returncode)


if __name__ == "__main__":
    main()
