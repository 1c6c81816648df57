"""Tasks and evaluators: the user code an experiment calls, in function and class form.

A *step* is one callable with a name, its injectable parameters and its run options
(retries, timeout). `Task` and `Evaluator` are steps; ``@task`` and ``@evaluator`` wrap
a function into one, and subclasses implement ``execute`` or ``evaluate``.
"""

from __future__ import annotations

import hashlib
import inspect
import math
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any, ClassVar, TypeVar, overload

from patronus_tasks.define.inline import InlinePolicy
from patronus_tasks.define.params import EVALUATOR_PARAMS, TASK_PARAMS, Signature, inspect_params
from patronus_tasks.exceptions import ConfigError

F = TypeVar("F", bound=Callable[..., Any])


class Step:
    """What tasks and evaluators share: a name, a signature and run options."""

    kind: ClassVar[str] = "step"
    allowed: ClassVar[tuple[str, ...]] = ()
    method: ClassVar[str] = ""

    name: str
    retries: int = 0
    retry_delay_seconds: float = 0.0
    timeout_seconds: float | None = None
    #: Sync code only: True runs calls in the event loop's thread, False in a thread,
    #: None measures and decides (see `inline`).
    inline: bool | None = None
    #: Whether its calls go through the experiment's cache: True, False, or None (as the
    #: experiment's ``cache=`` says for every step).
    cache: bool | None = None
    #: What the cache keys its answers by besides its inputs; None: a hash of its code.
    version: str | None = None
    #: A judge: a call that timed out gave no verdict (unscored, as its `JudgeError`s),
    #: rather than a failed one.
    is_judge: ClassVar[bool] = False

    def _setup(self, name: str | None, retries: int | None, retry_delay_seconds: float | None,
               timeout_seconds: float | None, inline: bool | None = None,
               cache: bool | None = None, version: str | None = None) -> None:
        # None: the class's own (``retries = 2`` on a subclass, as ``inline`` and ``cache``).
        cls = type(self)
        retries = cls.retries if retries is None else retries
        retry_delay_seconds = cls.retry_delay_seconds if retry_delay_seconds is None \
            else retry_delay_seconds
        timeout_seconds = cls.timeout_seconds if timeout_seconds is None else timeout_seconds
        if retries < 0 or retry_delay_seconds < 0:
            raise ConfigError(f"{self.kind} {name!r}: retries and retry_delay_seconds must be >= 0")
        if timeout_seconds is not None and timeout_seconds <= 0:
            raise ConfigError(f"{self.kind} {name!r}: timeout_seconds must be > 0 or None")
        inline = inline if inline is not None else type(self).inline
        if inline and timeout_seconds is not None:
            raise ConfigError(f"{self.kind} {name!r}: inline=True cannot have a timeout_seconds "
                              "(a call in the event loop cannot be interrupted); drop one of them.")
        self.name = name or type(self).__name__
        self.retries = retries
        self.retry_delay_seconds = retry_delay_seconds
        self.timeout_seconds = timeout_seconds
        self.inline = inline if inline is not None else type(self).inline
        if cache is not None and not isinstance(cache, bool):
            raise ConfigError(f"{self.kind} {self.name!r}: cache must be True, False or None "
                              f"(as the experiment says), not {cache!r}.")
        self.cache = cache if cache is not None else type(self).cache
        self.version = version if version is not None else type(self).version

    @property
    def fn(self) -> Callable[..., Any]:
        """The callable that does the work."""
        found = getattr(self, self.method, None)
        if found is None:
            raise ConfigError(f"{type(self).__name__} must implement {self.method}()")
        return found  # type: ignore[no-any-return,unused-ignore]

    @property
    def signature(self) -> Signature:
        sig: Signature | None = self.__dict__.get("_signature")
        if sig is None:
            sig = inspect_params(self.fn, self.allowed, f"{self.kind} {self.name!r}")
            self.__dict__["_signature"] = sig
        return sig

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    @property
    def inline_policy(self) -> InlinePolicy:
        """Where this sync step's calls run (kept per step: it learns from its calls)."""
        policy: InlinePolicy | None = self.__dict__.get("_inline_policy")
        if policy is None:
            policy = InlinePolicy(self.name, self.inline, self.timeout_seconds is not None)
            self.__dict__["_inline_policy"] = policy
        return policy

    @property
    def code_version(self) -> str:
        """The cache's version of this step: ``version``, else a hash of its code (an
        edited step is not answered from entries its old code made)."""
        if self.version is not None:
            return self.version
        found: str | None = self.__dict__.get("_code_version")
        if found is None:
            found = self.__dict__["_code_version"] = source_hash(self.fn, type(self).__qualname__)
        return found

    def cache_identity(self) -> dict[str, Any]:
        """What else its answers depend on, for the cache's key: a model client's model
        and parameters (this package's clients say theirs)."""
        return {}

    async def setup(self) -> None:
        """Called once before an experiment's first row (look-ups, connections)."""

    async def aclose(self) -> None:
        """Called once after an experiment's last row, in the same event loop as `setup`."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Check a class form's parameters when the class is defined, like a decorator does.
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            cls.name = cls.__name__  # a subclass that skips super().__init__ still has one
        method = cls.__dict__.get(cls.method) if cls.method else None
        if method is not None:
            inspect_params(_unbound(method), cls.allowed, f"{cls.kind} {cls.__name__!r}")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


def _unbound(method: Callable[..., Any]) -> Callable[..., Any]:
    """The method's signature without ``self``."""
    sig = inspect.signature(method)
    params = list(sig.parameters.values())[1:]

    def probe() -> None: ...

    probe.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    return probe


class Task(Step):
    """A task: turns a row into the output under evaluation.

    Subclass and implement ``execute`` (sync or ``async``), asking for any of
    ``row``, ``parent``, ``tags`` and the ``evaluated_model_*`` fields by name.
    It returns a ``str``, a `TaskResult`, or ``None`` to stop this row's chain.
    """

    kind = "task"
    allowed = TASK_PARAMS
    method = "execute"

    def __init__(self, name: str | None = None, *, retries: int | None = None,
                 retry_delay_seconds: float | None = None, timeout_seconds: float | None = None,
                 inline: bool | None = None, cache: bool | None = None,
                 version: str | None = None) -> None:
        self._setup(name, retries, retry_delay_seconds, timeout_seconds, inline, cache, version)
        _ = self.signature


class Evaluator(Step):
    """An evaluator: judges one row (and its task result) and returns a verdict.

    Subclass and implement ``evaluate`` (sync or ``async``), asking for the task's
    parameters plus ``task_result`` by name. It returns ``bool``, a number, ``str``,
    an `EvaluationResult`, or ``None`` (skipped).
    """

    kind = "evaluator"
    allowed = EVALUATOR_PARAMS
    method = "evaluate"
    criteria: str | None = None
    #: Its share in a row's weighted score (the Patronus SDK 0.1.x's ``weight=``): None,
    #: not in it.
    weight: float | None = None
    #: The labels a person may give its rows in a review (a judge's: pass/fail, 1 to N,
    #: its choices); None: pass/fail when it gives verdicts.
    scale: list[str] | None = None

    def __init__(self, name: str | None = None, *, criteria: str | None = None,
                 retries: int | None = None, retry_delay_seconds: float | None = None,
                 timeout_seconds: float | None = None,
                 inline: bool | None = None, cache: bool | None = None,
                 version: str | None = None, weight: float | str | None = None) -> None:
        self._setup(name, retries, retry_delay_seconds, timeout_seconds, inline, cache, version)
        self.criteria = criteria if criteria is not None else type(self).criteria
        self.weight = check_weight(weight, self.name) if weight is not None else type(self).weight
        _ = self.signature


def source_hash(code: Any, fallback: str) -> str:
    """A short hash of ``code``'s source (a function or class), else of its name or
    ``fallback`` (no source: a REPL, a C function): a cache version of it."""
    try:
        text = inspect.getsource(code)
    except (OSError, TypeError):
        text = getattr(code, "__qualname__", fallback)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def check_weight(weight: float | str | Any, name: str) -> float:
    """A weight as a number >= 0 (a str such as ``"0.3"`` is read as one); else a
    `ConfigError` naming the evaluator."""
    try:
        value = float(Decimal(str(weight)))
    except (InvalidOperation, ValueError):
        value = -1.0
    if isinstance(weight, bool) or not (value >= 0 and math.isfinite(value)):
        raise ConfigError(f"evaluator {name!r}: weight must be a number >= 0 (or its text, "
                          f"e.g. '0.3'), not {weight!r}.")
    return value


class _FunctionStep:
    """Mixin for steps made by a decorator: the wrapped function does the work."""

    _function: Callable[..., Any]

    @property
    def fn(self) -> Callable[..., Any]:
        return self._function

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the wrapped function directly, as if undecorated."""
        return self._function(*args, **kwargs)

    def __reduce__(self) -> Any:
        # The decorated name in its module is this step: pickle by value of its parts,
        # so steps travel to other processes (Dask workers) with cloudpickle.
        return (_rebuild, (type(self), self.__dict__.copy()))


def _rebuild(cls: type, state: dict[str, Any]) -> Any:
    obj: Any = object.__new__(cls)
    obj.__dict__.update(state)
    return obj


class FunctionTask(_FunctionStep, Task):
    """A task made by ``@task`` from a function."""

    def __init__(self, fn: Callable[..., Any], **options: Any) -> None:
        self._function = fn
        options.setdefault("name", None)
        options["name"] = options["name"] or fn.__name__
        super().__init__(**options)


class FunctionEvaluator(_FunctionStep, Evaluator):
    """An evaluator made by ``@evaluator`` from a function."""

    def __init__(self, fn: Callable[..., Any], **options: Any) -> None:
        self._function = fn
        options["name"] = options.get("name") or fn.__name__
        super().__init__(**options)


@overload
def task(fn: F, /) -> FunctionTask: ...
@overload
def task(*, name: str | None = None, retries: int = 0, retry_delay_seconds: float = 0.0,
         timeout_seconds: float | None = None, inline: bool | None = None,
         cache: bool | None = None, version: str | None = None) -> Callable[[F], FunctionTask]: ...
def task(fn: Callable[..., Any] | None = None, /,
         **options: Any) -> FunctionTask | Callable[[F], FunctionTask]:
    """Make a function a `Task`: ``@task`` or ``@task(name=..., retries=..., timeout_seconds=...)``.

    ``inline`` (sync functions only): True runs calls in the event loop's thread, False
    in a thread; None (default) moves a step whose calls all take under 1 ms inline.
    ``cache=True`` answers a call from the experiment's cache when the same step
    (``version``: default a hash of its code) got exactly the same inputs before;
    ``cache=False`` never; None (default) as the experiment's ``cache=`` says.
    """
    if fn is not None:
        return FunctionTask(fn)
    return lambda f: FunctionTask(f, **options)


@overload
def evaluator(fn: F, /) -> FunctionEvaluator: ...
@overload
def evaluator(*, name: str | None = None, criteria: str | None = None, retries: int = 0,
              retry_delay_seconds: float = 0.0, timeout_seconds: float | None = None,
              inline: bool | None = None, cache: bool | None = None,
              version: str | None = None) -> Callable[[F], FunctionEvaluator]: ...
def evaluator(fn: Callable[..., Any] | None = None, /,
              **options: Any) -> FunctionEvaluator | Callable[[F], FunctionEvaluator]:
    """Make a function an `Evaluator`: ``@evaluator`` or ``@evaluator(name=..., criteria=...)``.

    Takes the same ``inline``, ``cache`` and ``version`` options as `task`.
    """
    if fn is not None:
        return FunctionEvaluator(fn)
    return lambda f: FunctionEvaluator(f, **options)
