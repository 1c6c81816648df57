"""Shared fixtures. Tests that only need a Prefect API share one real server per session."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from .prefect_gate import Gate, gate_for
from .prefect_servers import SessionServer, api_of

ROOT = Path(__file__).resolve().parent.parent
_SESSION = SessionServer()


def _needs_server(item: pytest.Item) -> bool:
    names = getattr(item, "fixturenames", ())
    return "prefect_server" in names or "prefect_template_db" in names


#: The recorder's stall in the suite (15 s by default): the shared server, loaded by four
#: workers' tests, now and then drops a flush of task-run events; the first resend keeps
#: the ids (what a restarted server needs) and the broker drops them as seen, the second
#: goes under new ids. At 15 then 30 s that outlasted the tests' 60 s waits.
STALL_SECONDS = "5"
#: Seconds a test waits for Prefect to record an experiment on the shared server: it may
#: have thousands of other tests' events to record first (~5 ms each on 2 cores; two fresh
#: clone runs missed 60 s, each time in tests that record a row or two).
RECORDED_WITHIN = 120


def _one_tls_context_per_setting() -> None:
    """httpx makes a TLS context (the CA bundle loaded: ~24 ms of CPU, measured) for every
    client, and `httpx.get`/`post` make a client per call: the tests' polls of their
    servers, and Prefect's clients in this process, spent ~20 s of the suite's CPU on it
    (py-spy over every process). One context per setting here, as the package keeps one
    (`prefect.lean.tls_context`, `http._ssl_context`); connections are as real as before."""
    import functools

    import httpx._transports.default as transports

    made = transports.create_ssl_context

    @functools.cache
    def default(trust_env: bool, by_env: tuple[str | None, str | None]) -> Any:
        return made(True, None, trust_env)

    def cached(verify: Any = True, cert: Any = None, trust_env: bool = True) -> Any:
        if verify is True and cert is None:  # the CA bundle httpx picks, by its settings
            return default(trust_env, (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR")))
        return made(verify, cert, trust_env)

    transports.create_ssl_context = cached


_one_tls_context_per_setting()


#: How long a recorder waits for the shared server to answer before it gives a run up
#: (30 s by default): loaded by four workers' tests, it once took over 30 s to make a
#: sweep variant's flow run, which then had no verdict.
UNANSWERED_SECONDS = "120"


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("PATRONUS_TASKS_RECORDER_STALL_SECONDS", STALL_SECONDS)
    os.environ.setdefault("PATRONUS_TASKS_RECORDER_UNANSWERED_SECONDS", UNANSWERED_SECONDS)
    # xdist's controller collects no tests: it starts the server its workers will share
    # now, before they exist, so that they inherit where it is.
    if config.getoption("numprocesses", None) and "PYTEST_XDIST_WORKER" not in os.environ:
        _SESSION.begin()


#: The slowest modules, slowest first (10-90 s each on 2 cores, measured 2026-11-26 with
#: four test processes): handed out first (xdist's loadfile gives each worker whole
#: modules, in the order of the items), so that the short ones even out the end. The
#: first four need no shared server: it migrates its new database meanwhile (~20 s).
#: test_hosts (six hosts' processes, niced) runs among them: last, it ran alone for ~35 s
#: at the end of every run; beside the shared server's tests it slowed none past its limits.
SLOWEST = ("test_main_job", "test_stack", "test_security", "test_lint", "test_judges", "test_backends",
           "test_results_first", "test_hosts", "test_object_store", "test_workers",
           "test_local_server", "test_recorder_restarts", "test_flows_http", "test_deployment",
           "test_rate_limits", "test_rag_flow", "test_sweep_prefect",
           "test_costs_repeats_metrics", "test_prefect_ui",
           "test_review", "test_recorder", "test_resume", "test_cache", "test_compare_cli", "test_bad_input")


#: Handed out last (none now; see test_hosts above).
LAST: tuple[str, ...] = ()


def _rank(item: pytest.Item) -> tuple[int, bool]:
    module = item.path.stem
    if module in LAST:
        return len(SLOWEST) + 1 + LAST.index(module), True
    if module in SLOWEST:
        return SLOWEST.index(module), False
    return len(SLOWEST), _needs_server(item)  # the rest: what needs no server first


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Start the shared server now (when not started already); order as `SLOWEST` says
    # (stable: a module's tests keep their order).
    if any(_needs_server(item) for item in items):
        _SESSION.begin()
    items.sort(key=_rank)


def pytest_sessionfinish() -> None:
    from patronus_tasks.run import background as _background

    _background.drain(timeout=120)  # records still on their way to the server go first
    _SESSION.stop()


@contextlib.contextmanager
def _global_settings(settings: Any) -> Iterator[None]:
    """Prefect's process-global settings context replaced while the block runs."""
    import prefect.context

    prior = prefect.context.GLOBAL_SETTINGS_CONTEXT
    prefect.context.GLOBAL_SETTINGS_CONTEXT = settings
    try:
        yield
    finally:
        prefect.context.GLOBAL_SETTINGS_CONTEXT = prior


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[str]:
    """The session's real Prefect server (services on, a database of its own), as the
    API of this process and of the processes tests start."""
    import prefect.context
    from prefect.settings import PREFECT_API_URL, temporary_settings

    url = _SESSION.wait().api_url
    with ExitStack() as stack:
        stack.enter_context(temporary_settings(updates={PREFECT_API_URL: url}))
        # Contexts copied before this one (threads Prefect started) see it too: what
        # Prefect's own prefect_test_harness does (3.9's private helper for it is not in 3.8).
        stack.enter_context(_global_settings(prefect.context.get_settings_context()))
        os.environ["PREFECT_API_URL"] = url
        try:
            yield url
        finally:
            os.environ.pop("PREFECT_API_URL", None)


@pytest.fixture
def prefect_gate(prefect_server: str) -> Iterator[Gate]:
    """The session's server behind a gate (tests/prefect_gate.py: what a test plays with
    the posts of events and logs), as this process's API meanwhile."""
    with gate_for(prefect_server) as gate, api_of(gate.url):
        yield gate


@pytest.fixture(scope="session")
def prefect_server_home(prefect_server: str) -> Path:
    """Where the shared server keeps its database and log."""
    return _SESSION.home


@pytest.fixture(scope="session")
def prefect_template_db(prefect_server: str) -> Path:
    """A freshly migrated Prefect database to start other servers from."""
    return _SESSION.template


@pytest.fixture
def results_dir(tmp_path: Path) -> Path:
    return tmp_path / "results"


@pytest.fixture(autouse=True)
def _no_ambient_results_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PATRONUS_TASKS_RESULTS_DIR", raising=False)
    os.environ.setdefault("PREFECT_LOGGING_TO_API_ENABLED", "false")
