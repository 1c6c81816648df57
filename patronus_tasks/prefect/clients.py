"""The clients of the Prefect API this package makes (`get_client`): Prefect's, or in the
recorder process, when its environment gives every client setting, a `lean.LeanClient`
(`use_environment`: Prefect is then never imported there).

Prefect's client makes a new TLS context for each client, loading the CA bundle each time:
~33 ms of CPU, measured here, even for an ``http://`` API. The recorder process made four
or five clients per experiment (its flow run, progress, task runs, post-run), ~0.15 s of
CPU per experiment. The context is made once per setting of Prefect's TLS options
(``PREFECT_API_TLS_INSECURE_SKIP_VERIFY``, ``PREFECT_API_SSL_CERT_FILE``), as Prefect makes it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from patronus_tasks.prefect import client_settings
from patronus_tasks.prefect.client_settings import ClientSettings
from patronus_tasks.prefect.lean import LeanClient, tls_context, warm

if TYPE_CHECKING:
    from patronus_tasks.prefect.internal import ApiClient


class _Mode:
    lean: ClientSettings | None = None  # this process's clients are lean, with these


_MODE = _Mode()


def use_environment(env: Mapping[str, str]) -> bool:
    """Make this process's clients lean when ``env`` gives every client setting (see
    `client_settings.from_env`); True if it does."""
    _MODE.lean = client_settings.from_env(env)
    if _MODE.lean is not None:
        warm(_MODE.lean)
    return _MODE.lean is not None


def get_client() -> ApiClient:
    """A lean client (`use_environment`), else `prefect.get_client`'s, its TLS context
    shared (see the module's docstring)."""
    if _MODE.lean is not None:
        return LeanClient(_MODE.lean)
    from prefect.client.orchestration import get_client as prefect_client
    from prefect.settings import PREFECT_API_SSL_CERT_FILE, PREFECT_API_TLS_INSECURE_SKIP_VERIFY

    tls = tls_context(bool(PREFECT_API_TLS_INSECURE_SKIP_VERIFY.value()), PREFECT_API_SSL_CERT_FILE.value())
    return prefect_client(httpx_settings={"verify": tls})


@contextlib.asynccontextmanager
async def without_retries() -> AsyncIterator[ApiClient]:
    """A client that sends each request once, for a user that retries (and waits out a
    ``Retry-After``) itself: the client's back-off would hold every request to a server
    that is down for a minute."""
    if _MODE.lean is not None:
        async with LeanClient(_MODE.lean, max_retries=0) as client:
            yield client
        return
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    with temporary_settings({PREFECT_CLIENT_MAX_RETRIES: 0}):
        async with get_client() as client:
            yield client


def api_url() -> str | None:
    """The API's URL the clients use (None: Prefect's built-in server, not started yet)."""
    if _MODE.lean is not None:
        return _MODE.lean.api_url
    from prefect.settings import get_current_settings

    return get_current_settings().api.url


def ui_url() -> str | None:
    """The Prefect UI's URL (``PREFECT_UI_URL``, else inferred from the API's)."""
    if _MODE.lean is not None:
        return _MODE.lean.ui_url
    from prefect.settings import get_current_settings

    return get_current_settings().ui_url


def ui_path() -> str:
    """The UI's path on its host: empty for a self-hosted server, Prefect Cloud's account
    and workspace otherwise."""
    return urlparse(ui_url() or "").path.rstrip("/")


def refused(exc: BaseException) -> bool:
    """Whether ``exc`` is the API's 401: it asks for an auth string this client lacks."""
    return getattr(getattr(exc, "response", None), "status_code", None) == 401


def refused_fix(url: str | None) -> str:
    """What to say when the API at ``url`` answered 401, with the fix (``url`` shown with
    any ``user:password`` in it hidden)."""
    from patronus_tasks.http import redact_url

    shown = redact_url(url) if url else "of Prefect's built-in server"
    return (f"the Prefect API at {shown} asks who you are (401 Unauthorized): set its auth string "
            "in PREFECT_API_AUTH_STRING (a stack of `patronus-tasks server up`: "
            "eval \"$(patronus-tasks server env)\" where it was started), or on Prefect Cloud "
            "PREFECT_API_KEY")
