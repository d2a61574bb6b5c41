"""esg-prefect: pooled, batched DNN pipelines on shared GPUs for Prefect 3.

The domain model (:mod:`esg_prefect.model`) and the scheduler core
(:mod:`esg_prefect.scheduling`) import neither Prefect nor torch; the names
below that need Prefect (``ESGTaskRunner``, ``Pipeline``, ``esg_options``, ``shared_prefect_clients``) are
imported on first use.
"""

from __future__ import annotations

from typing import Any

from esg_prefect.exceptions import (
    ConfigError,
    ESGError,
    InvalidInputError,
    MissingProfileError,
    PoolClosedError,
    PriceError,
    ProfileError,
    StageCallError,
    StageFailedError,
    StageRejectedError,
    UnknownSchedulerError,
    UnknownStageError,
    WorkerCrashedError,
    WorkflowError,
)

__version__ = "0.1.0"

_LAZY = {
    "ESGTaskRunner": "esg_prefect.integration.runner",
    "Pipeline": "esg_prefect.integration.stage",
    "esg_options": "esg_prefect.integration.stage",
    "Pool": "esg_prefect.runtime.pool",
    "ESGSettings": "esg_prefect.scheduling.settings",
    "shared_prefect_clients": "esg_prefect.integration.async_runs",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'esg_prefect' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "ConfigError",
    "ESGError",
    "ESGSettings",
    "ESGTaskRunner",
    "InvalidInputError",
    "MissingProfileError",
    "Pipeline",
    "Pool",
    "PoolClosedError",
    "PriceError",
    "ProfileError",
    "StageCallError",
    "StageFailedError",
    "StageRejectedError",
    "UnknownSchedulerError",
    "UnknownStageError",
    "WorkerCrashedError",
    "WorkflowError",
    "__version__",
    "esg_options",
    "shared_prefect_clients",
]
