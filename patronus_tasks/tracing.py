"""`init` and `traced`, as the Patronus SDK 0.1.x has them at the top of ``patronus``.

`init` is accepted offline: its Patronus settings (API key and URL, project) are used
only by what talks to the Patronus API (remote evaluators, remote datasets), and only
when given; nothing is sent anywhere because it was called. `traced` marks a step inside
a task or an evaluator: each call is a span (`patronus_tasks.trace`), recorded with the
call's results, shown in Prefect as a task run nested under the call's, and exported to
OpenTelemetry when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from patronus_tasks.http import Endpoint
from patronus_tasks.trace import traced

__all__ = ["InitSettings", "default_project", "init", "settings", "traced"]


@dataclass(frozen=True)
class InitSettings:
    """What `init` was given (None: not given; the environment's then)."""

    project_name: str | None = None
    app: str | None = None
    api_key: str | None = None
    api_url: str | None = None


_SETTINGS: InitSettings | None = None


def init(project_name: str | None = None, app: str | None = None, api_url: str | None = None,
         otel_endpoint: str | None = None, otel_exporter_otlp_protocol: str | None = None,
         api_key: str | None = None, service: str | None = None, **options: Any) -> None:
    """Accept the Patronus SDK's ``init(...)``: its API key and URL serve the remote
    evaluators and datasets (over ``PATRONUS_API_KEY`` / ``PATRONUS_API_URL``); its
    project is the experiments' default. The OpenTelemetry and prompt options are
    accepted and unused (no collector is needed: experiments run offline). A second
    call is ignored, with a warning, as in the SDK."""
    global _SETTINGS
    if _SETTINGS is not None:
        import warnings

        warnings.warn("init() was called already: this call is ignored", UserWarning, stacklevel=2)
        return
    _SETTINGS = InitSettings(project_name=project_name, app=app, api_key=api_key, api_url=api_url)


def settings() -> InitSettings:
    """What `init` was given (all None when it was not called)."""
    return _SETTINGS or InitSettings()


def default_project() -> str:
    """The project of an experiment given none: `init`'s, ``PATRONUS_PROJECT_NAME``, or
    ``Global`` (the SDK's default)."""
    return settings().project_name or os.environ.get("PATRONUS_PROJECT_NAME") or "Global"


def patronus_endpoint_of_init(max_attempts: int = 3, api_key: str | None = None,
                              api_url: str | None = None) -> Endpoint:
    """The Patronus API: ``api_key`` / ``api_url`` where given, else `init`'s, else the
    environment's."""
    from patronus_tasks.patronus import patronus_endpoint

    given = settings()
    return patronus_endpoint(api_key or given.api_key, api_url or given.api_url,
                             max_attempts=max_attempts)
