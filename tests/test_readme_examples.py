"""The README's first examples, as a reader copies them: "A first experiment" and then
"Ready evaluators" (which uses its task), run from the repository's root on its bundled
data, recording to a real Prefect server."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from .conftest import ROOT


def _first_python_block(section: str) -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    body = text.split(f"\n## {section}\n", 1)[1]
    found = re.search(r"```python\n(.*?)```", body, re.S)
    assert found, f"no python block under {section!r}"
    return found.group(1)


CHECK = """
import json
print("FIRST", json.dumps(df[["sid", "evaluator_name", "pass"]].to_dict("records")))
"""


def test_readme_first_examples_run_on_bundled_data(tmp_path: Path, prefect_server: str) -> None:
    script = tmp_path / "readme.py"
    script.write_text(_first_python_block("A first experiment") + CHECK
                      + _first_python_block("Ready evaluators"))
    env = {**os.environ, "PATRONUS_TASKS_RESULTS_DIR": str(tmp_path / "results")}
    out = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    first = json.loads(out.stdout.split("FIRST ", 1)[1].splitlines()[0])
    passed = {r["sid"] for r in first if r["pass"]}
    assert len(first) == 8 and passed == {"q01"}, first  # the stand-in model knows one answer
    # The ready evaluators' run: its summary names each, with its verdicts over 8 rows.
    for name in ("exact_match", "contains", "token_f1", "rouge1_overlap"):
        assert f"{name} [link 0]" in out.stdout, out.stdout[-3000:]
    runs = sorted(p.name for p in (tmp_path / "results").iterdir())
    assert runs == ["my-project", "qa"], runs


def test_readme_sweep_example_runs_on_bundled_data(tmp_path: Path, prefect_server: str) -> None:
    """"Sweeps: which variant wins": four variants of the stand-in model on Prefect; the
    headline the README quotes."""
    script = tmp_path / "sweep.py"
    script.write_text(_first_python_block("Sweeps: which variant wins"))
    env = {**os.environ, "PATRONUS_TASKS_RESULTS_DIR": str(tmp_path / "results")}
    out = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    said = ("best: model=large,prompt=terse (quality 87.5%), not better than the baseline "
            "model=small,prompt=terse beyond chance; Holm-adjusted p=0.5")
    assert said in out.stdout and said in (ROOT / "README.md").read_text().replace("\n  ", " ")
    assert (tmp_path / "results" / "my-project" / "qa-models.sweep" / "report.html").is_file()
    # The sweep's flow run got its matrix though the script ended at once (the artifacts
    # are made after the rows, in a thread the process waits for at its exit).
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    async def matrix() -> list[Any]:
        async with get_client() as client:
            return list(await client.read_artifacts(artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=["my-project-qa-models-matrix"]))))

    found = asyncio.run(matrix())
    assert found and "model=large,prompt=terse" in str(found[0].data)
