"""The exceptions patronus-tasks raises.

The tree, small on purpose::

    PatronusTasksError              anything this package raises
    ├── ConfigError                 a user mistake, found before any model call
    │   └── DatasetError            a dataset that cannot be read or used as given
    ├── InvalidResultError          a task or evaluator returned something unusable
    │                               (recorded on the row, never raised to the caller)
    ├── RemoteAPIError              an HTTP API call failed after its retries
    │   └── JudgeError              a judge gave no verdict: the row is *unscored*
    │       └── UnparseableResponseError   it answered, but not in the asked-for form
    └── ExperimentError             the experiment ran but cannot be finished or reported
        └── QualityGateError        it finished, but a gate (errors, pass rates) failed

A `ConfigError` always says what was wrong, where (file, row, field or parameter) and
how to fix it. Runtime failures of user code are never raised out of an experiment:
they are recorded on their row (see `ErrorInfo`).
"""

from __future__ import annotations


class PatronusTasksError(Exception):
    """Base class of every error raised by patronus-tasks."""


class ConfigError(PatronusTasksError, ValueError):
    """A mistake in how an experiment, task, evaluator or dataset was set up."""


class DatasetError(ConfigError):
    """A dataset that cannot be read, or whose rows cannot be used as given."""


class InvalidResultError(PatronusTasksError, TypeError):
    """A task or evaluator returned a value of a type it may not return."""


class RemoteAPIError(PatronusTasksError):
    """An HTTP API call failed: a non-retryable status, or every attempt failed.

    ``status`` is the last HTTP status (None for connection errors and timeouts) and
    ``attempts`` how many requests were made. Messages never contain credentials.
    """

    def __init__(self, message: str, *, status: int | None = None, attempts: int = 1) -> None:
        super().__init__(message)
        self.status = status
        self.attempts = attempts


class JudgeError(RemoteAPIError):
    """A judge gave no verdict: it did not answer (after its retries), refused, answered
    out of its scale or in a form that cannot be read. ``raw`` keeps what it said,
    ``reason`` says which (``no_answer``, ``refusal``, ``out_of_scale``, ``unparseable``).

    Recorded as that row's evaluator error and counted apart as *unscored*: left out of
    pass rates (neither a pass nor a fail, never a 0 score). Raise it from your own
    judge for the same treatment.
    """

    def __init__(self, message: str, *, raw: str | None = None, reason: str = "unparseable",
                 status: int | None = None, attempts: int = 1) -> None:
        super().__init__(message, status=status, attempts=attempts)
        self.raw, self.reason = raw, reason

    @classmethod
    def no_answer(cls, exc: RemoteAPIError, judge: str) -> JudgeError:
        """A judge's endpoint that failed after its retries: no verdict, not a fail."""
        if isinstance(exc, JudgeError):
            return exc
        return cls(f"judge {judge!r} did not answer: {exc}", raw=None, reason="no_answer",
                   status=exc.status, attempts=exc.attempts)


class UnparseableResponseError(JudgeError):
    """A model's answer could not be parsed into a verdict; ``raw`` keeps the text."""

    def __init__(self, message: str, *, raw: str) -> None:
        super().__init__(message, raw=raw, reason="unparseable", status=200)


#: The error types (as the results' ``error_type`` says) of an evaluation with no verdict:
#: counted apart, out of pass rates.
UNSCORED_ERRORS = frozenset({"JudgeError", "UnparseableResponseError"})


class ExperimentError(PatronusTasksError, RuntimeError):
    """An experiment could not be run to the end or its results not be written."""


class QualityGateError(ExperimentError):
    """An experiment finished, its results written, but failed a quality gate.

    ``failures`` says which gates, ``experiment`` is the finished `Experiment`.
    """

    def __init__(self, failures: list[str], experiment: object) -> None:
        super().__init__("quality gate failed: " + "; ".join(failures))
        self.failures = failures
        self.experiment = experiment
        self.calibration: object = None  # `calibrate`'s figures, when it raised this

    def __reduce__(self) -> tuple[type, tuple[list[str], None]]:
        # Picklable (Prefect persists a flow's exception) without the experiment, whose
        # recorder holds threads: its folder is in the failure's flow run anyway.
        return type(self), (self.failures, None)
