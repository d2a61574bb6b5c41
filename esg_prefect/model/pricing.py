"""Prices and the cost model of one batch (ESG-SPEC section 2).

``batch_cost = (vcpus * price_per_vcpu_s + gpu_share * price_per_gpu_s[hw]) * L / 1000``
and ``cost_per_request = batch_cost / batch``. Prices are per second; a whole
GPU of type ``hw`` costs ``price_per_gpu_s[hw]``, a share of it pays pro rata.

A worker pays for what it holds (``docs/decisions/idle-vcpus.md``): its GPU
share for its whole life (the share stays reserved on its device), its vCPUs
while it runs a batch or loads (the platform hands an idle worker's vCPUs to
busy ones). Idle time is therefore billed at :meth:`PriceSheet.idle_rate_per_s`,
unless the ``idle_vcpus`` setting says the platform holds the vCPUs too
(:func:`esg_prefect.model.attribution.idle_rates`).

The default sheet (``PriceSheet.default()``) is illustrative: on-demand list
prices of public clouds in 2024, rounded (vCPU $0.04/h; T4 $0.35/h; V100
$2.48/h; A10 $1.00/h; A100 $3.67/h; H100 $6.98/h; H200 $10.60/h). Users give
their own through the price-sheet block. GPU names are open-ended (a profile
may name its own hardware); where a sheet meets a profile (a pool, a
simulation), a price that likely misnames a profiled GPU is warned of
(:func:`warn_price_mismatches`).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from esg_prefect.exceptions import PriceError
from esg_prefect.model.config import CPU, Config

_DEFAULT_GPU_PER_HOUR = {
    "T4": 0.35,
    "V100": 2.48,
    "A10": 1.00,
    "A100": 3.67,
    "H100": 6.98,
    "H200": 10.60,
}
_DEFAULT_VCPU_PER_HOUR = 0.04

logger = logging.getLogger(__name__)
_warned: set[str] = set()  # mismatch messages already logged by this process


def _check_price(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PriceError(f"{name} must be a number, got {value!r}")
    if not (math.isfinite(value) and value >= 0):
        raise PriceError(f"{name} must be a finite price >= 0, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class PriceSheet:
    """Per-second prices of a vCPU and of one whole GPU of each type.

    Args:
        price_per_vcpu_s: price of one vCPU for one second.
        price_per_gpu_s: price of one whole GPU for one second, per GPU type.

    Examples:
        >>> sheet = PriceSheet.from_hourly(vcpu_per_hour=0.036, gpu_per_hour={"T4": 0.36})
        >>> round(sheet.batch_cost(Config(8, 1, 0.5), "T4", latency_ms=1000.0), 8)
        6e-05
    """

    price_per_vcpu_s: float
    price_per_gpu_s: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "price_per_vcpu_s", _check_price("price_per_vcpu_s", self.price_per_vcpu_s))
        gpus: dict[str, float] = {}
        for hw, price in dict(self.price_per_gpu_s).items():
            if not hw or hw == CPU:
                raise PriceError(f"GPU type must be a non-empty name other than {CPU!r}, got {hw!r}")
            gpus[hw] = _check_price(f"price_per_gpu_s[{hw!r}]", price)
        object.__setattr__(self, "price_per_gpu_s", MappingProxyType(gpus))

    def __hash__(self) -> int:
        return hash((self.price_per_vcpu_s, tuple(sorted(self.price_per_gpu_s.items()))))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PriceSheet):
            return NotImplemented
        return self.price_per_vcpu_s == other.price_per_vcpu_s and dict(self.price_per_gpu_s) == dict(
            other.price_per_gpu_s
        )

    def __getstate__(self) -> tuple[float, dict[str, float]]:
        return self.price_per_vcpu_s, dict(self.price_per_gpu_s)

    def __setstate__(self, state: tuple[float, dict[str, float]]) -> None:
        object.__setattr__(self, "price_per_vcpu_s", state[0])
        object.__setattr__(self, "price_per_gpu_s", MappingProxyType(dict(state[1])))

    @classmethod
    def from_hourly(cls, vcpu_per_hour: float, gpu_per_hour: Mapping[str, float]) -> PriceSheet:
        """Build a sheet from per-hour prices, as clouds publish them."""
        vcpu = _check_price("vcpu_per_hour", vcpu_per_hour)
        gpus = {hw: _check_price(f"gpu_per_hour[{hw!r}]", p) / 3600.0 for hw, p in gpu_per_hour.items()}
        return cls(vcpu / 3600.0, gpus)

    @classmethod
    def default(cls) -> PriceSheet:
        """The illustrative default sheet described in the module docstring."""
        return cls.from_hourly(_DEFAULT_VCPU_PER_HOUR, _DEFAULT_GPU_PER_HOUR)

    def gpu_price_s(self, hardware: str) -> float:
        """Per-second price of a whole GPU of type ``hardware`` (0 for the CPU).

        Raises:
            PriceError: when the sheet has no price for that GPU type.
        """
        if hardware == CPU:
            return 0.0
        try:
            return self.price_per_gpu_s[hardware]
        except KeyError:
            raise PriceError(
                f"no price for GPU type {hardware!r}; the sheet prices {sorted(self.price_per_gpu_s)}"
            ) from None

    def keep_alive_scales(self, hardware: Iterable[str]) -> dict[str, float]:
        """Per type in ``hardware``, the fraction of the keep-alive time its idle workers get when it is priced.

        The cheapest GPU type present with a price above zero (and the CPU)
        keeps the whole keep-alive time; a dearer type keeps it for that type's
        price over its own, so an idle worker of any type may cost about what
        one of the cheapest priced type would before it is stopped
        (``ESGSettings.keep_alive_by_price``). A type priced 0 keeps the whole
        time too, as its idle time costs nothing, and is left out of the
        comparison: taken as the cheapest, it would give every other type a
        scale of 0, stopping their idle workers at once. A GPU type the sheet
        does not price keeps the whole time and is left out likewise: the knob
        is on by default, and a machine may hold a GPU that no profile covers
        (no worker is ever placed there) and so no price either; one that is
        profiled fails where a batch is priced.
        """
        gpus = sorted({hw for hw in hardware if hw != CPU})
        out = dict.fromkeys([CPU, *gpus], 1.0)
        priced = [hw for hw in gpus if self.price_per_gpu_s.get(hw, 0.0) > 0]
        if priced:
            cheapest = min(self.price_per_gpu_s[hw] for hw in priced)
            for hw in priced:
                out[hw] = cheapest / self.price_per_gpu_s[hw]
        return out

    def rate_per_s(self, vcpus: int, gpu_share: float, hardware: str) -> float:
        """Per-second price of a worker holding ``vcpus`` and ``gpu_share`` of ``hardware``."""
        return vcpus * self.price_per_vcpu_s + gpu_share * self.gpu_price_s(hardware)

    def idle_rate_per_s(self, gpu_share: float, hardware: str) -> float:
        """Per-second price of an idle warm worker's GPU share alone: what it pays idle where it holds no vCPU.

        That is the default; with the ``idle_vcpus`` setting on, or while it
        loads its model, an idle worker holds its vCPUs and pays the whole
        :meth:`rate_per_s` (:func:`esg_prefect.model.attribution.idle_rates`,
        the one rule of idle prices).
        """
        return gpu_share * self.gpu_price_s(hardware)

    def batch_cost(self, config: Config, hardware: str, latency_ms: float) -> float:
        """Cost of running one batch with ``config`` for ``latency_ms``."""
        if not (math.isfinite(latency_ms) and latency_ms >= 0):
            raise PriceError(f"latency_ms must be a finite number >= 0, got {latency_ms!r}")
        return self.rate_per_s(config.vcpus, config.gpu_share, hardware) * latency_ms / 1000.0

    def cost_per_request(self, config: Config, hardware: str, latency_ms: float) -> float:
        """Cost of one job of a full batch: ``batch_cost / batch``."""
        return self.batch_cost(config, hardware, latency_ms) / config.batch


def price_mismatches(prices: PriceSheet, hardware: Iterable[str]) -> list[str]:
    """Messages for the GPU prices in ``prices`` that are likely misnamed, given the profiled ``hardware``.

    Hardware names are open-ended (a user's profile names its own), so a sheet
    may price GPUs the profile does not cover; but a price that matches no
    profiled hardware while a profiled GPU has no price of its own is almost
    always a misspelt name (``'a100'`` for ``'A100'``): that price is never
    used, and batches on the unpriced GPU cannot be priced.
    """
    known = set(hardware)
    unpriced = sorted(hw for hw in known if hw != CPU and hw not in prices.price_per_gpu_s)
    if not unpriced:
        return []
    listed = ", ".join(sorted(known))
    out: list[str] = []
    guessed: set[str] = set()
    unsure: list[str] = []  # unmatched prices that spell no unpriced GPU
    for name in sorted(prices.price_per_gpu_s):
        if name in known:
            continue
        guess = _closest(name, unpriced)
        if guess is None:
            unsure.append(name)
            continue
        guessed.add(guess)
        out.append(f"price for {name!r} matches no hardware in the profile ({listed}); did you mean {guess!r}?")
    left = [hw for hw in unpriced if hw not in guessed]
    if unsure and left:
        out.append(
            f"no price for the profile's {', '.join(left)}, and the prices for {', '.join(unsure)} "
            f"match no hardware in the profile ({listed}): is one of them misnamed?"
        )
    return out


def warn_price_mismatches(prices: PriceSheet, hardware: Iterable[str]) -> list[str]:
    """Log :func:`price_mismatches` where a profile and prices meet (a pool, a simulation); returns them.

    A warning, not an error: the sheet may rightly price hardware no worker is
    placed on. Each message is logged once per process, since a simulation
    study builds the same case many times.
    """
    found = price_mismatches(prices, hardware)
    for message in found:
        if message not in _warned:
            _warned.add(message)
            logger.warning("%s", message)
    return found


def _closest(name: str, candidates: list[str]) -> str | None:
    """The candidate ``name`` spells but for case and punctuation (``a100``, ``A-100``), or None.

    No nearer guess: GPU names that differ by a letter or a digit (``A10``,
    ``A100``; ``L4``, ``L40``) are other GPUs, so such prices are named
    together instead (:func:`price_mismatches`).
    """
    folded = {_fold(c): c for c in candidates}
    return folded.get(_fold(name))


def _fold(name: str) -> str:
    return re.sub(r"[^0-9a-z]", "", name.lower())
