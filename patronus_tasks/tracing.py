"""`init` and `traced`, as the Patronus SDK 0.1.x has them at the top of ``patronus``.

`init` is accepted offline: its Patronus settings (API key and URL, project) are used
only by what talks to the Patronus API (remote evaluators, remote datasets), and only
when given; nothing is sent anywhere because it was called. `traced` marks a step inside
a task or an evaluator: each call is logged with its arguments, result or error and
duration, in the log of the Prefect task run it runs in.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from patronus_tasks.http import Endpoint

F = TypeVar("F", bound=Callable[..., Any])
logger = logging.getLogger("patronus_tasks.traced")
#: How much of an argument or a result a log line shows.
SHOWN_CHARS = 300


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


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "..."


def _traced(fn: Callable[..., Any], name: str, log_args: bool, log_results: bool) -> Any:
    signature = inspect.signature(fn)

    def said(args: Any, kwargs: Any) -> str:
        if not log_args:
            return ""
        try:
            bound = signature.bind(*args, **kwargs).arguments
        except TypeError:
            bound = {"args": args, "kwargs": kwargs}
        return " " + ", ".join(f"{k}={_shown(v)}" for k, v in bound.items())

    def done(start: float, args: Any, kwargs: Any, result: Any) -> None:
        out = f" -> {_shown(result)}" if log_results else ""
        logger.info("%s(%s) %.3f s%s", name, said(args, kwargs).strip(),
                    time.perf_counter() - start, out)

    def failed(start: float, exc: BaseException) -> None:
        logger.warning("%s raised %s: %s after %.3f s", name, type(exc).__name__, exc,
                       time.perf_counter() - start)

    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def run(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                result = await fn(*args, **kwargs)
            except BaseException as exc:
                failed(start, exc)
                raise
            done(start, args, kwargs, result)
            return result
        return run

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            failed(start, exc)
            raise
        done(start, args, kwargs, result)
        return result
    return call


@overload
def traced(fn: F, /) -> F: ...
@overload
def traced(*, name: str | None = None, span_name: str | None = None, kind: str = "custom",
           log_args: bool = True, log_results: bool = True, **options: Any) -> Callable[[F], F]: ...
def traced(fn: Callable[..., Any] | None = None, /, *, name: str | None = None,
           span_name: str | None = None, kind: str = "custom", log_args: bool = True,
           log_results: bool = True, **options: Any) -> Any:
    """Mark a step of a task or an evaluator (``@traced`` or ``@traced(name=...)``; the
    SDK's ``span_name=``, ``log_args=``, ``log_results=`` too): each call is logged with
    its arguments, its result (each cut at `SHOWN_CHARS`) or its error, and how long it
    took, in the log of the call's Prefect task run. Sync and async functions."""
    def wrap(f: Callable[..., Any]) -> Any:
        return _traced(f, name or span_name or f.__qualname__, log_args, log_results)

    return wrap(fn) if fn is not None else wrap
