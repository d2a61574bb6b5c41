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
          ├── StageFailedError: the batch function raised on this call's input
          ├── StageRejectedError: the scheduler rejected the call (no profile, no time)
          ├── WorkerCrashedError: the worker died each time it ran this input
          ├── CallConflictError: the call contradicts what the pool holds (its id, workflow or stage)
          └── PoolClosedError: the pool shut down before the call finished
"""

from __future__ import annotations


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
