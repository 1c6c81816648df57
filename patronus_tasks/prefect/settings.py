"""Settings of the Prefect side: what the servers this package starts are given, their CPU
priority, and the recorder's and the task runners' patience (environment variables)."""

from __future__ import annotations

from patronus_tasks.settings import seconds_from_env as _seconds

#: Server-side settings for the Prefect servers this package starts (the built-in one,
#: `server up`'s). With Prefect's defaults a server records ~25 task runs/s; bigger
#: batches and short flush intervals let it keep up. Only the server processes get them,
#: and only where the user set nothing.
SERVER_DEFAULTS = {
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "500",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_READ_BATCH_SIZE": "100",
    "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_READ_BATCH_SIZE": "100",
    # Whole seconds only: Prefect 3.8 takes int() of it, and 0.5 became sleep(0), a loop
    # that kept a core busy on an idle server.
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL": "1",
    "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_BATCH_SIZE": "500",
    "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_FLUSH_INTERVAL": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
}


#: What the built-in server does not run (where the user set nothing): it is private to
#: one process, so nobody schedules deployments on it, makes automations on it or watches
#: its live event stream; what is read of it later (`prefect server start` on its
#: database) is flow runs, task runs, logs and artifacts, none of which needs these. The
#: event persister alone cost ~half of the server's CPU per recorded call (bench/README.md).
BUILT_IN_SERVER_OFF = {
    f"PREFECT_SERVER_SERVICES_{name}_ENABLED": "false" for name in (
        "SCHEDULER", "LATE_RUNS", "FOREMAN", "CANCELLATION_CLEANUP", "PAUSE_EXPIRATIONS",
        "REPOSSESSOR", "TRIGGERS", "EVENT_PERSISTER")
} | {"PREFECT_SERVER_EVENTS_STREAM_OUT_ENABLED": "false"}
PERSISTER_SETTING = "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_ENABLED"


#: What routes a Prefect server's events, event cache, causal ordering, concurrency leases
#: and background-work queue (Docket) through Redis, by ``prefect-redis`` (Prefect's guide
#: "How to scale self-hosted Prefect"): what lets several API processes and a services
#: process apart from them work as one server. The Redis URL goes with them (`redis_settings`).
REDIS_MODULES = {
    "PREFECT_MESSAGING_BROKER": "prefect_redis.messaging",
    "PREFECT_MESSAGING_CACHE": "prefect_redis.messaging",
    "PREFECT_SERVER_EVENTS_CAUSAL_ORDERING": "prefect_redis.ordering",
    "PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE": "prefect_redis.lease_storage",
}


def redis_settings(url: str) -> dict[str, str]:
    """The server settings for Redis at ``url`` (messaging and Docket on the same database:
    managed Redis services often have database 0 only; Docket's keys have a prefix)."""
    return {**REDIS_MODULES, "PREFECT_REDIS_MESSAGING_URL": url, "PREFECT_SERVER_DOCKET_URL": url}


#: The settings that make a server `server up` starts ask who you are (Prefect's names, set
#: under both where Prefect reads two): its API's auth string (every request but ``GET
#: /health`` and ``/ready``, websockets too, answered 401 without it), CSRF tokens on every
#: request that changes state (Prefect's default: off), and cross-origin requests from the
#: UI's own origins only (Prefect's default: any, ``*``).
def server_auth_settings(auth_string: str, origins: list[str]) -> dict[str, str]:
    """The server side: ``auth_string`` asked of every client, ``origins`` the only ones
    a browser may call the API from."""
    allowed = ",".join(origins)
    return {"PREFECT_SERVER_API_AUTH_STRING": auth_string,
            "PREFECT_SERVER_API_CSRF_PROTECTION_ENABLED": "true",
            "PREFECT_SERVER_CSRF_PROTECTION_ENABLED": "true",
            "PREFECT_SERVER_API_CORS_ALLOWED_ORIGINS": allowed,
            "PREFECT_SERVER_CORS_ALLOWED_ORIGINS": allowed}


def client_auth_settings(auth_string: str) -> dict[str, str]:
    """The client side (a worker, ``prefect deploy``, a shell's `server env`): the auth
    string sent with every request, and the CSRF token fetched before each change."""
    return {"PREFECT_API_AUTH_STRING": auth_string, "PREFECT_CLIENT_CSRF_SUPPORT_ENABLED": "true"}


#: CPU priority of the servers this package starts (Unix ``nice``). Recording a call costs
#: a server ~3.5 ms of CPU, several times what the call costs the experiment: on a shared
#: machine, at equal priority, it slows the rows it records (0.73 of a plain loop at C=16
#: against 0.89 niced; see bench/README.md). Niced, it records in the CPU the rows leave idle.
SERVER_NICE = 10


#: The recorder's patience, in seconds: how long a Prefect API that answers nothing at all
#: is tried before the experiment's flow run is given up (a restarting server needs a
#: while; a wrong PREFECT_API_URL must not hold a process at exit for minutes), and how
#: long calls sent may go unrecorded before they are sent again (a server restarted at
#: the end of a run lost them, and nothing sent later shows the gap).
UNANSWERED_ENV = "PATRONUS_TASKS_RECORDER_UNANSWERED_SECONDS"
STALL_ENV = "PATRONUS_TASKS_RECORDER_STALL_SECONDS"
UNANSWERED_SECONDS, STALL_SECONDS = 30.0, 15.0


def unanswered_seconds() -> float:
    """``$PATRONUS_TASKS_RECORDER_UNANSWERED_SECONDS``, else 30."""
    return _seconds(UNANSWERED_ENV, UNANSWERED_SECONDS)


def stall_seconds() -> float:
    """``$PATRONUS_TASKS_RECORDER_STALL_SECONDS``, else 15."""
    return _seconds(STALL_ENV, STALL_SECONDS)


#: How long a task runner's workers have to load the experiment's steps (a probe run before
#: any row): past it, the experiment stops saying no worker answered (they died loading
#: it, or none is connected) rather than wait for ever.
PROBE_ENV, PROBE_SECONDS = "PATRONUS_TASKS_WORKER_PROBE_SECONDS", 60.0


def probe_seconds() -> float:
    """``$PATRONUS_TASKS_WORKER_PROBE_SECONDS``, else 60."""
    return _seconds(PROBE_ENV, PROBE_SECONDS)
