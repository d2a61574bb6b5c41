"""Configurations: the 3-D choice (batch, vCPUs, GPU share) made for each dispatch.

ESG picks, for each dispatch of a queue, a batch size, a number of vCPUs and a
share of one GPU (ESG-SPEC section 2). ``gpu_share == 0`` means the batch runs
on the CPU only. Shares are kept on a 1/100 grid so that ``0.1 + 0.2`` and
``0.3`` name the same configuration.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from esg_prefect.exceptions import ConfigError

CPU = "cpu"
"""Hardware name of CPU-only execution (``gpu_share == 0``)."""

DEFAULT_BATCHES: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
DEFAULT_VCPUS: tuple[int, ...] = (1, 2, 4)
DEFAULT_GPU_SHARES: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def normalize_share(gpu_share: float) -> float:
    """Round a GPU share to the 1/100 grid after checking it lies in [0, 1]."""
    if not isinstance(gpu_share, (int, float)) or isinstance(gpu_share, bool):
        raise ConfigError(f"gpu_share must be a number, got {gpu_share!r}")
    if not 0.0 <= gpu_share <= 1.0:
        raise ConfigError(f"gpu_share must be in [0, 1], got {gpu_share}")
    return round(float(gpu_share), 2)


@dataclass(frozen=True, slots=True, order=True)
class Config:
    """One dispatch configuration.

    Args:
        batch: number of jobs run together, >= 1.
        vcpus: vCPUs of the worker, >= 1.
        gpu_share: fraction of one GPU in [0, 1]; 0 means CPU only.

    Examples:
        >>> Config(batch=8, vcpus=2, gpu_share=0.3)
        Config(batch=8, vcpus=2, gpu_share=0.3)
    """

    batch: int
    vcpus: int
    gpu_share: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.batch, int) or isinstance(self.batch, bool) or self.batch < 1:
            raise ConfigError(f"batch must be an int >= 1, got {self.batch!r}")
        if not isinstance(self.vcpus, int) or isinstance(self.vcpus, bool) or self.vcpus < 1:
            raise ConfigError(f"vcpus must be an int >= 1, got {self.vcpus!r}")
        object.__setattr__(self, "gpu_share", normalize_share(self.gpu_share))

    @property
    def uses_gpu(self) -> bool:
        """Whether the configuration needs a GPU device."""
        return self.gpu_share > 0.0

    def with_batch(self, batch: int) -> Config:
        """The same resources with another batch size."""
        return Config(batch, self.vcpus, self.gpu_share)


def _positive_ints(name: str, values: Iterable[int]) -> tuple[int, ...]:
    out = tuple(sorted(set(values)))
    if not out:
        raise ConfigError(f"{name} must not be empty")
    for v in out:
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(f"{name} must hold ints >= 1, got {v!r}")
    return out


@dataclass(frozen=True, slots=True)
class ConfigSpace:
    """The candidate configurations: the product of batches, vCPUs and shares.

    The default is ESG-SPEC's: batch in {1,2,4,8,16,32}, vcpus in {1,2,4},
    gpu_share in {0, 0.1, ..., 1.0}: 198 configurations.
    """

    batches: tuple[int, ...] = DEFAULT_BATCHES
    vcpus: tuple[int, ...] = DEFAULT_VCPUS
    gpu_shares: tuple[float, ...] = field(default=DEFAULT_GPU_SHARES)

    def __post_init__(self) -> None:
        object.__setattr__(self, "batches", _positive_ints("batches", self.batches))
        object.__setattr__(self, "vcpus", _positive_ints("vcpus", self.vcpus))
        shares = tuple(sorted({normalize_share(s) for s in self.gpu_shares}))
        if not shares:
            raise ConfigError("gpu_shares must not be empty")
        object.__setattr__(self, "gpu_shares", shares)

    def __iter__(self) -> Iterator[Config]:
        for s in self.gpu_shares:
            for v in self.vcpus:
                for b in self.batches:
                    yield Config(b, v, s)

    def __len__(self) -> int:
        return len(self.batches) * len(self.vcpus) * len(self.gpu_shares)

    @property
    def max_batch(self) -> int:
        """The largest batch size of the space."""
        return self.batches[-1]
