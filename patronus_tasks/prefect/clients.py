"""Prefect's client (`get_client`), made with this process's one TLS context.

Prefect's client makes a new TLS context for each client, loading the CA bundle each time:
~33 ms of CPU, measured here, even for an ``http://`` API. The recorder process made four
or five clients per experiment (its flow run, progress, task runs, post-run), ~0.15 s of
CPU per experiment. The context is made once per setting of Prefect's TLS options
(``PREFECT_API_TLS_INSECURE_SKIP_VERIFY``, ``PREFECT_API_SSL_CERT_FILE``), as Prefect makes it.
"""

from __future__ import annotations

import functools
import ssl
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prefect.client.orchestration import PrefectClient


def get_client() -> PrefectClient:
    """`prefect.get_client`, its TLS context shared (see the module's docstring)."""
    from prefect.client.orchestration import get_client as prefect_client
    from prefect.settings import PREFECT_API_SSL_CERT_FILE, PREFECT_API_TLS_INSECURE_SKIP_VERIFY

    tls = _tls(bool(PREFECT_API_TLS_INSECURE_SKIP_VERIFY.value()), PREFECT_API_SSL_CERT_FILE.value())
    return prefect_client(httpx_settings={"verify": tls})


@functools.cache
def _tls(insecure: bool, cert_file: str | None) -> ssl.SSLContext:
    if insecure:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    import certifi

    return ssl.create_default_context(cafile=cert_file or certifi.where())


def refused(exc: BaseException) -> bool:
    """Whether ``exc`` is the API's 401: it asks for an auth string this client lacks."""
    return getattr(getattr(exc, "response", None), "status_code", None) == 401


def refused_fix(url: str | None) -> str:
    """What to say when the API at ``url`` answered 401, with the fix."""
    return (f"the Prefect API at {url} asks who you are (401 Unauthorized): set its auth string "
            "in PREFECT_API_AUTH_STRING (a stack of `patronus-tasks server up`: "
            "eval \"$(patronus-tasks server env)\" where it was started), or on Prefect Cloud "
            "PREFECT_API_KEY")
