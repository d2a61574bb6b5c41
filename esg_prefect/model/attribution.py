"""Cost attribution: from batches and idle time to per-request and per-run costs.

ESG-SPEC section 6. A worker is billed for all the time it holds resources:
busy (running batches, cold starts included) and idle (kept warm). Each batch's
cost is split among its jobs, equally (default) or by input size (a knob).
Idle time is either attributed to the runs whose jobs the worker served in the
batch just before it (the batch whose completion started the keep-alive
window), split like that batch, or shown as a separate "idle" line (a knob).
Idle time with no batch before it on that worker is always on the idle line.

Invariant (tested): ``sum(per_run.values()) + idle_unattributed`` equals the
sum over workers of ``(busy + idle time) * price rate``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from esg_prefect.exceptions import InvalidInputError
from esg_prefect.model.cluster import Worker
from esg_prefect.model.config import CPU, Config
from esg_prefect.model.pricing import PriceSheet

CostSplit = Literal["equal", "input_size"]
IdleBilling = Literal["attribute", "separate"]


@dataclass(frozen=True, slots=True)
class BatchItem:
    """One job of a finished batch, for billing."""

    request_id: str
    run_id: str
    input_size: float = 1.0

    def __post_init__(self) -> None:
        if not self.request_id or not self.run_id:
            raise InvalidInputError(
                f"request_id and run_id must be non-empty, got {self.request_id!r}, {self.run_id!r}"
            )
        if not (math.isfinite(self.input_size) and self.input_size > 0):
            raise InvalidInputError(f"input_size must be > 0, got {self.input_size!r}")


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """A batch as it ran: on which worker, with what resources, for how long."""

    batch_id: str
    worker_id: str
    items: tuple[BatchItem, ...]
    config: Config
    hardware: str
    start_ms: float
    end_ms: float

    def __post_init__(self) -> None:
        if not self.items:
            raise InvalidInputError(f"batch record {self.batch_id} has no items")
        if not (math.isfinite(self.start_ms) and math.isfinite(self.end_ms)) or self.end_ms < self.start_ms:
            raise InvalidInputError(
                f"batch record {self.batch_id}: need start_ms <= end_ms, got {self.start_ms}, {self.end_ms}"
            )

    @property
    def duration_ms(self) -> float:
        """Billed time of the batch."""
        return self.end_ms - self.start_ms


@dataclass(frozen=True, slots=True)
class IdleRecord:
    """An interval in which a worker held its resources without work."""

    worker_id: str
    vcpus: int
    gpu_share: float
    hardware: str
    start_ms: float
    end_ms: float

    def __post_init__(self) -> None:
        Worker(
            self.worker_id, "-", None if self.hardware == CPU else "-", self.hardware, self.vcpus, self.gpu_share, None
        )
        if not (math.isfinite(self.start_ms) and math.isfinite(self.end_ms)) or self.end_ms < self.start_ms:
            raise InvalidInputError(
                f"idle record of {self.worker_id}: need start_ms <= end_ms, got {self.start_ms}, {self.end_ms}"
            )


@dataclass(frozen=True, slots=True)
class CostReport:
    """Where the money went.

    Attributes:
        per_request: cost of each request (batch shares plus attributed idle).
        per_run: cost of each run (sum of its requests).
        busy_total: cost of all batches.
        idle_total: cost of all idle time.
        idle_unattributed: idle cost shown on the separate idle line.
    """

    per_request: dict[str, float]
    per_run: dict[str, float]
    busy_total: float
    idle_total: float
    idle_unattributed: float

    @property
    def total(self) -> float:
        """Everything billed: busy plus idle."""
        return self.busy_total + self.idle_total


def split_weights(items: Sequence[BatchItem], split: CostSplit) -> list[float]:
    """Fractions of a batch's cost each item pays; they sum to 1."""
    if split == "equal":
        return [1.0 / len(items)] * len(items)
    if split == "input_size":
        total = sum(i.input_size for i in items)
        return [i.input_size / total for i in items]
    raise InvalidInputError(f"cost split must be 'equal' or 'input_size', got {split!r}")


def attribute_costs(
    batches: Iterable[BatchRecord],
    idles: Iterable[IdleRecord],
    prices: PriceSheet,
    split: CostSplit = "equal",
    idle_billing: IdleBilling = "attribute",
) -> CostReport:
    """Attribute batch and idle costs to requests and runs.

    Args:
        batches: finished batches.
        idles: idle intervals of workers.
        prices: the price sheet in force.
        split: how a batch's cost is split among its items.
        idle_billing: ``"attribute"`` idle to the runs served just before, or
            ``"separate"`` to put all idle time on the idle line.

    Returns:
        The per-request and per-run costs and the totals.
    """
    if split not in ("equal", "input_size"):
        raise InvalidInputError(f"cost split must be 'equal' or 'input_size', got {split!r}")
    if idle_billing not in ("attribute", "separate"):
        raise InvalidInputError(f"idle_billing must be 'attribute' or 'separate', got {idle_billing!r}")
    per_request: dict[str, float] = defaultdict(float)
    run_of: dict[str, str] = {}
    busy_total = 0.0
    by_worker: dict[str, list[BatchRecord]] = defaultdict(list)
    for b in batches:
        cost = prices.batch_cost(b.config, b.hardware, b.duration_ms)
        busy_total += cost
        for item, w in zip(b.items, split_weights(b.items, split), strict=True):
            per_request[item.request_id] += cost * w
            run_of[item.request_id] = item.run_id
        by_worker[b.worker_id].append(b)
    for lst in by_worker.values():
        lst.sort(key=lambda r: r.end_ms)
    idle_total = 0.0
    unattributed = 0.0
    for idle in idles:
        cost = prices.rate_per_s(idle.vcpus, idle.gpu_share, idle.hardware) * (idle.end_ms - idle.start_ms) / 1000.0
        idle_total += cost
        before = _last_batch_before(by_worker.get(idle.worker_id, []), idle.start_ms)
        if idle_billing == "separate" or before is None:
            unattributed += cost
            continue
        for item, w in zip(before.items, split_weights(before.items, split), strict=True):
            per_request[item.request_id] += cost * w
    per_run: dict[str, float] = defaultdict(float)
    for req, cost in per_request.items():
        per_run[run_of[req]] += cost
    return CostReport(dict(per_request), dict(per_run), busy_total, idle_total, unattributed)


def _last_batch_before(batches: list[BatchRecord], t_ms: float) -> BatchRecord | None:
    """The batch on the same worker that ended last, no later than ``t_ms``."""
    found = None
    for b in batches:
        if b.end_ms <= t_ms:
            found = b
        else:
            break
    return found
