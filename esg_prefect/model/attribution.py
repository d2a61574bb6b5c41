"""Cost attribution: from batches and idle time to per-request and per-run costs.

ESG-SPEC section 6. A worker is billed for all the time it holds resources:
busy (running batches, cold starts included) and idle (kept warm). An idle
worker holds its GPU share but no vCPU (the platform hands those to busy
workers), so idle time is billed at the share's price, and a pre-warm start's
load, which holds both, at the whole rate (:func:`idle_cost`). Each batch's
cost is split among its jobs, equally (default) or by input size (a knob).

A flow run's cost is defined once, here, and every surface shows it (the
run's Prefect artifacts, ``esg-prefect costs``, the demo, the simulator's
reports; see ``docs/decisions/one-cost.md``): its share of the busy time of
each batch it had calls in, plus its share, split the same way, of the warm
idle time those batches caused:

* an idle interval of a worker goes to the batch on that worker that ended
  last before it (the batch whose completion started the keep-alive window);
* an idle interval with no batch before it on its worker (a worker started
  ahead of its first batch, e.g. pre-warmed, idling until that batch) goes to
  the first batch after it on that worker (the runs that used the warm worker);
* only the idle time of a worker that never ran a batch is left on the
  separate "unattributed idle" line.

With ``idle_billing="separate"`` every idle interval is on that line instead.

Invariant (tested): ``sum(per_run.values()) + idle_unattributed`` equals the
sum over workers of ``busy time * rate + idle time * idle rate``; with
``idle_billing="attribute"`` the idle line holds only the never-used workers,
so per-run costs alone add up to the whole bill whenever every worker ran a batch.

A run's cost is final once the idle interval after each of its batches has
closed (the worker's next batch starts, its keep-alive runs out, or the pool
closes): :class:`~esg_prefect.model.ledger.CostLedger` follows that for a live pool.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

from esg_prefect.exceptions import InvalidInputError
from esg_prefect.model.cluster import Worker
from esg_prefect.model.config import CPU, Config
from esg_prefect.model.pricing import PriceSheet

CostSplit = Literal["equal", "input_size"]
IdleBilling = Literal["attribute", "separate"]
COST_SPLITS: tuple[CostSplit, ...] = get_args(CostSplit)
"""The cost splits, in order: the one list that settings, the store and the CLI check against."""
IDLE_BILLINGS: tuple[IdleBilling, ...] = get_args(IdleBilling)
"""The idle billings, in order: the one list that settings, the store and the CLI check against."""


def one_of(choices: Sequence[str]) -> str:
    """The choices quoted and joined for a message: ``'equal' or 'input_size'``."""
    return " or ".join(repr(c) for c in choices)


COST_UNIT = "$"
"""The unit of costs: the price sheet's prices are dollars per second (``PriceSheet.from_hourly``: per hour)."""


def cost_unit(prices: PriceSheet) -> str:
    """The unit a sheet's costs are in: its ``currency`` where a sheet names one, else :data:`COST_UNIT`."""
    unit = getattr(prices, "currency", None)
    return unit if isinstance(unit, str) and unit else COST_UNIT


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
    """An interval in which a worker was warm without work; ``loading_ms``: its first part spent loading.

    A pre-warmed worker's first idle interval begins with its load (a start off
    the requests' path), in which it holds its vCPUs as a batch's cold start
    does; the rest of the interval holds only its GPU share, unless
    ``vcpus_held``: on a platform that reserves a worker's vCPUs for its life,
    it holds (and pays for) them too.
    """

    worker_id: str
    vcpus: int
    gpu_share: float
    hardware: str
    start_ms: float
    end_ms: float
    loading_ms: float = 0.0
    vcpus_held: bool = False

    def __post_init__(self) -> None:
        Worker(
            self.worker_id, "-", None if self.hardware == CPU else "-", self.hardware, self.vcpus, self.gpu_share, None
        )
        if not (math.isfinite(self.start_ms) and math.isfinite(self.end_ms)) or self.end_ms < self.start_ms:
            raise InvalidInputError(
                f"idle record of {self.worker_id}: need start_ms <= end_ms, got {self.start_ms}, {self.end_ms}"
            )
        if not (math.isfinite(self.loading_ms) and 0.0 <= self.loading_ms <= self.end_ms - self.start_ms):
            raise InvalidInputError(
                f"idle record of {self.worker_id}: loading_ms must be within the interval, got {self.loading_ms!r}"
            )


@dataclass(frozen=True, slots=True)
class RunCost:
    """One flow run's cost, as every surface shows it: busy part, idle part, unit.

    Attributes:
        busy: its shares of its batches' busy time.
        idle: its shares of the warm idle time its batches caused.
        unit: the unit of both (:func:`cost_unit`).
    """

    busy: float
    idle: float
    unit: str = COST_UNIT

    @property
    def total(self) -> float:
        """The run's cost: busy plus idle."""
        return self.busy + self.idle


@dataclass(frozen=True, slots=True)
class CostReport:
    """Where the money went.

    Attributes:
        per_request: cost of each request (batch shares plus attributed idle).
        per_run: cost of each run: ``per_run_busy[run] + per_run_idle[run]``.
        busy_total: cost of all batches.
        idle_total: cost of all idle time.
        idle_unattributed: idle cost shown on the separate idle line.
        per_run_busy: each run's shares of its batches' busy time.
        per_run_idle: each run's shares of the idle time its batches caused.
        unit: the unit of every figure (:func:`cost_unit`).
    """

    per_request: dict[str, float]
    per_run: dict[str, float]
    busy_total: float
    idle_total: float
    idle_unattributed: float
    per_run_busy: dict[str, float] = field(default_factory=dict)
    per_run_idle: dict[str, float] = field(default_factory=dict)
    unit: str = COST_UNIT

    @property
    def total(self) -> float:
        """Everything billed: busy plus idle."""
        return self.busy_total + self.idle_total

    def run_cost(self, run_id: str) -> RunCost:
        """The cost of run ``run_id`` with its busy/idle split (zero for a run the report does not bill)."""
        return RunCost(self.per_run_busy.get(run_id, 0.0), self.per_run_idle.get(run_id, 0.0), self.unit)


def split_weights(items: Sequence[BatchItem], split: CostSplit) -> list[float]:
    """Fractions of a batch's cost each item pays; they sum to 1."""
    if split == "equal":
        return [1.0 / len(items)] * len(items)
    if split == "input_size":
        total = sum(i.input_size for i in items)
        return [i.input_size / total for i in items]
    raise InvalidInputError(f"cost split must be 'equal' or 'input_size', got {split!r}")


def idle_owners(
    batches: Iterable[BatchRecord], idles: Iterable[IdleRecord], prior_workers: Collection[str] = ()
) -> list[tuple[IdleRecord, BatchRecord | None]]:
    """The batch each idle interval is attributed to; None for the separate idle line.

    The batch on the interval's worker that ended last, no later than the
    interval's start; with none, the worker's first batch that starts at or
    after the interval's end (the worker idled, warm, until that batch);
    with none either (the worker never ran a batch), None.

    Args:
        batches: the batches.
        idles: the idle intervals.
        prior_workers: workers that ran batches before the records begin (a
            time window's cut): an interval of theirs with no batch before it
            in the records was caused by a batch outside them, so it goes to
            the idle line, not to the first batch after it.
    """
    by_worker: dict[str, list[BatchRecord]] = defaultdict(list)
    for b in batches:
        by_worker[b.worker_id].append(b)
    ends: dict[str, list[float]] = {}
    for w, on_w in by_worker.items():
        on_w.sort(key=lambda r: r.end_ms)
        ends[w] = [b.end_ms for b in on_w]
    out: list[tuple[IdleRecord, BatchRecord | None]] = []
    for idle in idles:
        lst = by_worker.get(idle.worker_id)
        owner = None
        if lst:
            k = bisect.bisect_right(ends[idle.worker_id], idle.start_ms) - 1
            if k >= 0:
                owner = lst[k]
            elif idle.worker_id not in prior_workers:
                owner = next((b for b in lst if b.start_ms >= idle.end_ms), None)
        out.append((idle, owner))
    return out


def attribute_costs(
    batches: Iterable[BatchRecord],
    idles: Iterable[IdleRecord],
    prices: PriceSheet,
    split: CostSplit = "equal",
    idle_billing: IdleBilling = "attribute",
    *,
    prior_workers: Collection[str] = (),
) -> CostReport:
    """Attribute batch and idle costs to requests and runs (the module docstring's definition).

    Args:
        batches: finished batches.
        idles: closed idle intervals of workers.
        prices: the price sheet in force.
        split: how a batch's cost (and the idle time it caused) is split among its items.
        idle_billing: ``"attribute"`` idle time to the batch that caused it (see
            :func:`idle_owners`), or ``"separate"`` to put all idle time on the idle line.
        prior_workers: see :func:`idle_owners` (for records cut to a time window).

    Returns:
        The per-request and per-run costs (with each run's busy/idle split) and the totals.
    """
    if split not in COST_SPLITS:
        raise InvalidInputError(f"cost split must be {one_of(COST_SPLITS)}, got {split!r}")
    if idle_billing not in IDLE_BILLINGS:
        raise InvalidInputError(f"idle_billing must be {one_of(IDLE_BILLINGS)}, got {idle_billing!r}")
    batch_list = list(batches)
    per_request: dict[str, float] = defaultdict(float)
    run_busy: dict[str, float] = defaultdict(float)
    run_idle: dict[str, float] = defaultdict(float)
    busy_total = 0.0
    for b in batch_list:
        cost = prices.batch_cost(b.config, b.hardware, b.duration_ms)
        busy_total += cost
        for item, w in zip(b.items, split_weights(b.items, split), strict=True):
            per_request[item.request_id] += cost * w
            run_busy[item.run_id] += cost * w
    idle_total = 0.0
    unattributed = 0.0
    owners = idle_owners(batch_list, idles, prior_workers) if idle_billing == "attribute" else None
    pairs = owners if owners is not None else [(i, None) for i in idles]
    for idle, owner in pairs:
        cost = idle_cost(idle, prices)
        idle_total += cost
        if owner is None:
            unattributed += cost
            continue
        for item, w in zip(owner.items, split_weights(owner.items, split), strict=True):
            per_request[item.request_id] += cost * w
            run_idle[item.run_id] += cost * w
    return _report(per_request, run_busy, run_idle, busy_total, idle_total, unattributed, cost_unit(prices))


def idle_cost(idle: IdleRecord, prices: PriceSheet) -> float:
    """What an idle interval costs: its GPU share for its whole length, its vCPUs for the load at its start."""
    loading, waiting = idle_cost_split(idle, prices)
    return loading + waiting


def idle_cost_split(idle: IdleRecord, prices: PriceSheet) -> tuple[float, float]:
    """:func:`idle_cost` in two parts, in dollars: the load at its start (at the worker's whole rate), the rest.

    The load is a pre-warm start's cold start, off the requests' path (``IdleRecord.loading_ms``);
    the rest is idle time proper, billed at the GPU share's price only (the whole rate when the
    worker held its vCPUs idle, ``IdleRecord.vcpus_held``).
    """
    load_rate, rate = idle_rates(prices, idle.vcpus, idle.gpu_share, idle.hardware, idle.vcpus_held)
    loading = load_rate * idle.loading_ms / 1000.0
    waiting = rate * (idle.end_ms - idle.start_ms - idle.loading_ms)
    return loading, waiting / 1000.0


def idle_rates(
    prices: PriceSheet, vcpus: int, gpu_share: float, hardware: str, vcpus_held: bool
) -> tuple[float, float]:
    """Per-second prices of an idle worker's time: while it loads, and the rest (the one rule of idle prices).

    A load holds the worker's vCPUs and GPU share, so it pays the whole rate; the rest pays
    the GPU share's price only, or the whole rate where the platform held the vCPUs too
    (``vcpus_held``, from the ``idle_vcpus`` knob). :func:`idle_cost_split` and the pool's
    running totals (``control.totals.Totals.bill``) both price idle time with it, so they agree.
    """
    whole = prices.rate_per_s(vcpus, gpu_share, hardware)
    return whole, whole if vcpus_held else prices.idle_rate_per_s(gpu_share, hardware)


def _report(
    per_request: Mapping[str, float],
    run_busy: Mapping[str, float],
    run_idle: Mapping[str, float],
    busy_total: float,
    idle_total: float,
    unattributed: float,
    unit: str,
) -> CostReport:
    runs = {*run_busy, *run_idle}
    busy = {r: run_busy.get(r, 0.0) for r in runs}
    idle = {r: run_idle.get(r, 0.0) for r in runs}
    per_run = {r: busy[r] + idle[r] for r in runs}
    return CostReport(dict(per_request), per_run, busy_total, idle_total, unattributed, busy, idle, unit)


def merge_reports(reports: Iterable[CostReport]) -> CostReport:
    """Attributions of disjoint records (other workers, other price sheets) as one."""
    per_request: dict[str, float] = defaultdict(float)
    run_busy: dict[str, float] = defaultdict(float)
    run_idle: dict[str, float] = defaultdict(float)
    busy = idle = unattributed = 0.0
    unit = COST_UNIT
    for rep in reports:
        for k, v in rep.per_request.items():
            per_request[k] += v
        for k, v in rep.per_run_busy.items():
            run_busy[k] += v
        for k, v in rep.per_run_idle.items():
            run_idle[k] += v
        busy += rep.busy_total
        idle += rep.idle_total
        unattributed += rep.idle_unattributed
        unit = rep.unit
    return _report(per_request, run_busy, run_idle, busy, idle, unattributed, unit)
