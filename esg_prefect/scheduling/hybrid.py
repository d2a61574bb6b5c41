"""PALDIA's hybrid spatio-temporal sharing: co-run beside busy tenants now, or wait for them.

PALDIA (IPDPS '24; ESG-SPEC section 7) lets a ready batch either share a
device *spatially* with tenants that are running (it starts now but runs
slower, by the interference slowdown measured in a co-run table) or share it
*temporally* (it waits until tenants finish and then runs faster), whichever
finishes within the deadline at lower cost. ESG places a batch wherever its
share fits and plans with the profile's latency alone, blind to the tenants
already busy on that device; the simulator (and a real GPU) then charge the
slowdown. This module adds that choice after ESG's own (knob
``ESGSettings.hybrid_sharing``, off by default so that the paper's ESG stays
the default).

How "free capacity" reads in esg-prefect: GPU shares are reserved per worker
(MPS percentages), so a batch never takes share that another worker holds; a
device is *free* for a batch when it has room and no busy tenant, *partly
busy* when it has room beside busy tenants. The review below runs for every
GPU dispatch ESG makes; it changes nothing when the chosen device has no busy
tenant. CPU dispatches are left as ESG made them: a busy CPU worker holds its
vCPUs exclusively in the capacity model, and the simulator charges no co-run
slowdown on CPUs.

Options for a batch of latency ``L`` alone (cold start ``C`` if any), due at
``D`` (the batch's deadline less the planned latency of the stages after it
in the segment: they need their part of the slack too), with ``k`` busy
tenants on the device ESG chose:

* **co-run now** on that device, or on another device of the same type that
  has room for the same resources (an idle warm worker of the same stage and
  resources, or a cold start that evicts nobody) with ``k'`` busy tenants:
  ends at ``now + C + L * S(k')``;
* **wait** on the chosen device until the ``j``-th of its tenants ends
  (``j = 1..k``), then run beside the ``k - j`` left: ends at
  ``end_j + C + L * S(k - j)``.

``S`` is :class:`~esg_prefect.model.interference.CoRunModel` (measured
co-run table, documented GPU default). The cost of an option is the batch's
resources held for its duration (the price sheet's cost model): a slower
co-run costs more; waiting costs the batch nothing (its worker is not held
yet). Choice: the cheapest option that ends by ``D`` (ties: the earlier; a
wait must end by ``D`` with :data:`WAIT_MARGIN` of its finish time to
spare); when none does, the one that ends first. A *wait* becomes a hold; the next
round decides again with what has changed.

When tenants end is a prediction: this module keeps, per device, the
predicted end of every batch it saw dispatched (dispatch time plus predicted
latency, co-run slowdown included). At each round the snapshot says how many
workers are busy on each device; the latest of those predictions are kept
(the earliest are the ones most likely done), a prediction already passed
counts as "ending now", and a busy worker with no prediction (started by
another scheduler object, or before this one) is assumed to end after the
largest batch of the space on its resources, an upper bound, so that waiting
for it never looks better than it is (never, where its stage has no profile).
An estimate, once made, is kept in later rounds like a recorded prediction,
so that it does not slide forward while the worker stays busy. The decision reads no clock: it is a
function of the snapshot, ``now_ms`` and the dispatches this object made.

Example:
    >>> # 20 ms alone, 3 tenants busy (slowdown 1.45: 29 ms); the first ends in 4 ms (then 1.3: 26 ms)
    >>> choose([RunOption("run", 0.0, 29.0, 29.0), RunOption("wait", 4.0, 26.0, 30.0)], deadline_ms=35.0).kind
    'wait'
    >>> choose([RunOption("run", 0.0, 29.0, 29.0), RunOption("wait", 4.0, 26.0, 30.0)], deadline_ms=29.5).kind
    'run'
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from esg_prefect.model.cluster import ClusterSnapshot
from esg_prefect.model.config import CPU
from esg_prefect.model.interference import CoRunModel
from esg_prefect.scheduling.base import Placement
from esg_prefect.scheduling.dispatch import ClusterView
from esg_prefect.scheduling.tables import CandidateTables, Choice

__all__ = ["WAIT_MARGIN", "HybridSharing", "HybridVerdict", "RunOption", "choose"]

WAIT_MARGIN = 0.2
"""A wait must end by its deadline with this fraction of its finish time to spare (see :func:`choose`).

Measured on the heterogeneous case (E8, seeds 0, 1, 3, 4): with no margin,
hybrid sharing was 2 % dearer than ESG on one seed and met 0.8 points fewer
SLOs on two; with 0.2 it was 0-32 % cheaper than ESG (batch cost; at parity
on seed 4), at the same mean SLO hit rate (0.993).
"""


@dataclass(frozen=True, slots=True)
class RunOption:
    """One way to run a batch: now (``"run"``) or after waiting (``"wait"``).

    Attributes:
        kind: ``"run"`` or ``"wait"``.
        wait_ms: time until it starts.
        busy_ms: time the worker is held (cold start + latency with slowdown): its cost.
        finish_ms: time from now until it ends.
        placement: where (None in hand-built examples).
        co_runners: busy tenants beside it while it runs.
    """

    kind: str
    wait_ms: float
    busy_ms: float
    finish_ms: float
    placement: Placement | None = None
    co_runners: int = 0


def choose(options: Sequence[RunOption], deadline_ms: float, wait_margin: float = 0.0) -> RunOption:
    """The cheapest option ending by ``deadline_ms`` (from now), else the one ending first.

    Cost is the worker time held (``busy_ms``): the batch's resources are the
    same in every option, so its price is proportional to it. A *wait* counts
    as ending in time only if it ends by the deadline with ``wait_margin``
    (a fraction of its finish time) to spare: its start rests on predicted
    ends of other batches, which run slower when more tenants join them.

    Raises:
        ValueError: when ``options`` is empty.
    """
    if not options:
        raise ValueError("choose needs at least one option")
    ok = [o for o in options if o.finish_ms * (1.0 + wait_margin if o.kind == "wait" else 1.0) <= deadline_ms]
    if ok:
        return min(ok, key=lambda o: (o.busy_ms, o.finish_ms, o.kind))
    return min(options, key=lambda o: (o.finish_ms, o.busy_ms, o.kind))


@dataclass(frozen=True, slots=True)
class HybridVerdict:
    """The review of one dispatch.

    Attributes:
        wait: hold the batch (temporal sharing) instead of running it now.
        placement: where it runs (ESG's, or a less busy device of the same type).
        latency_ms: predicted batch time, slowdown and cold start included.
        co_runners: busy tenants beside it.
        reason: a short account, for logs.
    """

    wait: bool
    placement: Placement
    latency_ms: float
    co_runners: int
    reason: str


class HybridSharing:
    """Co-run-or-wait review of ESG's dispatches (module docstring).

    Args:
        tables: ESG's candidate tables (latencies for the fallback end predictions).
        model: the co-run slowdown model.
    """

    def __init__(self, tables: CandidateTables, model: CoRunModel) -> None:
        self.tables = tables
        self.model = model
        self._ends: dict[str, list[float]] = {}  # device -> predicted ends of the batches seen dispatched there
        self._busy: dict[str, int] = {}  # device -> busy workers now (the snapshot's, plus this round's dispatches)

    def begin_round(self, cluster: ClusterSnapshot, now_ms: float) -> None:
        """Reconcile the predicted ends with the busy workers of ``cluster`` (module docstring)."""
        busy: dict[str, list[float]] = {}
        top = self.tables.settings.config_space.max_batch
        for w in cluster.workers:
            if w.busy and w.device_id is not None and w.stage is not None:
                lat = self.tables.latency_ms(w.stage, top, w.vcpus, w.gpu_share, w.hardware)
                busy.setdefault(w.device_id, []).append(now_ms + lat if lat is not None else math.inf)
        ends: dict[str, list[float]] = {}
        for dev, fallback in busy.items():
            known = sorted(self._ends.get(dev, ()))[-len(fallback) :]
            missing = sorted(fallback)[: len(fallback) - len(known)]
            ends[dev] = sorted(max(now_ms, e) for e in (*known, *missing))
        self._ends = ends
        self._busy = {dev: len(v) for dev, v in ends.items()}

    def busy_on(self, device_id: str) -> int:
        """Busy workers on a device now, this round's dispatches included."""
        return self._busy.get(device_id, 0)

    def review(self, c: Choice, placement: Placement, view: ClusterView, now_ms: float, due_ms: float) -> HybridVerdict:
        """Co-run now (here or on a less busy device of the type) or wait, for ESG's dispatch ``c`` at ``placement``.

        Args:
            c: ESG's choice (its ``latency_ms`` includes the cold start when ``c.cold``).
            placement: ESG_Dispatch's placement for it.
            view: the round's cluster view (for alternative placements).
            now_ms: the time of the round.
            due_ms: absolute time by which the batch should end.
        """
        if placement.device_id is None or c.hardware == CPU:
            return HybridVerdict(False, placement, c.latency_ms, 0, "CPU: no co-run review")
        cold_ms = self.tables.profile.cold_start_ms(c.stage, c.hardware) if c.cold else 0.0
        alone = max(0.0, c.latency_ms - cold_ms)
        options: list[RunOption] = []
        for p in self._placements(c, placement, view):
            assert p.device_id is not None
            k = self.busy_on(p.device_id)
            busy = (cold_ms if p.cold else 0.0) + alone * self.model.slowdown(c.stage, c.hardware, k)
            options.append(RunOption("run", 0.0, busy, busy, p, k))
        assert placement.device_id is not None
        k = self.busy_on(placement.device_id)
        for j, end in enumerate(self._ends.get(placement.device_id, ())[:k], start=1):
            wait = max(0.0, end - now_ms)
            busy = cold_ms + alone * self.model.slowdown(c.stage, c.hardware, k - j)
            options.append(RunOption("wait", wait, busy, wait + busy, placement, k - j))
        best = choose(options, due_ms - now_ms, WAIT_MARGIN)
        assert best.placement is not None
        if best.kind == "wait":
            return HybridVerdict(
                True,
                best.placement,
                best.busy_ms,
                best.co_runners,
                f"hybrid: wait {best.wait_ms:.1f} ms for {k - best.co_runners} of {k} tenants of "
                f"{placement.device_id} (runs {best.busy_ms:.1f} ms, beside {best.co_runners})",
            )
        return HybridVerdict(
            False,
            best.placement,
            best.busy_ms,
            best.co_runners,
            f"hybrid: co-run now beside {best.co_runners} busy tenant(s) of {best.placement.device_id}",
        )

    def committed(self, placement: Placement, now_ms: float, latency_ms: float) -> None:
        """Record a dispatch made this round: its device has one more busy tenant until ``now + latency``."""
        dev = placement.device_id
        if dev is None:
            return
        self._busy[dev] = self._busy.get(dev, 0) + 1
        ends = self._ends.setdefault(dev, [])
        ends.append(now_ms + latency_ms)
        ends.sort()

    def _placements(self, c: Choice, placement: Placement, view: ClusterView) -> list[Placement]:
        """ESG's placement first, then the same resources elsewhere on the type without evicting anyone."""
        v, share, hw = c.config.vcpus, c.config.gpu_share, c.hardware
        out = [placement]
        seen = {placement.device_id}
        if placement.worker_id is not None:
            for w in view.idle_warm(c.stage, v, share, hw):
                if w.device_id not in seen and view.free_vcpus[w.node] >= v:
                    seen.add(w.device_id)
                    out.append(Placement(w.node, w.device_id, w.worker_id, 2))
            return out
        if placement.evict:
            return out
        need = round(share * 100)
        for dev_id, d in view.devices.items():
            if d.hardware != hw or dev_id in seen:
                continue
            if view._room(d.node, dev_id, v, need) == ():  # fits with no eviction
                seen.add(dev_id)
                out.append(Placement(d.node, dev_id, None, 4))
        return out
