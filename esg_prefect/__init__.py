"""esg-prefect: pooled, batched DNN pipelines on shared GPUs for Prefect 3.

The domain model (:mod:`esg_prefect.model`) and the scheduler core
(:mod:`esg_prefect.scheduling`) are importable without Prefect or torch.
"""

from esg_prefect.exceptions import (
    ConfigError,
    ESGError,
    InvalidInputError,
    MissingProfileError,
    PriceError,
    ProfileError,
    UnknownSchedulerError,
    WorkflowError,
)

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "ESGError",
    "InvalidInputError",
    "MissingProfileError",
    "PriceError",
    "ProfileError",
    "UnknownSchedulerError",
    "WorkflowError",
    "__version__",
]
