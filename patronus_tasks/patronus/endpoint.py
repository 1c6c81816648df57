"""The Patronus API endpoint: key and URL from arguments or the environment."""

from __future__ import annotations

import os

from patronus_tasks.exceptions import ConfigError
from patronus_tasks.http import Endpoint

API_KEY_ENV, API_URL_ENV, UI_URL_ENV = "PATRONUS_API_KEY", "PATRONUS_API_URL", "PATRONUS_UI_URL"
DEFAULT_API_URL = "https://api.patronus.ai"
DEFAULT_UI_URL = "https://app.patronus.ai"


def patronus_endpoint(api_key: str | None = None, base_url: str | None = None, *,
                      max_attempts: int = 3, max_in_flight: int = 16,
                      timeout: float = 60.0, needed_for: str = "remote evaluators") -> Endpoint:
    """The Patronus API from arguments or ``PATRONUS_API_KEY`` / ``PATRONUS_API_URL``.

    ``needed_for`` names what wanted it, in the error raised without a key.
    """
    key = api_key or os.environ.get(API_KEY_ENV)
    if not key:
        raise ConfigError(
            f"{needed_for} need a Patronus API key: set {API_KEY_ENV} (and "
            f"{API_URL_ENV} for a non-default server). Local evaluators need no key."
        )
    url = base_url or os.environ.get(API_URL_ENV) or DEFAULT_API_URL
    return Endpoint(url, headers={"x-api-key": key}, max_attempts=max_attempts,
                    max_in_flight=max_in_flight, timeout=timeout)


def ui_url() -> str:
    """Where the Patronus web app is: ``PATRONUS_UI_URL``, else app.patronus.ai."""
    return (os.environ.get(UI_URL_ENV) or DEFAULT_UI_URL).rstrip("/")
