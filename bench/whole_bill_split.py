"""One run's bill in the whole-bill bench: busy, idle and cold dollars, and where the idle went.

``bench/whole_bill.py``'s docstring defines the split (its "Bill." part): over
the report's window, each batch's cold start and each pre-warm start's load are
cold, the rest of the batches' time busy, the rest of the idle time idle, the
three adding up to the report's busy plus idle cost. Kept apart from the bench's
grid and runs so the accounting reads on its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from esg_prefect.model.attribution import idle_cost_split
from esg_prefect.model.window import after_warmup
from esg_prefect.simulator.case import Case
from esg_prefect.simulator.run import SimRun


@dataclass(frozen=True, slots=True)
class Bill:
    """Dollars billed in the report's window, split three ways (module docstring), and where the idle went.

    ``idle_gaps`` is the part of ``idle`` between two batches of one worker (a
    share held while its stage's calls come too sparse to keep it busy); the
    rest of ``idle`` lies before a worker's first batch or after its last (the
    lifecycle: pre-warm waits and keep-alive tails). ``share_busy`` and
    ``share_held`` are GPU-share-seconds busy and held (busy, cold or idle).
    """

    busy: float
    idle: float
    cold: float
    idle_gaps: float = 0.0
    share_busy: float = 0.0
    share_held: float = 0.0

    @property
    def whole(self) -> float:
        """Everything billed."""
        return self.busy + self.idle + self.cold

    @property
    def share_utilisation(self) -> float:
        """Share-seconds busy over share-seconds held (1.0 with nothing held)."""
        return self.share_busy / self.share_held if self.share_held > 0 else 1.0


def bill_split(run: SimRun, case: Case) -> Bill:
    """Busy, idle and cold dollars of ``run`` in its report's window, and the idle's breakdown (:class:`Bill`)."""
    w0 = case.warmup_s * 1000.0
    prices = case.prices
    cold_of: dict[str, float] = {}
    for s in run.stages:
        if s.cold_start_ms > 0:
            cold_of[s.batch_id] = max(cold_of.get(s.batch_id, 0.0), s.cold_start_ms)
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for b in run.batches:
        first[b.worker_id] = min(first.get(b.worker_id, math.inf), b.start_ms)
        last[b.worker_id] = max(last.get(b.worker_id, -math.inf), b.end_ms)
    window = after_warmup((), (), run.batches, run.idles, w0)  # the report's cut: idle time and its loads in it
    busy = idle = cold = gaps = share_busy = share_held = 0.0
    for b in window.batches:
        rate = prices.rate_per_s(b.config.vcpus, b.config.gpu_share, b.hardware)
        dur = b.end_ms - b.start_ms
        c = min(cold_of.get(b.batch_id, 0.0), dur)
        cold += rate * c / 1000.0
        busy += rate * (dur - c) / 1000.0
        share_busy += b.config.gpu_share * (dur - c) / 1000.0
        share_held += b.config.gpu_share * dur / 1000.0
    for i in window.idles:
        loading, waiting = idle_cost_split(i, prices)  # a pre-warm start's load: vCPUs held too
        cold += loading
        idle += waiting
        if first.get(i.worker_id, math.inf) < i.start_ms and i.end_ms <= last.get(i.worker_id, -math.inf):
            gaps += waiting
        share_held += i.gpu_share * (i.end_ms - i.start_ms) / 1000.0
    return Bill(busy, idle, cold, gaps, share_busy, share_held)
