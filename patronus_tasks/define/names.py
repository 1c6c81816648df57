"""Names on disk and in Prefect: an experiment's folder name, a run's tag. Light (no
pyarrow): the recorder process and the UI's links use them too."""

from __future__ import annotations

import hashlib
import re

#: The longest folder name made from a name (file systems take 255 bytes; room is left
#: for a later run's ``-N``).
LONGEST = 120
#: Hex digits of a name's SHA-256 after a folder name that is not the name itself.
_DIGITS = 8


def cleaned(name: str) -> str:
    """``name`` with every run of characters a file system or a URL treats apart as ``_``,
    no leading or trailing dots. Lossy (``nightly a`` and ``nightly/a`` are both
    ``nightly_a``): what folders were named by before names were made unique, and the
    cache's step folders (its keys hold the step's own name, so steps alike share none)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._")[:LONGEST] or "unnamed"


def safe_name(name: str) -> str:
    """The folder of ``name``, one of its own: a name that is safe already (letters, digits,
    ``.``, ``_``, ``-``; no leading dot; at most `LONGEST` characters) as it is; any other
    `cleaned`, then ``-`` and the first 8 hex digits of the name's SHA-256
    (``nightly/a`` -> ``nightly_a-c70714a3``), so two names never share a folder because
    they clean alike (a resume of one reused the other's rows)."""
    if cleaned(name) == name:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:_DIGITS]
    return f"{cleaned(name)[:LONGEST - _DIGITS - 1]}-{digest}"


def run_tag(folder: str, experiment: str) -> str | None:
    """The Prefect tag of a run in a folder not named after its experiment (``try-1-2``,
    a second run of ``try-1``): ``run:try-1-2``, so that lists of one run's task runs
    (its findings, its errors) are not also the other run's. None for the first run (in
    a folder named by today's rule, or by the one before: `cleaned`)."""
    return None if folder in (safe_name(experiment), cleaned(experiment)) else f"run:{folder}"
