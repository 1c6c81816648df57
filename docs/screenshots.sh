#!/usr/bin/env bash
# Take the README's Prefect UI screenshots again: a `server up` stack on port 4310 (its
# state in a scratch folder), three runs of the nightly deployment (the second and third on
# a copy of the dataset with three wrong queries: 66.7% -> 33.3%, the third still Regressed
# against the first, the series' baseline, since the second), then headless Chromium (Debian:
# apt install chromium) on what a nightly user opens first (the deployment, the runs list,
# the deployment's own run) and then the experiment's flow run, a task run that did not
# pass, the summary, history, comparison and charts artifacts, the list of the verdicts
# that did not pass, and the HTML report with a row opened. OUT=folder to write elsewhere.
# Run from the repository's root: docs/screenshots.sh
set -euo pipefail
PY="${PYTHON:-.venv/bin/python}"
SCRATCH="$(mktemp -d)"
export PREFECT_HOME="$SCRATCH/prefect"
"$PY" -m patronus_tasks server up --home "$SCRATCH/stack" --port 4310
trap '"$PY" -m patronus_tasks server down --home "$SCRATCH/stack"' EXIT
eval "$("$PY" -m patronus_tasks server env --home "$SCRATCH/stack")"  # its URL and auth string

"$PY" - "$SCRATCH" <<'EOF'
import asyncio, json, re, sys
from pathlib import Path
from prefect.client.orchestration import get_client
from prefect.deployments import run_deployment

scratch = Path(sys.argv[1])
rows = [json.loads(line) for line in open("datasets/text_to_sql.jsonl")]
for row in rows:  # q01, q04, q05 answered wrongly
    if row["sid"] in ("q01", "q04", "q05"):
        row["query"] = row["query"].replace("SUM(o.quantity", "MAX(o.quantity").replace(
            "COUNT(*)", "COUNT(*) + 1")
worse = scratch / "worse.jsonl"
worse.write_text("".join(json.dumps(r) + "\n" for r in rows))
name = "text-to-sql-eval/text-to-sql-nightly"
run_deployment(name, timeout=300)
run_deployment(name, parameters={"dataset": str(worse)}, timeout=300)
run_deployment(name, parameters={"dataset": str(worse)}, timeout=300)


async def ids() -> None:
    async with get_client() as client:
        runs = [r for r in await client.read_flow_runs() if r.parent_task_run_id]
        last = max(runs, key=lambda r: r.created)
        parent = (await client.read_task_run(last.parent_task_run_id)).flow_run_id
        deployment = await client.read_deployment_by_name(name)
        tasks = await client.read_task_runs()
        failed = [t for t in tasks if t.flow_run_id == last.id and t.state.name == "Not passed"]
        art = {a.key.rsplit("-", 1)[-1] if not a.key.endswith("vs-previous") else "vs-previous": a
               for a in await client.read_artifacts() if a.flow_run_id == last.id and a.key}
        # (the UI cannot open a file:// link: the charts say the command that opens it)
        report = re.search(r"webbrowser (file://[^`]*report\.html)`", art["charts"].data).group(1)
        findings = re.search(r"\]\((/runs\?tab=task-runs[^)]*)\)", art["charts"].data).group(1)
        ui = "http://127.0.0.1:4310"
        (scratch / "urls").write_text(
            f"deployment 1500,900 {ui}/deployments/deployment/{deployment.id}\n"
            f"runs 1500,1300 {ui}/runs\n"
            f"parent-run 1500,2000 {ui}/runs/flow-run/{parent}\n"
            f"summary 1500,700 {ui}/artifacts/artifact/{art['summary'].id}\n"
            f"history 1500,700 {ui}/artifacts/artifact/{art['history'].id}\n"
            f"flow-run 1500,1700 {ui}/runs/flow-run/{last.id}\n"
            f"not-passed 1400,420 {ui}/runs/task-run/{failed[0].id}\n"
            f"vs-previous 1500,1000 {ui}/artifacts/artifact/{art['vs-previous'].id}\n"
            f"charts 1500,2300 {ui}/artifacts/artifact/{art['charts'].id}\n"
            f"findings 1500,800 {ui}{findings}\n"
            f"report 1500,1900 {report}#verdict=not+passed&row=2\n")

asyncio.run(ids())
EOF

sleep 10  # the records and logs catch up
# Chromium through DevTools (tests/chromium.py): the UI asks for the stack's auth string
# on a login page, so the browser is given it first, where that page keeps it.
"$PY" - "$SCRATCH/urls" "${OUT:-docs}" <<'EOF'
import base64, os, sys, time
from pathlib import Path

sys.path.insert(0, ".")
from tests.chromium import Browser

urls, out = Path(sys.argv[1]), Path(sys.argv[2])
password = base64.b64encode(os.environ["PREFECT_API_AUTH_STRING"].encode()).decode()
with Browser() as browser:
    browser.open("http://127.0.0.1:4310/ui-settings")
    browser.wait_for("document.readyState == 'complete'")
    browser.js(f"localStorage.setItem('prefect-password', {password!r})")
    for name, size, url in (line.split(" ", 2) for line in urls.read_text().splitlines()):
        width, height = (int(n) for n in size.split(","))
        browser.send("Emulation.setDeviceMetricsOverride", width=width, height=height,
                     deviceScaleFactor=1, mobile=False)
        browser.open(url)
        time.sleep(8)  # the page, its charts and its data are drawn
        browser.screenshot(out / f"{name}.png")
EOF
ls -l "${OUT:-docs}"/*.png
