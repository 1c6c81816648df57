"""Who may drive the stack's API: the auth string it asks of every client, and the host it
listens on.

Prefect's server, as ``prefect server start`` runs it, answers anyone who reaches its
port: one unauthenticated ``POST /deployments/`` with a ``command`` job variable and a
``create_flow_run`` made the stack's process worker run a shell command as the user who
started it. So `server up` always starts it with Prefect's API auth string (a random
secret, made at the first start and kept in ``<home>/auth-string``, readable by its owner
only), CSRF protection on and cross-origin calls from the UI's own origins only, and checks
that an unauthenticated request is refused before it says the stack is up.

There is no switch to turn it off, on loopback either: there any local user, and any web
page open in a browser on the machine (DNS rebinding: the page's own name made to point at
127.0.0.1, so that the browser treats the API as the page's origin, CORS and CSRF tokens
included), could drive the worker just the same. What auth costs is one ``eval "$(
patronus-tasks server env)"`` in a shell and one login in the UI.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import stat
from pathlib import Path

import httpx

from patronus_tasks.exceptions import ConfigError

AUTH_FILE = "auth-string"
LOOPBACK = "127.0.0.1"
#: Hosts that mean every interface: clients on this machine reach them on `LOOPBACK`.
_EVERYWHERE = ("0.0.0.0", "::", "")


def auth_string(home: Path) -> str:
    """The stack's auth string: read from ``home``, or made there (random, mode 0600)."""
    path = home / AUTH_FILE
    try:
        made = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(made, "w") as out:
            out.write(secrets.token_urlsafe(32))  # 256 bits; no ':' nor quoting in a shell
    found = read(home)
    assert found is not None
    return found


def read(home: Path) -> str | None:
    """The auth string kept in ``home`` (None: none made, a stack started before there
    was one); a `ConfigError` when others may have read it."""
    path = home / AUTH_FILE
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"{path} holds the stack's API auth string, and others on this machine may read "
            f"it (mode {stat.filemode(mode)}): whoever has it drives the API and its worker. "
            "Remove the file, then `patronus-tasks server down` and `server up`: a new one "
            "is made, readable by you only")
    found = path.read_text().strip()
    if not found:
        raise ConfigError(f"{path} is empty: remove it, then `patronus-tasks server down` and "
                          "`server up` make a new auth string")
    return found


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def reached_at(host: str) -> str:
    """Where clients on this machine reach a server listening on ``host`` (for a URL)."""
    if host in _EVERYWHERE:
        return LOOPBACK
    return f"[{host}]" if ":" in host else host


def ui_origins(host: str, port: int) -> list[str]:
    """The origins the UI is opened from: this machine's names, and ``host`` when it is
    one address (a UI behind a proxy calls ``/api`` on its own origin: no CORS needed)."""
    origins = [f"http://{LOOPBACK}:{port}", f"http://localhost:{port}"]
    own = f"http://{reached_at(host)}:{port}"
    return origins if own in origins else [*origins, own]


def ui_api_url(host: str, api_url: str) -> str:
    """Where the UI calls the API: on loopback the API's URL (Prefect would derive it from
    its default port, not ``--port``); on other hosts ``/api`` of whatever origin the
    browser opened it from (an address of the host, or a TLS proxy in front)."""
    return api_url if is_loopback(host) else "/api"


def require_asking(api_url: str) -> None:
    """A `ConfigError` unless the API answers a request without the auth string with 401
    (checked once it is up: a Prefect that renamed a setting must not serve it open)."""
    try:
        code = httpx.get(f"{api_url}/admin/version", timeout=10).status_code
    except httpx.HTTPError as exc:
        raise ConfigError(f"could not check that the API at {api_url} asks who you are: "
                          f"{type(exc).__name__}") from None
    if code != 401:
        raise ConfigError(
            f"the API at {api_url} answered a request without its auth string ({code}, not "
            "401): Prefect did not take PREFECT_SERVER_API_AUTH_STRING, so the stack is "
            "stopped rather than left open (is the installed Prefect one this package "
            "supports?)")
