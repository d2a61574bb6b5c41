"""PALDIA's hardware selection: per stage, the cheapest hardware type that can carry its load.

PALDIA (IPDPS '24; ESG-SPEC section 7) serves each function on the cheapest
of several device types (CPU, GPU types of different prices and speeds) that
can carry the function's current load within its deadline, and moves it to a
faster type as the load grows. ESG alone picks the cheapest *placeable*
configuration per batch, over every type, blind to whether that type's pool
can carry the stage's load: a cheap pool fills with the stages that reached it
first, and the rest spill wherever a batch fits that instant. This module adds
the load view, as a filter on ESG's first-stage resources (knob
``ESGSettings.hardware_selection``, off by default so that the paper's ESG
stays the default).

Algorithm (each round, from the queues' arrival rates):

1. **Load estimator.** A queue's load is its ``arrival_rate_per_s``: the EWMA
   of inter-arrival gaps the runtime and the simulator keep per AFW queue
   (:mod:`esg_prefect.workload.rate`, weight ``rate_ewma_alpha``), smoothed
   again over time by the selector (an exponential average with a 1 s time
   constant: weight ``1 - exp(-dt / 1 s)`` for a value seen ``dt`` after the
   previous one). The queue's own estimate weighs each new gap by 0.2, so one
   burst moves it by tens of percent, and ESG's batching wants that; the
   hardware choice should follow the load, not a burst. Queues empty this
   round keep their last estimate. Rates are bucketed on a 10 %
   geometric grid, and the selection is made again when a queue appears or
   its rate has moved by two buckets (about 20 %) from the one the current
   selection was made with: re-evaluated as the load changes, not at every
   jitter of the estimate (without this margin the stages near a pool's limit
   flapped between two types from one round to the next).
2. **What a type can carry.** For stage ``s`` on type ``h``, a configuration
   ``(b, v, share)`` is *in deadline* when filling the batch at the current
   rate and running it fits the stage's budget:
   ``(b - 1) / rate + L(s, b, v, share, h) <= budget(s)``, where ``budget(s)``
   is its segment's SLO budget (dominator split) scaled by the stage's share
   of the segment's critical path. One *unit* of ``h`` is a whole GPU (a
   CPU's unit is one vCPU); a worker of that configuration takes ``share``
   units (``v`` on a CPU) and serves ``b / L`` requests per second. The type's
   throughput per unit is the best over in-deadline configurations, and its
   cost is the cheapest in-deadline configuration's cost per request.
3. **Cheapest type that carries it.** Queues, busiest first, each take the
   cheapest type whose units not yet taken, times ``hardware_utilization``
   (headroom: queueing grows without bound as a pool nears full use), carry
   ``rate / throughput per unit``; that share of the pool is then taken. A
   queue that no pool can carry gets the type with the most throughput left.
   Selections stick (:meth:`HardwareSelector._assign`): a queue keeps its type
   while that type still carries it, moves up at once when it no longer does,
   and moves down only to a type at least 10 % cheaper per request where it
   fits with 20 % to spare.
4. **Restricting ESG.** The queue's first-stage resources are filtered to the
   selected type, the types faster than it (lower minimum latency for the
   stage), and the types about as cheap per request (within the 10 % a move
   needs) whose pool could carry the load: a stage never uses a type too
   small or clearly too dear for its load, and may still overflow to faster
   ones while its type has no room this instant. Where the filter leaves
   nothing placeable, ESG's own choice stands (never worse than holding the
   jobs). Queues of unknown rate (0) are not restricted.

The downstream stages of ESG's plan are not filtered: they are planned again
in their own rounds (receding horizon), where their own selection applies.

Example:
    >>> from esg_prefect.model import (ConfigSpace, LatencyProfile, ProfilePoint, PriceSheet, Workflow,
    ...     ClusterSnapshot, Node, Device)
    >>> from esg_prefect.scheduling.settings import ESGSettings
    >>> from esg_prefect.scheduling.tables import CandidateTables
    >>> pts = [ProfilePoint("m", "cpu", b, 1, 0.0, 20.0 * b) for b in (1, 2, 4)]
    >>> pts += [ProfilePoint("m", "T4", b, 1, 1.0, 2.0 + b) for b in (1, 2, 4)]
    >>> s = ESGSettings(config_space=ConfigSpace((1, 2, 4), (1,), (0.0, 1.0)))
    >>> t = CandidateTables(LatencyProfile(pts), PriceSheet.from_hourly(0.04, {"T4": 0.35}), s)
    >>> sel = HardwareSelector(t, utilization=0.7)
    >>> cl = ClusterSnapshot([Node("n", 4)], [Device("n/gpu0", "n", "T4")])
    >>> wf = Workflow.chain("w", ["m"], slo_ms=100)
    >>> sel.select(wf, "m", 5.0, cl).hardware, sel.select(wf, "m", 500.0, cl).hardware
    ('cpu', 'T4')
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from esg_prefect.model.cluster import ClusterSnapshot
from esg_prefect.model.config import CPU, Config
from esg_prefect.model.jobs import QueueKey
from esg_prefect.model.slo import critical_path
from esg_prefect.model.workflow import Workflow
from esg_prefect.scheduling.base import Snapshot
from esg_prefect.scheduling.tables import CandidateTables, Resource

__all__ = ["HardwareSelector", "Selection", "TypeCapacity"]

_BUCKET = math.log(1.1)  # rates are compared on a 10 % geometric grid
_HYSTERESIS = 2  # buckets a queue's rate must move (about 20 %) before the selection is made again
_DOWNGRADE_MARGIN = 0.8  # a queue moves to a cheaper type only if it needs at most this much of what is left there
_MOVE_SAVING = 0.9  # ... and only if that type costs at most this much of its current one per request


@dataclass(frozen=True, slots=True)
class TypeCapacity:
    """What one hardware type can do for one stage at one load.

    Attributes:
        hardware: ``"cpu"`` or a GPU type.
        cost_per_request: cheapest in-deadline configuration's cost per request.
        per_unit_per_s: requests/s one unit (a whole GPU, or one vCPU) carries in deadline.
        units: units of this type in the cluster.
        min_latency_ms: the stage's least batch latency on this type (its speed).
    """

    hardware: str
    cost_per_request: float
    per_unit_per_s: float
    units: float
    min_latency_ms: float

    @property
    def capacity_per_s(self) -> float:
        """Requests/s the whole pool of this type carries for the stage."""
        return self.per_unit_per_s * self.units


@dataclass(frozen=True, slots=True)
class Selection:
    """The selector's answer for one queue.

    Attributes:
        hardware: the selected type (None: no restriction, e.g. unknown rate).
        allowed: the selected type and the faster ones.
        reason: a short account, for logs.
    """

    hardware: str | None
    allowed: frozenset[str] | None
    reason: str


class HardwareSelector:
    """Per-stage hardware selection from the queues' arrival rates (module docstring).

    Args:
        tables: ESG's candidate tables (latency model, prices, configuration space).
        utilization: fraction of a pool's throughput the selector plans to use, in (0, 1].
        smoothing_ms: time constant of the selector's own smoothing of the queues' rates.

    Raises:
        ValueError: on a utilization outside (0, 1], naming it.
    """

    def __init__(self, tables: CandidateTables, utilization: float = 0.7, smoothing_ms: float = 1000.0) -> None:
        if not (0.0 < utilization <= 1.0):
            raise ValueError(f"utilization must be in (0, 1], got {utilization!r}")
        if not (math.isfinite(smoothing_ms) and smoothing_ms > 0):
            raise ValueError(f"smoothing_ms must be a finite number > 0, got {smoothing_ms!r}")
        self.tables = tables
        self.utilization = utilization
        self.smoothing_ms = smoothing_ms
        self._rates: dict[QueueKey, float] = {}  # the smoothed load estimate per queue
        self._seen_ms: dict[QueueKey, float] = {}  # when each was last updated
        self._caps: dict[
            tuple[Workflow, str, int, frozenset[str], tuple[tuple[str, float], ...]], tuple[TypeCapacity, ...]
        ] = {}
        self._round: dict[QueueKey, Selection] = {}
        self._round_key: object = None
        self._buckets: dict[QueueKey, int] = {}  # the rate buckets the current selection was made with
        self._filtered: dict[tuple[QueueKey, frozenset[str]], tuple[tuple[Resource, ...], tuple[Resource, ...]]] = {}

    # ---- pools and capacities ----------------------------------------------------

    @staticmethod
    def units(cluster: ClusterSnapshot) -> dict[str, float]:
        """Units of each type: whole GPUs per GPU type, vCPUs (of every node) for ``"cpu"``."""
        out: dict[str, float] = {CPU: float(sum(n.vcpus for n in cluster.nodes))}
        for d in cluster.devices:
            out[d.hardware] = out.get(d.hardware, 0.0) + 1.0
        return out

    def stage_budget_ms(self, workflow: Workflow, stage: str, hardware: frozenset[str]) -> float:
        """The stage's part of its segment's SLO budget (its share of the segment's critical path)."""
        dist = self.tables.slo(workflow, hardware)
        seg = dist.segment_of(stage)
        path = critical_path(workflow, seg.stages, dist.min_latency_ms)
        weight = sum(dist.min_latency_ms[s] for s in path)
        budget = dist.budgets_ms[seg.index]
        return budget * (dist.min_latency_ms[stage] / weight if weight > 0 else 1.0 / len(path))

    def capacities(
        self, workflow: Workflow, stage: str, rate_per_s: float, cluster: ClusterSnapshot
    ) -> tuple[TypeCapacity, ...]:
        """Each type's cost and throughput for ``stage`` at ``rate_per_s``, cheapest first (cached per rate bucket).

        Types on which no configuration fits the stage's budget are left out.
        """
        units = self.units(cluster)
        present = cluster.hardware_types()
        bucket = _bucket(rate_per_s)
        key = (workflow, stage, bucket, present, tuple(sorted(units.items())))
        got = self._caps.get(key)
        if got is None:
            if len(self._caps) >= 4096:
                self._caps.clear()  # bounded memory; entries are cheap to rebuild
            got = self._caps[key] = self._capacities(workflow, stage, _unbucket(bucket), present, units)
        return got

    def _capacities(
        self, workflow: Workflow, stage: str, rate: float, present: frozenset[str], units: dict[str, float]
    ) -> tuple[TypeCapacity, ...]:
        t = self.tables
        budget = self.stage_budget_ms(workflow, stage, present)
        out = []
        for hw in sorted(present & t.profile.hardware_types(stage)):
            best_cost = math.inf
            best_rate = 0.0
            fastest = math.inf
            for v, share in t.resources(hw):
                per_worker_units = share if hw != CPU else float(v)
                for b in t.settings.config_space.batches:
                    lat = t.latency_ms(stage, b, v, share, hw)
                    if lat is None:
                        continue
                    fastest = min(fastest, lat)
                    fill_ms = (b - 1) / rate * 1000.0 if rate > 0 else (0.0 if b == 1 else math.inf)
                    if fill_ms + lat > budget:
                        continue
                    best_cost = min(best_cost, t.prices.cost_per_request(Config(b, v, share), hw, lat))
                    best_rate = max(best_rate, b / lat * 1000.0 / per_worker_units)
            if best_rate > 0:
                out.append(TypeCapacity(hw, best_cost, best_rate, units.get(hw, 0.0), fastest))
        out.sort(key=lambda c: (c.cost_per_request, c.min_latency_ms, c.hardware))
        return tuple(out)

    # ---- selection -----------------------------------------------------------------

    def select(self, workflow: Workflow, stage: str, rate_per_s: float, cluster: ClusterSnapshot) -> Selection:
        """The selection for one stage alone (its load the only one on the pools)."""
        return self._assign([(QueueKey(workflow.name, stage), workflow, rate_per_s)], cluster)[
            QueueKey(workflow.name, stage)
        ]

    def observe(self, snapshot: Snapshot, now_ms: float) -> None:
        """Smooth this round's rates (queues absent keep theirs) and select again if a load moved (docstring)."""
        for q in snapshot.queues:
            r = q.arrival_rate_per_s
            if r <= 0:
                continue
            old = self._rates.get(q.key)
            if old is None:
                self._rates[q.key] = r
            else:
                w = 1.0 - math.exp(-max(0.0, now_ms - self._seen_ms.get(q.key, now_ms)) / self.smoothing_ms)
                self._rates[q.key] = old + w * (r - old)
            self._seen_ms[q.key] = now_ms
        workflows, cluster = snapshot.workflows, snapshot.cluster
        buckets = {k: _bucket(r) for k, r in self._rates.items() if k.workflow in workflows}
        prev = self._buckets
        if (
            self._round_key == (cluster.nodes, cluster.devices)
            and buckets.keys() == prev.keys()
            and all(abs(b - prev[k]) < _HYSTERESIS for k, b in buckets.items())
        ):
            return  # no load moved enough since the last selection: keep it (no flapping on estimate jitter)
        self._round_key = (cluster.nodes, cluster.devices)
        self._buckets = buckets
        demand = [(k, workflows[k.workflow], _unbucket(b)) for k, b in sorted(buckets.items())]
        self._round = self._assign(demand, cluster, self._round)

    def selection(self, key: QueueKey) -> Selection | None:
        """This round's selection for ``key`` (None before any rate was seen)."""
        return self._round.get(key)

    def _assign(
        self,
        demand: list[tuple[QueueKey, Workflow, float]],
        cluster: ClusterSnapshot,
        previous: dict[QueueKey, Selection] | None = None,
    ) -> dict[QueueKey, Selection]:
        """Assign each queue a type (module docstring, step 3), sticking to ``previous`` where it still fits.

        Without stickiness, two queues competing for one pool swapped types
        whenever either load moved: the busiest-first pass gave the cheap pool
        to whichever was busier that round (measured on the heterogeneous case:
        a stage flipped between T4 and A100 13 times in 30 s, each flip
        starting workers on the new type while the old ones idled). So:

        1. queues keep their previous type while it still carries their load
           in what is left of it (busiest first), and reserve that share;
        2. queues without one, or whose type no longer carries them, take the
           cheapest type that does (upgrades are immediate: the SLO is at stake);
        3. a kept queue moves to a cheaper type only when that type saves at
           least 10 % per request and the queue fits there with
           ``_DOWNGRADE_MARGIN`` to spare (downgrades wait for a clear margin:
           they only save money, and undoing one costs cold starts; on the
           heterogeneous case T4 and A100 often cost within 2 % of each other
           per request for a ResNeXt stage, and which is cheaper changes with
           the rate).
        """
        previous = previous or {}
        left = {hw: u * self.utilization for hw, u in self.units(cluster).items()}
        out: dict[QueueKey, Selection] = {}
        caps_of: dict[QueueKey, tuple[TypeCapacity, ...]] = {}
        chosen_of: dict[QueueKey, TypeCapacity] = {}
        order = sorted(demand, key=lambda d: (-d[2], d[0]))  # busiest first
        rate_of = {key: rate for key, _, rate in order}
        for key, wf, rate in order:
            caps = caps_of[key] = self.capacities(wf, key.stage, rate, cluster) if rate > 0 else ()
            if not caps:
                out[key] = Selection(None, None, "no load estimate or no type within the budget: not restricted")
                continue
            prev = previous.get(key)
            kept = next((c for c in caps if prev is not None and c.hardware == prev.hardware), None)
            if kept is not None and rate / kept.per_unit_per_s <= left.get(kept.hardware, 0.0) + 1e-12:
                left[kept.hardware] -= rate / kept.per_unit_per_s
                chosen_of[key] = kept
        for key, _, rate in order:  # the rest: cheapest type that carries them
            caps = caps_of[key]
            if not caps or key in chosen_of:
                continue
            fits = [c for c in caps if rate / c.per_unit_per_s <= left.get(c.hardware, 0.0) + 1e-12]
            if fits:
                chosen = fits[0]
                left[chosen.hardware] -= rate / chosen.per_unit_per_s
            else:
                chosen = max(caps, key=lambda c: (left.get(c.hardware, 0.0) * c.per_unit_per_s, -c.min_latency_ms))
                left[chosen.hardware] = 0.0
            chosen_of[key] = chosen
        for key, _, rate in order:  # kept queues move to a cheaper type only with a clear margin
            cur = chosen_of.get(key)
            if cur is None or previous.get(key) is None or previous[key].hardware != cur.hardware:
                continue
            for c in caps_of[key]:
                if c.cost_per_request > cur.cost_per_request * _MOVE_SAVING:
                    break  # cheapest first: nothing clearly cheaper left
                need = rate / c.per_unit_per_s
                if need <= left.get(c.hardware, 0.0) * _DOWNGRADE_MARGIN:
                    left[cur.hardware] += rate / cur.per_unit_per_s
                    left[c.hardware] -= need
                    chosen_of[key] = c
                    break
        for key, chosen in chosen_of.items():
            rate = rate_of[key]
            need = rate / chosen.per_unit_per_s
            if need <= chosen.units * self.utilization + 1e-12:
                reason = f"{rate:.1f}/s fits {chosen.hardware} ({need:.2f} of {chosen.units:g} units)"
            else:
                reason = f"{rate:.1f}/s fits no pool; {chosen.hardware} has the most throughput left"
            allowed = frozenset(
                c.hardware
                for c in caps_of[key]
                if c.min_latency_ms <= chosen.min_latency_ms  # faster: overflow while the selected type is full
                or (  # as cheap within the saving a move needs, and able to carry the load: no reason to forbid it
                    c.cost_per_request * _MOVE_SAVING <= chosen.cost_per_request
                    and rate / c.per_unit_per_s <= c.units * self.utilization
                )
            )
            out[key] = Selection(chosen.hardware, allowed | {chosen.hardware}, reason)
        return out

    def restrict(self, key: QueueKey, resources: tuple[Resource, ...]) -> tuple[Resource, ...]:
        """``resources`` on the queue's allowed types; unchanged when unrestricted or when none is placeable.

        Returns the same tuple object for the same input and selection, so ESG's
        per-queue answer cache (which compares resources by identity) still hits.
        """
        sel = self._round.get(key)
        if sel is None or sel.allowed is None:
            return resources
        ck = (key, sel.allowed)
        got = self._filtered.get(ck)
        if got is not None and got[0] is resources:
            return got[1]
        kept = tuple(r for r in resources if r[0] in sel.allowed)
        result = kept if kept and len(kept) < len(resources) else resources  # nothing filtered: the same object
        if len(self._filtered) >= 4096:
            self._filtered.clear()  # bounded memory; entries are cheap to rebuild
        self._filtered[ck] = (resources, result)
        return result


def _bucket(rate: float) -> int:
    """The 10 % geometric bucket of a rate (rates at or below 0 share bucket -10**9)."""
    return round(math.log(rate) / _BUCKET) if rate > 0 else -(10**9)


def _unbucket(bucket: int) -> float:
    """The rate a bucket stands for (0 for the empty bucket)."""
    return 0.0 if bucket == -(10**9) else math.exp(bucket * _BUCKET)
