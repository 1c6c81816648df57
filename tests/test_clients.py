"""Prefect's clients, made by this package: one TLS context per process and setting."""

from __future__ import annotations

import ssl
from typing import Any

import pytest
from prefect.settings import (
    PREFECT_API_SSL_CERT_FILE,
    PREFECT_API_TLS_INSECURE_SKIP_VERIFY,
    PREFECT_API_URL,
    temporary_settings,
)

from patronus_tasks.prefect import clients


def _made(monkeypatch: pytest.MonkeyPatch) -> list[ssl.SSLContext]:
    """The TLS contexts made from now on (`ssl.create_default_context`, called through)."""
    made: list[ssl.SSLContext] = []
    original = ssl.create_default_context

    def spy(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        made.append(original(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(ssl, "create_default_context", spy)
    return made


def test_clients_share_one_tls_context_per_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    # Prefect makes one per client (~33 ms of CPU each): five clients made five.
    made = _made(monkeypatch)
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api",
                             PREFECT_API_SSL_CERT_FILE: ssl.get_default_verify_paths().cafile}):
        for _ in range(5):
            clients.get_client()
    assert len(made) <= 1
    with temporary_settings({PREFECT_API_URL: "https://127.0.0.1:9/api",
                             PREFECT_API_TLS_INSECURE_SKIP_VERIFY: True}):
        clients.get_client()
        clients.get_client()
    assert len(made) <= 2 and made[-1].verify_mode == ssl.CERT_NONE  # as the user said
    assert not made[-1].check_hostname
