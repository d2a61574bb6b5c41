"""Running totals of a pool's work and bill since it started: counts that only grow, for metrics' ``rate()``.

The fleet's and the core's record lists keep only the newest records
(:class:`~esg_prefect.control.ring.Ring`, a bounded deque of decisions), so a
count over them stops growing once they are full: no counter. :class:`Totals`
is added to as each record is made (O(1) a batch or idle interval) and keeps
resource time per worker shape (hardware, vCPUs, GPU share: a handful of keys),
so the bill in dollars is a short sum when read, with the pool's price sheet.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import TYPE_CHECKING

from esg_prefect.model.attribution import BatchRecord, IdleRecord, idle_rates
from esg_prefect.model.pricing import PriceSheet

if TYPE_CHECKING:
    from esg_prefect.scheduling.base import DecisionStats

__all__ = ["BILL_PARTS", "DECISION_BUCKETS_MS", "Totals"]

DECISION_BUCKETS_MS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0)
"""Upper bounds of the decision-time histogram's buckets, in ms (one more bucket above the last)."""

BILL_PARTS = ("busy", "cold_start", "idle")
"""The parts of the whole bill, as ``esg-prefect compare`` splits it (``cli.bill_plot.bill_split``)."""

_Shape = tuple[str, int, float]  # hardware, vCPUs, GPU share


class Totals:
    """Batches and calls per stage, resource time by part of the bill, and decision times, since the start.

    The bill's parts (:meth:`bill`): ``cold_start`` is the part of each batch
    spent starting its worker, ``busy`` the rest of the batches, ``idle`` the
    warm idle time (a pre-warmed worker's load included, as the reports bill it).
    Idle time is added when its interval closes (the worker's next batch, its
    keep-alive running out, an eviction); the open intervals are the caller's.

    Examples:
        >>> from esg_prefect.model.attribution import BatchItem
        >>> from esg_prefect.model.config import Config
        >>> t = Totals()
        >>> record = BatchRecord("b1", "w1", (BatchItem("q", "r"),), Config(1, 2, 0.0), "cpu", 0.0, 500.0)
        >>> t.batch("embed", record, cold_ms=100.0)
        >>> t.idle(IdleRecord("w1", 2, 0.0, "cpu", 500.0, 1500.0))
        >>> t.batches, t.calls, t.bill(PriceSheet(1.0, {}))
        ({'embed': 1}, {'embed': 1}, {'busy': 0.8, 'cold_start': 0.2, 'idle': 0.0})
    """

    __slots__ = ("_batch_ms", "_idle_ms", "batches", "calls", "decision_buckets", "decision_ms_sum", "decisions")

    def __init__(self) -> None:
        self.batches: dict[str, int] = {}  # per stage, lost ones (a worker died) included
        self.calls: dict[str, int] = {}  # batch items per stage (a call requeued after a crash counts again)
        self._batch_ms: dict[_Shape, list[float]] = {}  # [busy less cold start, cold start]
        self._idle_ms: dict[tuple[str, int, float, bool], list[float]] = {}  # [loading, the rest]; key: + vCPUs held
        self.decisions = 0  # every queue decision, timed or not
        self.decision_buckets = [0] * (len(DECISION_BUCKETS_MS) + 1)  # timed decisions, per bucket (not cumulative)
        self.decision_ms_sum = 0.0

    def batch(self, stage: str, record: BatchRecord, cold_ms: float) -> None:
        """A batch of ``stage`` was billed; ``cold_ms`` of it started its worker."""
        self.batches[stage] = self.batches.get(stage, 0) + 1
        self.calls[stage] = self.calls.get(stage, 0) + len(record.items)
        key = (record.hardware, record.config.vcpus, record.config.gpu_share)
        ms = self._batch_ms.get(key)
        if ms is None:
            ms = self._batch_ms[key] = [0.0, 0.0]
        cold = min(max(cold_ms, 0.0), record.duration_ms)
        ms[0] += record.duration_ms - cold
        ms[1] += cold

    def idle(self, record: IdleRecord) -> None:
        """A warm worker's idle interval closed."""
        key = (record.hardware, record.vcpus, record.gpu_share, record.vcpus_held)
        ms = self._idle_ms.get(key)
        if ms is None:
            ms = self._idle_ms[key] = [0.0, 0.0]
        ms[0] += record.loading_ms
        ms[1] += record.end_ms - record.start_ms - record.loading_ms

    def decided(self, stats: Iterable[DecisionStats]) -> None:
        """A round's queue decisions; those with a wall time go into the histogram."""
        for s in stats:
            self.decisions += 1
            if s.decision_ms is not None:
                self.decision_buckets[bisect.bisect_left(DECISION_BUCKETS_MS, s.decision_ms)] += 1
                self.decision_ms_sum += s.decision_ms

    def bill(self, prices: PriceSheet) -> dict[str, float]:
        """The bill so far by part (:data:`BILL_PARTS`), in dollars: each part only grows under one price sheet.

        Priced as :func:`~esg_prefect.model.attribution.attribute_costs` prices
        records: a batch at its worker's whole rate, idle time by the same rule
        (:func:`~esg_prefect.model.attribution.idle_rates`).
        """
        busy = cold = idle = 0.0
        for (hw, vcpus, share), (run_ms, cold_ms) in self._batch_ms.items():
            rate = prices.rate_per_s(vcpus, share, hw)
            busy += rate * run_ms / 1000.0
            cold += rate * cold_ms / 1000.0
        for (hw, vcpus, share, held), (load_ms, rest_ms) in self._idle_ms.items():
            loading, rest = idle_rates(prices, vcpus, share, hw, held)
            idle += (loading * load_ms + rest * rest_ms) / 1000.0
        return {"busy": busy, "cold_start": cold, "idle": idle}

    def copy(self) -> Totals:
        """A copy that the owner's later records leave alone (a snapshot's)."""
        out = Totals()
        out.batches, out.calls = dict(self.batches), dict(self.calls)
        out._batch_ms = {k: list(v) for k, v in self._batch_ms.items()}
        out._idle_ms = {k: list(v) for k, v in self._idle_ms.items()}
        out.decisions, out.decision_buckets = self.decisions, list(self.decision_buckets)
        out.decision_ms_sum = self.decision_ms_sum
        return out
