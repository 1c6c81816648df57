"""The cache of step calls: a call answered before with exactly the same inputs is not made
again; its stored result is used instead.

An entry's key is the step's kind, name and version (its code's hash unless given), what
else it depends on (`Step.cache_identity`: a model client's model and parameters), the
repeat of the row (with ``repeats=N``, so each repeat is its own sample) and exactly the
arguments it receives, as canonical JSON. Errors are never stored.

The store is a folder or an object-store prefix (`Location`): by default ``.cache`` in
the results directory, so every worker writing results there shares it. Each entry is
one file (one object) written whole: locally to a name of its own, then renamed over the
entry (`os.replace` is atomic), in object storage in one request that stores the object
whole or not at all. So concurrent writers of one entry leave one of their entries, and
a process killed while writing leaves the old entry or none, never part of one (a stray
``.tmp`` file at most, which no reader looks at). An entry that cannot be read back (an
older format, a damaged file) is a miss and is written again.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import logging
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pandas as pd
from pydantic import BaseModel, ValidationError

from patronus_tasks.define.step_results import EvaluationResult, TaskResult
from patronus_tasks.define.steps import Step, Task
from patronus_tasks.exceptions import ConfigError
from patronus_tasks.record.location import Location
from patronus_tasks.trace.spans import SpanData

logger = logging.getLogger("patronus_tasks")
#: The store's folder in the results directory, when none is given.
CACHE_DIR = ".cache"
FORMAT = 1


@dataclass(frozen=True)
class Cache:
    """An experiment's cache of step calls (``cache=`` of `run_experiment`).

    ``store``: a folder or object-store URL (default: ``.cache`` in the results
    directory); ``all_steps``: every step but those with ``cache=False`` (else only those
    with ``cache=True``); ``expire_after``: seconds (or a timedelta) an entry answers for;
    ``refresh``: call every step again and store the new answers.
    """

    store: str | os.PathLike[str] | Location | None = None
    all_steps: bool = True
    expire_after: float | dt.timedelta | None = None
    refresh: bool = False

    @property
    def seconds(self) -> float | None:
        value = self.expire_after
        return value.total_seconds() if isinstance(value, dt.timedelta) else value


def cache_setting(value: Any) -> Cache | None:
    """The experiment's ``cache=`` as a `Cache` (None: no cache at all).

    None (default): only steps with ``cache=True`` are cached; True: every step but those
    with ``cache=False``; a path or URL: every step, in that store; False: none."""
    if value is None:
        return Cache(all_steps=False)
    if value is True:
        return Cache()
    if value is False:
        return None
    if isinstance(value, str | os.PathLike | Location):
        return Cache(store=value)
    if isinstance(value, Cache):
        if value.seconds is not None and value.seconds <= 0:
            raise ConfigError(f"cache expire_after must be > 0 seconds, not {value.expire_after!r}.")
        return value
    raise ConfigError(f"cache must be True, False, None, a folder or URL, or a Cache(...), "
                      f"not {value!r}.")


@dataclass(frozen=True, slots=True)
class Hit:
    """A stored answer (None: the step returned None)."""

    value: TaskResult | EvaluationResult | None
    spans: list[SpanData] | None = None  # what the call recorded when it was made


class Unkeyable(TypeError):
    """An argument with no canonical JSON form: the call is made and not stored."""


def _canonical(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True)
    if hasattr(value, "cache_key"):  # a task's Trace: what its spans recorded
        return value.cache_key()
    if isinstance(value, pd.Series):  # a Row: its values by column
        return {str(k): v for k, v in value.items()}
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, set | frozenset | tuple):
        return sorted(value, key=repr) if isinstance(value, set | frozenset) else list(value)
    raise Unkeyable(type(value).__qualname__)


_JSON = orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def call_key(step: Step, kwargs: dict[str, Any], repeat: int | None) -> str:
    """The entry's key of a call of ``step`` with ``kwargs`` (`Unkeyable` when an argument
    has no canonical form: a key that changed from run to run would never be found)."""
    try:
        material = orjson.dumps({
            "format": FORMAT, "kind": step.kind, "step": step.name, "version": step.code_version,
            "identity": step.cache_identity(), "repeat": repeat, "inputs": kwargs,
        }, default=_canonical, option=_JSON)
    except TypeError as exc:
        raise Unkeyable(str(exc)) from None
    return hashlib.sha256(material).hexdigest()


def _dump(value: TaskResult | EvaluationResult | None) -> Any:
    return None if value is None else value.model_dump(mode="json", by_alias=True)


class CallCache:
    """The cache as the rows use it: which steps it answers, their entries read and written.

    Reads and writes in object storage are requests: they run in a thread, off the rows'
    event loop; local ones are a file each, done in place.
    """

    def __init__(self, location: Location, settings: Cache) -> None:
        self.location, self.settings = location, settings
        self._warned: set[str] = set()

    def wants(self, step: Step) -> bool:
        return step.cache is True or (step.cache is None and self.settings.all_steps)

    def _entry(self, step: Step, key: str) -> Location:
        from patronus_tasks.define.names import cleaned

        # The key holds the step's own name: steps whose names clean alike share a folder,
        # never an entry (and caches made before names were unique keep their entries).
        return self.location / cleaned(step.name) / key[:2] / f"{key}.json"

    def unkeyable(self, step: Step, what: str) -> None:
        self._warn(f"key:{step.name}", f"{step.kind} {step.name!r} gets an argument with no "
                                       f"canonical form ({what}): its calls are made, not cached")

    def _warn(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            logger.warning("cache %s: %s", self.location, message)

    async def get(self, step: Step, key: str) -> Hit | None:
        """The stored answer of this call, if any (and not expired, nor refreshed)."""
        if self.settings.refresh:
            return None
        if self.location.is_local:
            return self._get(step, key)
        return await asyncio.to_thread(self._get, step, key)

    def _get(self, step: Step, key: str) -> Hit | None:
        try:
            data = orjson.loads(self._entry(step, key).read_bytes())
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._warn("read", f"cannot read entries ({type(exc).__name__}: {exc}); calls are made")
            return None
        except orjson.JSONDecodeError:
            data = None
        return self._hit(step, key, data)

    def _hit(self, step: Step, key: str, data: Any) -> Hit | None:
        if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("key") != key:
            self._warn(f"bad:{step.name}", f"an entry of {step.name!r} is unreadable; it is "
                                            "called again and the entry rewritten")
            return None
        expire = self.settings.seconds
        if expire is not None and time.time() - float(data.get("created", 0)) > expire:
            return None
        kind = TaskResult if isinstance(step, Task) else EvaluationResult
        try:
            value = data["value"]
            spans = [SpanData.from_dict(d) for d in data.get("spans") or ()] or None
            return Hit(None if value is None else kind.model_validate(value), spans)
        except (KeyError, TypeError, ValidationError):
            self._warn(f"bad:{step.name}", f"an entry of {step.name!r} does not fit its result "
                                            "type; it is called again and the entry rewritten")
            return None

    async def put(self, step: Step, key: str, value: TaskResult | EvaluationResult | None,
                  spans: list[SpanData] | None = None) -> None:
        """Store the answer of this call and its spans (whole: see the module's note)."""
        data = orjson.dumps({"format": FORMAT, "key": key, "kind": step.kind, "step": step.name,
                             "created": time.time(), "value": _dump(value),
                             "spans": [s.to_dict() for s in spans or ()]}, default=str,
                            option=orjson.OPT_NON_STR_KEYS)
        try:
            if self.location.is_local:
                self._put_local(self._entry(step, key), data)
            else:
                await asyncio.to_thread(self._entry(step, key).write_bytes, data)
        except OSError as exc:
            self._warn("write", f"cannot write entries ({type(exc).__name__}: {exc}); "
                                "results are kept, only not cached")

    @staticmethod
    def _put_local(entry: Location, data: bytes) -> None:
        path = entry.local
        assert path is not None
        path.parent.mkdir(parents=True, exist_ok=True)
        # A name of its own per writer: two writers of one entry never share a file.
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        try:
            tmp.write_bytes(data)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)


def open_cache(settings: Cache | None, results_root: Location) -> CallCache | None:
    """The experiment's cache: in ``settings.store``, else ``.cache`` in the results root."""
    if settings is None:
        return None
    store = settings.store
    location = Location.of(store) if store is not None else results_root / CACHE_DIR
    if location.is_local:
        assert location.local is not None
        location = Location(Path(location.local).resolve())
    return CallCache(location, settings)
