"""The exceptions esg-prefect raises, in one hierarchy.

Callers catch these classes, never a bare ``Exception``::

    ESGError
     ├── InvalidInputError (also a ValueError): bad input, named in the message
     │    ├── WorkflowError: a workflow DAG that cannot be scheduled
     │    ├── ConfigError: a configuration, space or settings value out of range
     │    ├── ProfileError: a malformed latency profile table
     │    └── PriceError: a price sheet without a needed price
     ├── MissingProfileError (also a LookupError): no latency for a (stage, config)
     └── UnknownSchedulerError (also a LookupError): no scheduler by that name
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
