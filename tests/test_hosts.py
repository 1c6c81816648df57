"""An experiment apart, as deployed: the Prefect server, the object storage (moto's S3
server), the Dask scheduler, two Dask workers and a Prefect worker each on a "host" of its
own (network namespaces: tests/netns.py), the results and the cache in the bucket. The
test's process is the user's laptop: it makes the deployment and asks for a run through
the server's API; the Prefect worker (a `process` work pool) runs the flow from its own
folder; the flow's rows run on the Dask workers.

Every row in the results once, written by a Dask worker whose host is in the row's `host`
column; every call a task run on the server; the Dask workers never see the flow's folder
(hidden under an empty tmpfs on their hosts): the steps travel by value, the results go to
the bucket. One Dask worker is killed mid-run: the experiment completes on the other,
every row still once (README, "Dask": a row written by a dead attempt is kept, not run
again).
"""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from patronus_tasks.prefect import internal
from patronus_tasks.prefect.settings import BUILT_IN_SERVER_OFF, PERSISTER_SETTING, SERVER_DEFAULTS

from . import netns
from .prefect_servers import copy_database
from .waits import until

pytestmark = [pytest.mark.heavy,
              pytest.mark.skipif(netns.available() is not None, reason=str(netns.available()))]

ROWS = 32
AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
       "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}

FLOW = textwrap.dedent('''
    import json, socket, time
    from prefect import flow
    from patronus_tasks import Row, evaluator, run_experiment, task

    ANSWERED = []  # per batch: the function travels by value, its globals with it

    @task(cache=True)
    def answer(row: Row) -> str:
        # worker-b, killed once it wrote 2 rows, writes 2 of each batch and then hangs:
        # the kill lands mid-batch however late the test's polling of the bucket sees
        # them (a suite under load killed it between batches: nothing was run again).
        ANSWERED.append(row["question"])
        hangs = socket.gethostname() == "worker-b" and len(ANSWERED) > 2
        time.sleep(300 if hangs else 0.3)
        return row["question"].upper()

    @evaluator
    def shouted(evaluated_model_output: str) -> bool:
        return evaluated_model_output.isupper()

    @flow
    def nightly(scheduler: str, results: str, cache: str) -> None:
        exp = run_experiment("apart", data=[{"question": f"q{i}"} for i in range(ROWS)],
                             task=answer, evaluators=[shouted], backend="dask",
                             dask_address=scheduler, results_dir=results, cache=cache,
                             experiment_name="hosts", print_summary=False, max_concurrency=1)
        print("RECORDED", exp.wait_recorded(120), flush=True)
        print("RESULT", json.dumps({"path": str(exp.path), "flow_run_id": exp.manifest["flow_run_id"],
                                    "status": exp.manifest["status"]}), flush=True)
''').replace("ROWS", str(ROWS))


def test_an_experiment_apart_on_six_hosts_with_a_worker_killed(tmp_path: Path,
                                                               prefect_template_db: Path) -> None:
    names = ["server", "storage", "scheduler", "worker-a", "worker-b", "runner"]
    with netns.network(tmp_path, names) as hosts:
        server, storage, runner = hosts["server"], hosts["storage"], hosts["runner"]
        api = f"http://{server.address}:4200/api"
        s3 = f"{storage.address}:5000"
        _start_server(server, prefect_template_db)
        storage.start([sys.executable, "-m", "moto.server", "-H", "0.0.0.0", "-p", "5000"], AWS)
        scheduler = f"tcp://{hosts['scheduler'].address}:8786"
        hosts["scheduler"].start([sys.executable, "-m", "distributed.cli.dask_scheduler",
                                  "--host", hosts["scheduler"].address, "--port", "8786",
                                  "--dashboard-address", ":0"], {})
        worker_env = {**AWS, "PREFECT_API_URL": api}
        for name in ("worker-a", "worker-b"):
            host = hosts[name]
            host.start([sys.executable, "-m", "distributed.cli.dask_worker", scheduler,
                        "--host", host.address, "--nthreads", "2", "--no-nanny",
                        "--no-dashboard"], worker_env, hide=[runner.home])
        _wait_up(f"{api}/health", server)
        (runner.home / "experiment.py").write_text(FLOW)
        runner.start([sys.executable, "-m", "prefect", "worker", "start", "--pool", "hosts",
                      "--type", "process"], {**worker_env, "PREFECT_WORKER_QUERY_SECONDS": "1"})
        _wait_workers(scheduler, 2)
        _make_bucket(s3, storage)
        bucket = f"s3://runs/{{}}?endpoint_override={s3}&scheme=http"
        flow_run = _deploy_and_run(api, runner.home, {
            "scheduler": scheduler, "results": bucket.format("results"), "cache": bucket.format("cache")})
        # worker-b dies once it wrote 2 rows (their journals in the bucket name its host).
        until(lambda: time.sleep(0.3) or _written_by(s3, "worker-b") >= 2
              or _state(api, flow_run) in FINAL, "rows written by worker-b", 120)
        hosts["worker-b"].stop()
        until(lambda: time.sleep(0.5) or _state(api, flow_run) in FINAL, "the flow run's end", 180)
        said = runner.log()
        assert _state(api, flow_run) == "COMPLETED", said
        result = json.loads(said.split("RESULT ", 1)[1].splitlines()[0])
        assert "RECORDED True" in said and result["status"] == "completed", said
        df = _results(s3)
        # Every row once, each written on a Dask worker's host (the runner ran none of them).
        assert sorted(df["question"]) == sorted(f"q{i}" for i in range(ROWS)), df
        assert len(df) == ROWS and df["pass"].all()
        # worker-b's rows written before it died are kept (not run again on worker-a).
        assert set(df["host"]) == {"worker-a", "worker-b"}, df["host"].value_counts()
        assert "rows written then are kept" in hosts["worker-a"].log(), hosts["worker-a"].log()
        # Every call a task run on the server; the cache's entries in the bucket.
        runs = _task_runs(api, result["flow_run_id"])
        assert {f"answer-{i}" for i in range(1, ROWS + 1)} <= runs
        assert {f"shouted-{i}" for i in range(1, ROWS + 1)} <= runs
        assert _objects(s3, "runs/cache"), "no cache entry in the bucket"


FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def _deploy_and_run(api: str, folder: Path, parameters: dict[str, str]) -> str:
    """What `prefect deploy` and `prefect deployment run` do, through the API: a process
    work pool, a deployment of ``nightly`` whose code is in ``folder`` (on the runner's
    host), a run of it. The id of that flow run."""
    with httpx.Client(base_url=api, timeout=10) as http:
        # 409: there already (the workers' hosts start theirs with `--type process`, which
        # makes the pool when it is missing: on a loaded machine one got there first).
        _post(http, "/work_pools/", {"name": "hosts", "type": "process"}, exists_ok=True)
        flow_id = _post(http, "/flows/", {"name": "nightly"}).json()["id"]
        steps = [{"prefect.deployments.steps.set_working_directory": {"directory": str(folder)}}]
        deployment = _post(http, "/deployments/", {
            "name": "apart", "flow_id": flow_id, "work_pool_name": "hosts",
            "entrypoint": "experiment.py:nightly", "pull_steps": steps}).json()["id"]
        made = _post(http, f"/deployments/{deployment}/create_flow_run", {"parameters": parameters})
        return str(made.json()["id"])


def _post(http: httpx.Client, path: str, body: dict[str, object],
          exists_ok: bool = False) -> httpx.Response:
    """A post the SQLite server may refuse while busy (503, "database is locked"): asked
    again, as Prefect's own client does (``exists_ok``: a 409 is fine too)."""
    for _ in range(10):
        made = http.post(path, json=body)
        if made.status_code != 503:
            break
        time.sleep(0.5)
    if not (exists_ok and made.status_code == 409):
        made.raise_for_status()
    return made


def _state(api: str, flow_run: str) -> str:
    """The flow run's state type; "" while the server, sharing the suite's 2 cores, is too
    busy to answer in 10 s (seen in CI): the waits around it ask again."""
    try:
        made = httpx.get(f"{api}/flow_runs/{flow_run}", timeout=10)
    except httpx.TimeoutException:
        return ""
    return str(made.json()["state_type"])


def _start_server(host: netns.Host, template: Path) -> None:
    copy_database(template, host.home / ".prefect")
    argv = internal.server_command(4200)
    argv[argv.index("127.0.0.1")] = "0.0.0.0"
    # The services a run needs only (the task-run recorder, the event persister): this
    # test's hosts share the suite's 2 cores with the other tests' servers.
    lean = {k: v for k, v in BUILT_IN_SERVER_OFF.items() if k != PERSISTER_SETTING}
    host.start(argv, {**SERVER_DEFAULTS, **lean, "PREFECT_UI_ENABLED": "0",
                      "PREFECT_SERVER_DATABASE_MIGRATE_ON_START": "false",
                      "PREFECT_SERVER_REGISTER_BLOCKS_ON_START": "false"})


def _wait_up(url: str, host: netns.Host) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.3)
    raise AssertionError(f"nothing answers {url}: {host.log()}")


def _wait_workers(scheduler: str, count: int) -> None:
    from distributed import Client

    with Client(scheduler, timeout=30) as dask:
        dask.wait_for_workers(count, timeout=60)


def _make_bucket(endpoint: str, host: netns.Host) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            _fs(endpoint).create_dir("runs")
            return
        except OSError:
            if time.monotonic() > deadline:
                raise AssertionError(f"no S3 server on {endpoint}: {host.log()}") from None
            time.sleep(0.3)


def _fs(endpoint: str) -> pafs.S3FileSystem:
    return pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", access_key="testing",
                             secret_key="testing", region="us-east-1", allow_bucket_creation=True)


def _objects(endpoint: str, prefix: str) -> list[str]:
    found = _fs(endpoint).get_file_info(pafs.FileSelector(prefix, recursive=True,
                                                          allow_not_found=True))
    return [i.path for i in found if i.type == pafs.FileType.File]


def _written_by(endpoint: str, host: str) -> int:
    """Rows journalled so far by ``host`` (a row's records are one object of its part's
    journal while the experiment runs)."""
    fs, mark = _fs(endpoint), f'"host":"{host}"'.encode()
    try:
        keys = [k for k in _objects(endpoint, "runs/results") if ".journal" in k]
        return sum(fs.open_input_stream(k).read().count(mark) > 0 for k in keys)
    except OSError:  # a journal made into its part meanwhile
        return 0


def _results(endpoint: str) -> Any:
    key = next(p for p in _objects(endpoint, "runs/results") if p.endswith("results.parquet"))
    return pq.read_table(key, filesystem=_fs(endpoint)).to_pandas()


def _task_runs(api: str, flow_run_id: str) -> set[str]:
    """The names of the flow run's task runs."""
    body = {"flow_runs": {"id": {"any_": [flow_run_id]}}, "limit": 200}
    found = httpx.post(f"{api}/task_runs/filter", json=body, timeout=60).json()
    more = httpx.post(f"{api}/task_runs/filter", json={**body, "offset": 200}, timeout=60).json()
    return {r["name"] for r in [*found, *more]}
