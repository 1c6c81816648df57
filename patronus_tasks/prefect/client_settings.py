"""What a client of the Prefect API needs to know (`ClientSettings`): read from the
environment alone when nothing else can say otherwise (`from_env`); else the recorder
uses Prefect's own client, which reads Prefect's settings.

The recorder process is started with the experiment process's environment. Importing
Prefect to read its settings took ~1.0 s of CPU there (`prefect.context`, the settings'
models, the client's schemas), before its first request: on a 10-row script, the whole
wait between `run_experiment` returning and the first task run posted. Prefect reads a
setting from, highest first: the environment, ``.env``, ``prefect.toml`` and
``pyproject.toml``'s ``[tool.prefect]`` in the working directory, then the active profile.
So the environment decides alone when the API's URL is in it and none of those files
could set a setting the client reads that the environment does not set; any other case,
or a value Prefect would refuse, is left to Prefect's own reading.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

#: The settings a client reads (Prefect's names; `ClientSettings` holds them).
CLIENT_SETTINGS = frozenset({
    "PREFECT_API_URL", "PREFECT_API_AUTH_STRING", "PREFECT_API_KEY",
    "PREFECT_API_TLS_INSECURE_SKIP_VERIFY", "PREFECT_API_SSL_CERT_FILE",
    "PREFECT_API_ENABLE_HTTP2", "PREFECT_API_REQUEST_TIMEOUT", "PREFECT_CLIENT_MAX_RETRIES",
    "PREFECT_CLIENT_RETRY_JITTER_FACTOR", "PREFECT_CLIENT_RETRY_EXTRA_CODES",
    "PREFECT_CLIENT_CSRF_SUPPORT_ENABLED", "PREFECT_CLIENT_CUSTOM_HEADERS",
    "PREFECT_CLOUD_API_URL", "PREFECT_CLOUD_UI_URL", "PREFECT_UI_URL"})
#: Settings that change how Prefect reads the others (test modes skip the profile; a
#: profiles path may be set in the files): left to Prefect when set.
_LEFT_TO_PREFECT = ("PREFECT_TEST_MODE", "PREFECT_TESTING_TEST_MODE",
                    "PREFECT_TESTING_UNIT_TEST_MODE")
CLOUD_API_URL = "https://api.prefect.cloud/api"
_TRUE = {"1", "true", "t", "yes", "y", "on"}
_FALSE = {"0", "false", "f", "no", "n", "off"}


@dataclass(frozen=True)
class ClientSettings:
    """A client's settings, as Prefect's `PrefectClient` reads them (its defaults here)."""

    api_url: str
    # Secrets, and headers that may hold one, are left out of the repr: a settings object
    # in a traceback, a log line or a test's failure diff never shows them.
    auth_string: str | None = field(default=None, repr=False)
    api_key: str | None = field(default=None, repr=False)
    tls_insecure: bool = False
    cert_file: str | None = None
    http2: bool = False
    timeout: float = 60.0
    max_retries: int = 5
    jitter: float = 0.2
    extra_codes: frozenset[int] = frozenset()
    csrf: bool = True
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    cloud_api_url: str = CLOUD_API_URL
    ui_url: str | None = None

    @property
    def cloud(self) -> bool:
        return self.api_url.startswith(self.cloud_api_url)


def from_env(env: Mapping[str, str], cwd: Path | None = None) -> ClientSettings | None:
    """The settings the environment ``env`` gives, when it decides them alone (see the
    module's docstring); None when Prefect must read them."""
    said = {k.upper(): v for k, v in env.items() if k.upper().startswith("PREFECT_")}
    if not said.get("PREFECT_API_URL") or any(k in said for k in _LEFT_TO_PREFECT):
        return None
    if _files_may_set(said, cwd or Path.cwd()):
        return None
    try:
        return _parsed(said, env)
    except ValueError:  # Prefect says what is wrong with it
        return None


def _files_may_set(said: Mapping[str, str], cwd: Path) -> bool:
    """Whether a settings file could set a client setting the environment leaves unset:
    ``.env`` naming any Prefect setting, ``prefect.toml``, ``[tool.prefect]``, the active
    profile (its keys are Prefect's names)."""
    dotenv = cwd / ".env"
    if dotenv.is_file() and "PREFECT_" in _text(dotenv).upper():
        return True
    if (cwd / "prefect.toml").exists():
        return True
    pyproject = cwd / "pyproject.toml"
    if pyproject.is_file() and re.search(r"^\s*\[\s*tool\.prefect\b", _text(pyproject), re.M):
        return True
    try:
        profile = _active_profile(said)
    except (OSError, ValueError):
        return True
    return any(k.upper() in CLIENT_SETTINGS and k.upper() not in said for k in profile)


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return "PREFECT_"  # unreadable here: Prefect decides


def _active_profile(said: Mapping[str, str]) -> dict[str, object]:
    """The active profile's settings (Prefect's own default profile sets no client one)."""
    home = Path(said.get("PREFECT_HOME") or "~/.prefect").expanduser()
    path = Path(said.get("PREFECT_PROFILES_PATH") or home / "profiles.toml").expanduser()
    if not path.exists():
        return {}
    data = tomllib.loads(path.read_text())
    profiles = data.get("profiles", {})
    name = said.get("PREFECT_PROFILE") or data.get("active")
    profile = profiles.get(name, {}) if isinstance(profiles, dict) else {}
    return profile if isinstance(profile, dict) else {}


def _parsed(said: Mapping[str, str], env: Mapping[str, str]) -> ClientSettings:
    url = said["PREFECT_API_URL"]
    cloud_api = said.get("PREFECT_CLOUD_API_URL") or CLOUD_API_URL
    return ClientSettings(
        api_url=url, auth_string=said.get("PREFECT_API_AUTH_STRING") or None,
        api_key=said.get("PREFECT_API_KEY") or None,
        tls_insecure=_flag(said, "PREFECT_API_TLS_INSECURE_SKIP_VERIFY", False),
        cert_file=said.get("PREFECT_API_SSL_CERT_FILE") or env.get("SSL_CERT_FILE") or None,
        http2=_flag(said, "PREFECT_API_ENABLE_HTTP2", False),
        timeout=_number(said, "PREFECT_API_REQUEST_TIMEOUT", 60.0),
        max_retries=int(_number(said, "PREFECT_CLIENT_MAX_RETRIES", 5, whole=True)),
        jitter=_number(said, "PREFECT_CLIENT_RETRY_JITTER_FACTOR", 0.2),
        extra_codes=_codes(said.get("PREFECT_CLIENT_RETRY_EXTRA_CODES", "")),
        csrf=_flag(said, "PREFECT_CLIENT_CSRF_SUPPORT_ENABLED", True),
        headers=_headers(said.get("PREFECT_CLIENT_CUSTOM_HEADERS", "")),
        cloud_api_url=cloud_api,
        ui_url=said.get("PREFECT_UI_URL") or default_ui_url(
            url, cloud_api, said.get("PREFECT_CLOUD_UI_URL")))


def _flag(said: Mapping[str, str], name: str, default: bool) -> bool:
    text = said.get(name, "").strip().lower()
    if not text:
        return default
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ValueError(name)


def _number(said: Mapping[str, str], name: str, default: float, whole: bool = False) -> float:
    text = said.get(name, "").strip()
    if not text:
        return default
    value = float(text)
    if value < 0 or value != value or (whole and value != int(value)):
        raise ValueError(name)
    return value


def _codes(text: str) -> frozenset[int]:
    text = text.strip()
    if not text:
        return frozenset()
    parts = json.loads(text) if text.startswith("[") else text.split(",")
    codes = frozenset(int(str(p).strip()) for p in parts)
    if any(not 100 <= c <= 599 for c in codes):
        raise ValueError("PREFECT_CLIENT_RETRY_EXTRA_CODES")
    return codes


def _headers(text: str) -> dict[str, str]:
    if not text.strip():
        return {}
    found = json.loads(text)
    if not isinstance(found, dict):
        raise ValueError("PREFECT_CLIENT_CUSTOM_HEADERS")
    return {str(k): str(v) for k, v in found.items()}


def default_ui_url(api_url: str, cloud_api_url: str, cloud_ui_url: str | None) -> str:
    """The UI's URL from the API's, as Prefect infers it when ``PREFECT_UI_URL`` is unset."""
    if cloud_ui_url is None:  # Prefect's `default_cloud_ui_url`
        cloud_ui_url = cloud_api_url
        if re.match(r"^https://api[\.\w]*.prefect.[^\.]+/", cloud_ui_url):
            cloud_ui_url = cloud_ui_url.replace("https://api", "https://app", 1)
        cloud_ui_url = cloud_ui_url.removesuffix("/api")
    ui = api_url
    if api_url.startswith(cloud_api_url) and cloud_ui_url:
        ui = ui.replace(cloud_api_url, cloud_ui_url)
    ui = ui.removesuffix("/api").replace("/api/", "/")
    return ui.replace("/accounts/", "/account/").replace("/workspaces/", "/workspace/")
