"""The `plain` row of `whole_script.py`: the same 10 rows as `fixed_cost.py --whole`, a
plain loop with no framework (the floor: Python's start, the loop, the exit).

    python bench/whole_plain.py    # prints {"returned": t, "recorded": t}
"""

from __future__ import annotations

import json
import time

ROWS = 10


def upper(evaluated_model_input: str) -> str:
    return evaluated_model_input.upper()


def long_enough(evaluated_model_output: str) -> bool:
    return len(evaluated_model_output) > 2


def main() -> None:
    results = [long_enough(upper(f"q{i}")) for i in range(ROWS)]
    assert len(results) == ROWS
    returned = time.time()
    print(json.dumps({"returned": returned, "recorded": returned}), flush=True)


if __name__ == "__main__":
    main()
