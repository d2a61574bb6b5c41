"""The exceptions esg-prefect raises, in one hierarchy.

Callers catch these classes, never a bare ``Exception``::

    ESGError
     ├── InvalidInputError (also a ValueError): bad input, named in the message
     │    ├── WorkflowError: a workflow DAG that cannot be scheduled
     │    ├── ConfigError: a configuration, space or settings value out of range
     │    ├── ProfileError: a malformed latency profile table
     │    └── PriceError: a price sheet without a needed price
     ├── MissingProfileError (also a LookupError): no latency for a (stage, config)
     ├── UnknownSchedulerError (also a LookupError): no scheduler by that name
     ├── UnknownStageError (also a LookupError): a stage reference that cannot be resolved
     └── StageCallError: a pooled stage call did not produce its result
          ├── StageFailedError: the batch function raised on this call's input (and, for a
          │    builtin exception such as RuntimeError, is an instance of that type too)
          ├── StageRejectedError: the scheduler rejected the call (no profile, no time)
          ├── WorkerCrashedError: the worker died each time it ran this input
          ├── CallConflictError: the call contradicts what the pool holds (its id, workflow or stage)
          └── PoolClosedError: the pool shut down before the call finished

:func:`close_match` gives their messages the name a misspelt one most likely meant.
"""

from __future__ import annotations

import builtins
import difflib
from collections.abc import Iterable


class ESGError(Exception):
    """Base class of every error raised by esg-prefect."""


class InvalidInputError(ESGError, ValueError):
    """Input that cannot be used; the message names the bad value."""


class WorkflowError(InvalidInputError):
    """A workflow that is empty, cyclic, or refers to unknown stages."""


class ConfigError(InvalidInputError):
    """A configuration, configuration space or setting out of its range."""


class ProfileError(InvalidInputError):
    """A latency profile table that is malformed or inconsistent."""


class PriceError(InvalidInputError):
    """A price sheet that lacks a price or holds a negative one."""


class MissingProfileError(ESGError, LookupError):
    """The latency model has no measurement that covers a (stage, config, hardware)."""


class UnknownSchedulerError(ESGError, LookupError):
    """A scheduler name that the registry does not know."""


class UnknownStageError(ESGError, LookupError):
    """A stage reference (import path or name) that cannot be resolved."""


class StageCallError(ESGError):
    """A pooled stage call that did not produce its result."""


class StageFailedError(StageCallError):
    """The stage's batch function raised on this call's input.

    Attributes:
        error_type: qualified name of the original exception class.
        remote_traceback: the traceback text from the worker.
    """

    def __init__(self, message: str, error_type: str = "", remote_traceback: str = "") -> None:
        super().__init__(message)
        self.error_type = error_type
        self.remote_traceback = remote_traceback
        if remote_traceback:  # printed under the local traceback (Prefect's log shows only the caller's frames)
            self.add_note(f"In the stage's worker:\n{remote_traceback.rstrip()}")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.error_type, self.remote_traceback))

    def __str__(self) -> str:  # not KeyError's quoting, for the builtin-typed forms
        return str(self.args[0]) if self.args else ""

    @staticmethod
    def raised(message: str, error_type: str = "", remote_traceback: str = "") -> StageFailedError:
        """The error for a batch function that raised ``error_type``: also an instance of that type if builtin.

        So ``except RuntimeError`` and a retry condition testing the type see
        the stage's error as they would a plain task's. Only builtin types: the
        worker sends a type's name, never the exception object (nothing is
        unpickled from a worker or the network); for others, ``error_type``.
        """
        cls = _typed(error_type) if error_type in _BUILTIN_ERRORS else None
        if cls is not None:
            try:
                return cls(message, error_type, remote_traceback)
            except TypeError:  # a builtin whose constructor wants more (UnicodeDecodeError): the plain form
                pass
        return StageFailedError(message, error_type, remote_traceback)


class StageRejectedError(StageCallError):
    """The scheduler rejected the call: no profile covers the stage, or no time is left."""


class WorkerCrashedError(StageCallError):
    """The worker process died each time it ran this call's input."""


class CallConflictError(StageCallError):
    """The call contradicts what the pool already holds: a call id reused for another call, a
    workflow declared with another SLO or graph, or a stage name bound to other code in its workflow.
    The pool service answers it with HTTP 409; nothing of the pool's state changed."""


class PoolClosedError(StageCallError):
    """The pool was closed before the call finished."""


_BUILTIN_ERRORS = frozenset(
    name
    for name, obj in vars(builtins).items()
    if isinstance(obj, type)
    and issubclass(obj, Exception)
    and not issubclass(obj, (Warning, StopIteration, StopAsyncIteration))  # those steer iteration, not errors
)
_TYPED: dict[str, type[StageFailedError]] = {}
_TYPED_PREFIX = "StageFailedError_"


def _typed(error_type: str) -> type[StageFailedError] | None:
    """``StageFailedError`` that is also the builtin ``error_type`` (made once; None if they cannot combine)."""
    got = _TYPED.get(error_type)
    if got is None:
        base = getattr(builtins, error_type)
        name = _TYPED_PREFIX + error_type
        try:
            got = type(name, (StageFailedError, base), {"__module__": __name__, "__qualname__": name})
        except TypeError:  # an incompatible layout
            return None
        _TYPED[error_type] = got
    return got


def __getattr__(name: str) -> type[StageFailedError]:
    """The builtin-typed forms of :class:`StageFailedError` by name, so that pickles of them load anywhere."""
    if name.startswith(_TYPED_PREFIX) and name[len(_TYPED_PREFIX) :] in _BUILTIN_ERRORS:
        got = _typed(name[len(_TYPED_PREFIX) :])
        if got is not None:
            return got
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def close_match(name: str, choices: Iterable[str]) -> str | None:
    """The one of ``choices`` most likely meant by a misspelt ``name`` (a message's "did you mean"), or None.

    Example:
        >>> close_match("keep_alive", ["keep_alive_s", "tick_ms"]), close_match("zzz", ["tick_ms"])
        ('keep_alive_s', None)
    """
    guess = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return guess[0] if guess else None
