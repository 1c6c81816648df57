"""How long a dataset over the column limit takes to be refused, from each source.

    .venv/bin/python bench/wide_dataset.py [COLUMNS]     # default: 1,000,000

One row of COLUMNS columns as a list of dicts, a DataFrame, a JSON Lines, a CSV and a
Parquet file (writing the Parquet file of 10^6 columns takes pyarrow ~80 s; it is not
timed), each given to `run_experiment`: the time until its `DatasetError`.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from patronus_tasks import DatasetError, evaluator, run_experiment


@evaluator
def anything(evaluated_model_output: str) -> bool:
    return True


def sources(folder: Path, columns: int) -> dict[str, Any]:
    row = {f"c{i}": i for i in range(columns)}
    (folder / "wide.jsonl").write_text(json.dumps(row) + "\n")
    (folder / "wide.csv").write_text(",".join(row) + "\n" + ",".join(map(str, row.values())) + "\n")
    pq.write_table(pa.table({k: [v] for k, v in row.items()}), folder / "wide.parquet")
    return {"list of dicts": [row], "DataFrame": pd.DataFrame([row]),
            "JSONL": str(folder / "wide.jsonl"), "CSV": str(folder / "wide.csv"),
            "Parquet": str(folder / "wide.parquet")}


def refused_in(data: Any, results: str) -> float:
    start = time.perf_counter()
    try:
        run_experiment("wide", data=data, evaluators=[anything], backend="local",
                       results_dir=results, print_summary=False, html_report=False)
    except DatasetError:
        return time.perf_counter() - start
    raise SystemExit("not refused")


def main() -> None:
    columns = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    with tempfile.TemporaryDirectory() as folder:
        made = time.perf_counter()
        given = sources(Path(folder), columns)
        print(f"{columns:,} columns; sources made in {time.perf_counter() - made:.1f} s")
        print("| source | refused in |\n|---|---|")
        for name, data in given.items():
            print(f"| {name} | {refused_in(data, folder + '/results'):.2f} s |")


if __name__ == "__main__":
    main()
