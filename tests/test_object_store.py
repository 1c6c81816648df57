"""``results_dir`` as an object-store URL, against a real S3-compatible server (moto's,
in this process on 127.0.0.1): run, read back, resume after SIGKILL, the Prefect link
artifact, credentials never shown, Dask workers writing parts; and ``file://`` URLs.
gs:// and az:// need their services and are not run here (az:// without adlfs is
checked to say so)."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pandas as pd
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from patronus_tasks import ConfigError, Row, evaluator, run_experiment, task
from patronus_tasks.record.location import Location, redact
from patronus_tasks.results import list_experiments, load_experiment

from .conftest import RECORDED_WITHIN
from .servers import serve
from .test_resume import CountingModel, _run, killed_mid_run

BUCKET = "results-bucket"
SECRET = "s3cr3tValue"  # moto takes any credentials; this one must never show
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    """A moto S3 server with one bucket; its ``host:port``. Credentials from the
    environment, as for real S3 (subprocesses inherit them)."""
    from moto.server import ThreadedMotoServer

    saved = {k: os.environ.get(k) for k in AWS_ENV}
    os.environ.update(AWS_ENV)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"{host}:{port}"
    pafs.S3FileSystem(endpoint_override=endpoint, scheme="http",
                     allow_bucket_creation=True).create_dir(BUCKET)
    try:
        yield endpoint
    finally:
        server.stop()
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def _url(endpoint: str, prefix: str, extra: str = "") -> str:
    return f"s3://{BUCKET}/{prefix}?endpoint_override={endpoint}&scheme=http{extra}"


def _keys(endpoint: str, prefix: str) -> list[str]:
    fs = pafs.S3FileSystem(endpoint_override=endpoint, scheme="http")
    found = fs.get_file_info(pafs.FileSelector(f"{BUCKET}/{prefix}", recursive=True,
                                               allow_not_found=True))
    return sorted(i.path.removeprefix(f"{BUCKET}/{prefix}/") for i in found
                  if i.type == pafs.FileType.File)


@task
def echo(evaluated_model_input: str) -> str:
    return f"echo {evaluated_model_input}"


@evaluator
def is_echo(evaluated_model_output: str) -> bool:
    return evaluated_model_output.startswith("echo")


DATA = [{"evaluated_model_input": f"q{i}"} for i in range(12)]


def test_experiment_on_s3_reads_back_everywhere(s3: str) -> None:
    prefix = f"runs-{uuid.uuid4().hex[:8]}"
    url = _url(s3, prefix)
    exp = run_experiment("s3 project", data=DATA, task=echo, evaluators=[is_echo],
                         experiment_name="first", backend="local", results_dir=url,
                         print_summary=False)
    assert exp.wait_recorded(RECORDED_WITHIN)  # the report is written after the results
    folder = "s3_project-ec8c5516/first"  # the project's name cleaned, and its hash
    assert _keys(s3, prefix) == [f"{folder}/manifest.json", f"{folder}/report.html",
                                 f"{folder}/results.parquet",
                                 f"{folder}/spans.parquet"]  # the report an object too
    assert str(exp.results_path) == _url(s3, f"{prefix}/{folder}/results.parquet")
    assert exp.manifest["status"] == "completed" and exp.manifest["rows"] == 12
    assert exp.to_dataframe()["pass"].all() and len(exp.to_dataframe()) == 12
    assert f"Results: s3://{BUCKET}/{prefix}/{folder}/results.parquet" in exp.format_summary()
    # By URL of its folder, by name under the results URL, and in the listing.
    assert len(load_experiment(_url(s3, f"{prefix}/{folder}")).to_dataframe()) == 12
    assert load_experiment("s3 project/first", results_dir=url).manifest == exp.manifest
    assert [e.name for e in list_experiments(url)] == ["first"]
    # Plain pyarrow and pandas read the object too.
    fs = pafs.S3FileSystem(endpoint_override=s3, scheme="http")
    key = f"{BUCKET}/{prefix}/s3_project-ec8c5516/first/results.parquet"
    assert pq.read_table(key, filesystem=fs).num_rows == 12
    assert len(pd.read_parquet(key, filesystem=fs)) == 12
    # A second run of the name gets a folder of its own, as locally.
    again = run_experiment("s3 project", data=DATA, task=echo, evaluators=[is_echo],
                           experiment_name="first", backend="local", results_dir=url, print_summary=False)
    assert str(again.path).startswith(f"s3://{BUCKET}/{prefix}/s3_project-ec8c5516/first-2?")
    # The two runs, a series: one dataset of the objects; their spans say where as they do.
    import pyarrow.dataset as ds

    both = [f"{BUCKET}/{prefix}/s3_project-ec8c5516/{name}/results.parquet" for name in ("first", "first-2")]
    assert ds.dataset(both, filesystem=fs).to_table().num_rows == 24
    spans = pq.read_schema(f"{BUCKET}/{prefix}/s3_project-ec8c5516/first/spans.parquet", filesystem=fs)
    assert spans.names[:3] == ["sid", "repeat", "link_index"]
    assert spans.field("started_at").type == pq.read_schema(both[0], filesystem=fs).field(
        "task_started_at").type


def test_cli_takes_a_results_url(s3: str) -> None:
    from typer.testing import CliRunner

    from patronus_tasks.cli import app

    prefix = f"cli-{uuid.uuid4().hex[:8]}"
    url = _url(s3, prefix)
    run_experiment("cli", data=DATA[:4], task=echo, evaluators=[is_echo], experiment_name="e",
                   backend="local", results_dir=url, print_summary=False)
    runner = CliRunner()
    listed = runner.invoke(app, ["list", "--results-dir", url])
    assert listed.exit_code == 0 and "cli/e " in listed.stdout and "rows=4" in listed.stdout
    shown = runner.invoke(app, ["show", "cli/e", "--results-dir", url])
    assert shown.exit_code == 0 and "Pass rate : 100.0%  (4/4)" in shown.stdout
    exported = runner.invoke(app, ["export", _url(s3, f"{prefix}/cli/e"), "--format", "csv"])
    assert exported.exit_code == 0 and exported.stdout.count("\n") == 5


def test_endpoint_from_the_environment(s3: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{s3}")
    prefix = f"env-{uuid.uuid4().hex[:8]}"
    exp = run_experiment("p", data=DATA[:3], task=echo, evaluators=[is_echo], experiment_name="e",
                         backend="local", results_dir=f"s3://{BUCKET}/{prefix}", print_summary=False)
    assert str(exp.results_path) == f"s3://{BUCKET}/{prefix}/p/e/results.parquet"
    assert len(exp.to_dataframe()) == 3 and "p/e/results.parquet" in _keys(s3, prefix)


def test_journal_on_s3_keeps_every_row_without_a_flush(s3: str) -> None:
    """Object storage has no append: each row is an object of the part's journal, so a
    writer that dies before its part loses none, and the next writer adopts them."""
    from patronus_tasks.record.parquet import ParquetSink, read_results
    from patronus_tasks.record.records import Record

    prefix = f"journal-{uuid.uuid4().hex[:8]}"
    out = Location.of(_url(s3, prefix))
    df = pd.DataFrame({"sid": ["1", "2", "3"], "n": [1, 2, 3]})
    sink = ParquetSink(out, df, batch_rows=10_000, flush_seconds=3600)
    for row in df.to_dict("records"):
        sink.add([Record(sid=row["sid"], link_index=0, status="ok", row={"n": row["n"]})])
    assert _keys(s3, prefix) == [f"parts/part-000000.journal/{i:08d}" for i in range(3)]
    assert read_results(Location.of(_url(s3, prefix)))["n"].to_pylist() == [1, 2, 3]
    ParquetSink(out, df)  # a new writer: the journal becomes part 0, it goes on at part 1
    assert _keys(s3, prefix) == ["parts/part-000000.parquet"]
    assert read_results(out).num_rows == 3


def test_resume_from_s3_after_sigkill(s3: str) -> None:
    """As tests/test_resume.py's SIGKILL test, with the results in S3."""
    counting = CountingModel()
    prefix = f"resume-{uuid.uuid4().hex[:8]}"
    url = _url(s3, prefix)
    with serve(counting) as server:
        killed_mid_run(server.url, url, counting)
        folder = _url(s3, f"{prefix}/resumable/long-run")
        assert not any(k.endswith("results.parquet") for k in _keys(s3, prefix))
        done_before = set(load_experiment(folder).to_dataframe()["evaluated_model_input"])
        assert {f"q{i}" for i in range(10)} <= done_before
        counting.stall.clear()
        resumed = _run(server.url, url, "resume")
        assert resumed.wait(120) == 0, resumed.stderr.read().decode()[-2000:] if resumed.stderr else ""
    exp = load_experiment(folder)
    df = exp.to_dataframe()
    assert sorted(df["sid"], key=int) == [str(i) for i in range(1, 31)] and df["pass"].all()
    assert all(counting.seen[q] == 1 for q in done_before)  # never asked twice
    assert exp.manifest["status"] == "completed" and exp.manifest["rows"] == 30
    assert _keys(s3, prefix) == ["resumable/long-run/manifest.json",
                                 "resumable/long-run/report.html",
                                 "resumable/long-run/results.parquet",
                                 "resumable/long-run/spans.parquet"]


class _ReplacedWhileRead:
    """The location's file system, replacing the object (once, ``size`` bytes of ``fill``)
    right after a read asked its size: a writer racing a reader, at the worst moment."""

    def __init__(self, fs: pafs.FileSystem, fill: bytes, size: int) -> None:
        self.fs, self.fill, self.size = fs, fill, size

    def open_input_stream(self, key: str) -> object:
        stream = self.fs.open_input_stream(key)  # pyarrow asks the size here
        if self.size:
            with self.fs.open_output_stream(key) as out:
                out.write(self.fill * self.size)
            self.size = 0
        return stream

    def __getattr__(self, name: str) -> object:
        return getattr(self.fs, name)


@pytest.mark.parametrize("size", [1500, 2500], ids=["shorter", "longer"])
def test_a_file_replaced_while_read_is_read_whole(s3: str, size: int) -> None:
    """A manifest rewritten while the recorder read it came back padded with NULs (CI:
    "trailing characters"): the read is one version of the file, never a mix."""
    where = Location.of(_url(s3, f"race-{uuid.uuid4().hex[:8]}")) / "manifest.json"
    where.write_bytes(b"A" * 2000)
    where._fs = _ReplacedWhileRead(where._fs, b"B", size)  # type: ignore[assignment]
    assert where.read_bytes() == b"B" * size


def test_credentials_in_the_url_are_never_shown(s3: str, caplog: pytest.LogCaptureFixture) -> None:
    prefix = f"secret-{uuid.uuid4().hex[:8]}"
    # pyarrow takes S3 credentials in the URL as user:password (its query takes none).
    url = _url(s3, prefix).replace("s3://", f"s3://testing:{SECRET}@")
    caplog.set_level(logging.DEBUG)
    exp = run_experiment("p", data=DATA[:2], task=echo, evaluators=[is_echo], experiment_name="e",
                         backend="local", results_dir=url, print_summary=False)
    shown = [str(exp.path), str(exp.results_path), repr(exp), exp.format_summary(), caplog.text]
    fs = pafs.S3FileSystem(endpoint_override=s3, scheme="http")
    stored = [fs.open_input_stream(f"{BUCKET}/{prefix}/{k}").read().decode("latin-1")
              for k in _keys(s3, prefix)]  # the manifest, and the Parquet with its metadata
    for text in shown + stored:
        assert SECRET not in text and "s3cr3t" not in text
    assert str(exp.results_path).startswith(f"s3://***:***@{BUCKET}/{prefix}/p/e/results.parquet?")
    assert Location.of(url).link == f"s3://{BUCKET}/{prefix}"
    with pytest.raises(ConfigError) as err:  # an error names the URL: redacted too
        run_experiment("p", data=DATA[:1], task=echo, evaluators=[is_echo], backend="local",
                       results_dir=url.replace(BUCKET, "no-such-bucket"), print_summary=False)
    assert "s3cr3t" not in str(err.value) and "no-such-bucket" in str(err.value)


def test_redact() -> None:
    assert redact("s3://AKID:topsecret@b/k?endpoint_override=h:1&scheme=http&session_token=t0k") == \
        "s3://***:***@b/k?endpoint_override=h:1&scheme=http&session_token=***"
    assert redact("abfs://container@acct.dfs.core.windows.net/x?sas_token=sv%3Dabc") == \
        "abfs://container@acct.dfs.core.windows.net/x?sas_token=***"


def test_schemes_that_need_a_package_say_which() -> None:
    pytest.importorskip("fsspec")
    try:
        import adlfs  # noqa: F401
        pytest.skip("adlfs is installed")
    except ImportError:
        pass
    with pytest.raises(ConfigError, match="adlfs") as err:
        Location.of("az://container/x?account_key=hush")
    assert "hush" not in str(err.value)
    with pytest.raises(ConfigError, match="nosuchscheme"):
        Location.of("nosuchscheme://x/y")


def test_file_url_is_a_local_folder(tmp_path: Path) -> None:
    exp = run_experiment("p", data=DATA[:3], task=echo, evaluators=[is_echo], experiment_name="e",
                         backend="local", results_dir=(tmp_path / "r").as_uri(), print_summary=False)
    assert exp.path == (tmp_path / "r" / "p" / "e").resolve() and isinstance(exp.path, Path)
    assert exp.results_path == exp.path / "results.parquet" and pq.read_table(exp.results_path).num_rows == 3
    assert Location.of(exp.results_path).link == exp.path.joinpath("results.parquet").as_uri()


def test_link_artifact_points_at_the_s3_object(s3: str, prefect_server: str) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    from patronus_tasks.prefect.ui.artifacts import artifact_key

    prefix = f"prefect-{uuid.uuid4().hex[:8]}"

    @evaluator
    def ok(row: Row) -> bool:
        return True

    exp = run_experiment("S3 Linked", data=DATA[:4], evaluators=[ok], experiment_name="nightly",
                         results_dir=_url(s3, prefix), print_summary=False)
    assert exp.wait_recorded(RECORDED_WITHIN)  # the artifacts follow the results

    async def links() -> list[str]:
        async with get_client() as client:
            found = await client.read_artifacts(artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=[artifact_key("S3 Linked", "results")]),
                flow_run_id=ArtifactFilterFlowRunId(any_=[exp.manifest["flow_run_id"]])))
        return [str(a.data) for a in found]

    target = f"s3://{BUCKET}/{prefix}/S3_Linked-ddd83ad1/nightly/results.parquet"
    assert asyncio.run(links()) == [f"[{target}]({target})"]
    # The charts link the HTML report with a pre-signed link a browser opens (its expiry said)
    async def charts() -> str:
        async with get_client() as client:
            found = await client.read_artifacts(artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=[artifact_key("S3 Linked", "charts")])))
        return str(found[0].data)

    signed = re.search(r"HTML report: \[report\.html\]\((http://[^)]+)\) \(a pre-signed link, "
                       r"valid until \d{4}-\d\d-\d\d \d\d:\d\d UTC\)", asyncio.run(charts()))
    assert signed and "X-Amz-Signature=" in signed.group(1) and "testing%2F" in signed.group(1)
    opened = httpx.get(signed.group(1))
    assert opened.status_code == 200 and "<title>S3 Linked/nightly</title>" in opened.text
    assert str(exp.results_path) == _url(s3, f"{prefix}/S3_Linked-ddd83ad1/nightly/results.parquet")
    assert exp.to_dataframe()["pass"].all()
    # The records catch up in the background, noting it in the manifest in S3 (before
    # this module's server goes: wait for them).
    assert exp.wait_recorded(RECORDED_WITHIN)
    assert load_experiment(exp.location).manifest["prefect"]["complete"] is True
    # The next run of the series finds this one from its link (no endpoint in it: the
    # run's own storage settings open it) and compares with it.
    again = run_experiment("S3 Linked", data=DATA[:4], evaluators=[ok],
                           experiment_name="nightly", results_dir=_url(s3, prefix),
                           print_summary=False)
    assert again.wait_recorded(RECORDED_WITHIN)

    async def compared() -> str:
        async with get_client() as client:
            found = await client.read_artifacts(artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=[artifact_key("S3 Linked", "vs-previous")]),
                flow_run_id=ArtifactFilterFlowRunId(any_=[again.manifest["flow_run_id"]])))
        return str(found[0].data)

    report = asyncio.run(compared())
    assert "Previous run: **nightly**" in report and f"`{target}`" in report
    assert "| ok | same | 0 / 0 | 100.0% → 100.0% |" in report


def test_a_presigned_link_is_signed_as_aws_signs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The report's link in object storage: Signature Version 4 in the query, as botocore
    makes it for the same time (AWS's own endpoint, and an S3-compatible one); never with a
    session token (it would sit in the link)."""
    import datetime as dt

    import botocore.auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    from patronus_tasks.record.presign import EXPIRES, presigned

    now = dt.datetime(2026, 11, 28, 2, 0, tzinfo=dt.UTC)
    env = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_REGION": "eu-west-1",
           "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"}
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: now.replace(tzinfo=None))
    for url in ("s3://my-bucket/results/text to sql/exp-1/report.html",
                "s3://b/p/r.html?endpoint_override=127.0.0.1:9000&scheme=http"):
        mine = presigned(url, now, env)
        assert not isinstance(mine, str) and mine.expires == now + dt.timedelta(days=7)
        request = AWSRequest(method="GET", url=mine.url.split("?")[0])
        botocore.auth.S3SigV4QueryAuth(Credentials(env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]),
                                       "s3", "eu-west-1", expires=EXPIRES).add_auth(request)
        assert mine.url == request.url
    assert "session token" in str(presigned("s3://b/k", now, {**env, "AWS_SESSION_TOKEN": "t"}))
