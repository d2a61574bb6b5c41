"""The workers of a pool: placement, capacity, keep-alive, expiry and their billing records.

One bookkeeping for the runtime and the simulator. It holds what a worker
backend holds (nodes, GPU devices, worker processes bound to ``(device,
gpu_share, vcpus)`` with one stage's model warm) and bills them as ESG-SPEC
section 6 says: a batch's record spans its dispatch to its end (a cold start
included); a warm worker's idle time between batches, and after its last batch
until its keep-alive runs out, is an idle record. It applies a scheduler's
placements exactly as given and raises when one does not fit, so a scheduler
bug cannot pass unnoticed.

Capacity follows :class:`~esg_prefect.model.cluster.Node`: a worker's vCPUs
are taken only while it runs a batch (an idle worker sleeps), its worker slot
on the node (``max_workers``), its GPU share and its MPS client slot for its
whole life. No clock: every change carries its time.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Mapping

from esg_prefect.control.keepalive import SCALE_DOWN_WINDOW_MS, AdaptiveKeepAlive, BusyAverage, adaptive_keep_alive
from esg_prefect.control.ring import Ring
from esg_prefect.control.totals import Totals
from esg_prefect.control.worker import FleetWorker
from esg_prefect.exceptions import InvalidInputError, PriceError
from esg_prefect.model.attribution import BatchRecord, IdleRecord, idle_rates
from esg_prefect.model.cluster import ClusterSnapshot, Device, Node, Worker
from esg_prefect.model.config import Config
from esg_prefect.model.pricing import PriceSheet
from esg_prefect.scheduling.base import Placement
from esg_prefect.scheduling.settings import PlatformSettings


def _unchecked_snapshot(
    nodes: tuple[Node, ...], devices: tuple[Device, ...], workers: tuple[Worker, ...]
) -> ClusterSnapshot:
    """A :class:`ClusterSnapshot` built without its O(workers) consistency check.

    The fleet checks every placement as it applies it (and raises on any that
    does not fit), so its state is consistent by construction; repeating the
    snapshot's check after every change of a fleet with hundreds of warm
    workers cost more than the scheduling itself. Tests build checked
    snapshots from the same state (``ClusterSnapshot(...)``) and compare.
    """
    snap = object.__new__(ClusterSnapshot)
    object.__setattr__(snap, "nodes", nodes)
    object.__setattr__(snap, "devices", devices)
    object.__setattr__(snap, "workers", workers)
    object.__setattr__(snap, "_index", {})
    return snap


class Fleet:
    """Nodes, devices and workers; their billing records; keep-alive expiry.

    Args:
        nodes: the machines.
        devices: their GPUs.
        keep_alive_ms: how long an idle worker is kept.
        keep_alive_scales: per hardware type, the fraction of ``keep_alive_ms`` its
            idle workers get (``ESGSettings.keep_alive_by_price``); None: all of it.
        adaptive: keep-alive from the stages' measured idle gaps, within the
            above (``ESGSettings.keep_alive_policy``); None: the fixed window.
        record_memory: keep only the newest this many batch and idle records, still
            numbered among all (:class:`~esg_prefect.control.ring.Ring`); None: all, in lists.
    """

    def __init__(
        self,
        nodes: Iterable[Node],
        devices: Iterable[Device],
        keep_alive_ms: float,
        keep_alive_scales: Mapping[str, float] | None = None,
        adaptive: AdaptiveKeepAlive | None = None,
        record_memory: int | None = None,
    ) -> None:
        self.keep_alive_ms = keep_alive_ms
        self._keep_alive_scales = dict(keep_alive_scales or {})
        self.adaptive = adaptive
        # Workers started for best-effort dispatches that no planned dispatch has used since
        # (ESGSettings.best_effort_keep_alive, in cold starts; the core marks them).
        self.best_effort: set[str] = set()
        self.best_effort_keep_alive = 0.0
        self.cold_start_ms: Callable[[str, str], float] | None = None
        self.rearmed_ms: float | None = None
        self._per_stage: dict[str, int] = {}  # live workers per stage
        self._of_stage: dict[str, dict[str, FleetWorker]] = {}  # live workers per stage, by id
        self.busy = BusyAverage(SCALE_DOWN_WINDOW_MS)  # busy workers per stage, averaged over time
        self.scale_down_utilization = 0.0  # 0: off; set by the control core from the platform settings
        self.scale_down_waves = 0.0  # the same for a stage in waves, its surplus kept a lull; 0: off
        self.idle_vcpus = False  # idle workers hold their vCPUs (billed); set by the control core from the settings
        self.prices: PriceSheet | None = None  # what idle time costs (set by the core); None: every worker priced
        self.workers: dict[str, FleetWorker] = {}
        self.batches: list[BatchRecord] | Ring[BatchRecord] = [] if record_memory is None else Ring(record_memory)
        self.idles: list[IdleRecord] | Ring[IdleRecord] = [] if record_memory is None else Ring(record_memory)
        self.totals: Totals | None = None  # running totals, where a driver keeps them (the pool's /metrics)
        self.cold_starts = 0
        self._next_worker = 0
        self._expiries: list[tuple[float, int, str, int]] = []  # (at, seq, worker id, token): a heap
        self._expiry_seq = 0
        self.nodes: tuple[Node, ...] = ()
        self.set_resources(nodes, devices)

    def configure(
        self, settings: PlatformSettings, cold_start_ms: Callable[[str, str], float], prices: PriceSheet
    ) -> None:
        """The platform's lifecycle knobs, its stages' cold starts and its prices: one place for every driver."""
        if self.adaptive is None:
            self.adaptive = adaptive_keep_alive(settings, cold_start_ms)
        self.scale_down_utilization = settings.scale_down_utilization
        self.scale_down_waves = settings.scale_down_waves
        self.idle_vcpus = settings.idle_vcpus
        self.best_effort_keep_alive = settings.best_effort_keep_alive
        self.cold_start_ms = cold_start_ms
        self.prices = prices

    def set_keep_alive(self, keep_alive_ms: float, scales: Mapping[str, float] | None = None) -> None:
        """Keep-alive from now on (workers already idle keep the expiry they were given)."""
        self.keep_alive_ms = keep_alive_ms
        self._keep_alive_scales = dict(scales or {})

    def set_resources(self, nodes: Iterable[Node], devices: Iterable[Device]) -> None:
        """The machines and GPUs now (a backend's nodes can come and go); live workers keep what they hold."""
        base = ClusterSnapshot(tuple(nodes), tuple(devices), ())
        self.nodes = base.nodes
        self.devices = {d.device_id: d for d in base.devices}
        self._device_tuple = tuple(base.devices)
        self._free_vcpus = {n.name: n.vcpus for n in self.nodes}  # vCPUs not used by busy workers
        self._max_workers = {n.name: n.max_workers for n in self.nodes}
        self._workers_on = {n.name: 0 for n in self.nodes}
        self._free_share = {d: 100 for d in self.devices}
        self._clients = {d: 0 for d in self.devices}
        for w in self.workers.values():
            if w.node in self._free_vcpus:
                self._workers_on[w.node] += 1
                if w.busy:
                    self._free_vcpus[w.node] -= w.vcpus
            if w.device_id in self._free_share:
                self._free_share[w.device_id] -= round(w.share * 100)
                self._clients[w.device_id] += 1
        self._snapshot: ClusterSnapshot | None = None
        self._hardware = base.hardware_types()

    # ---- the scheduler's view ----------------------------------------------------

    def snapshot(self) -> ClusterSnapshot:
        """The fleet now, rebuilt only after a change."""
        if self._snapshot is None:
            self._snapshot = _unchecked_snapshot(
                self.nodes, self._device_tuple, tuple([w.as_worker() for w in self.workers.values()])
            )
        return self._snapshot

    def hardware_types(self) -> frozenset[str]:
        """``"cpu"`` and every GPU type present."""
        return self._hardware

    def idle_is_free(self, hardware: str, vcpus: int, share: float) -> bool:
        """Whether a worker's idle time costs nothing (its idle rate on the price sheet, ``idle_vcpus`` counted).

        The one place the keep-alive reads a price, once per worker as it starts (its price and shape do not
        change while it lives; the answer is kept as :attr:`FleetWorker.idle_free`). Such a worker gains nothing
        by stopping early, so no rule that cuts idle time short applies to it (:meth:`keep_alive_of`,
        scale-down); the fixed window still ends it, as it holds node capacity. An unknown sheet or an unpriced
        type counts as priced.
        """
        if self.prices is None:
            return False
        try:
            return idle_rates(self.prices, vcpus, share, hardware, self.idle_vcpus)[1] <= 0.0
        except PriceError:
            return False

    def keep_alive_of(self, w: FleetWorker) -> float:
        """How long ``w`` is kept once idle, in ms: the whole fixed window when its idle time is free."""
        if w.idle_free:
            return self.keep_alive_ms  # keep-alive by price reads a zero price as the whole window
        fixed = self.keep_alive_ms * self._keep_alive_scales.get(w.hardware, 1.0)
        if w.worker_id in self.best_effort and self._per_stage.get(w.stage, 0) > 1 and self.cold_start_ms is not None:
            return min(fixed, self.best_effort_keep_alive * self.cold_start_ms(w.stage, w.hardware))
        if self.adaptive is None or self._per_stage.get(w.stage, 0) <= 1:
            return fixed  # a stage's last worker keeps the fixed window: bursts after a lull find it warm
        # By price too (keep_alive_by_price): a dear worker's gaps earn it less time, and once it
        # expires the next start may land on the cheapest type that fits.
        scale = self._keep_alive_scales.get(w.hardware, 1.0)
        return scale * self.adaptive.keep_alive_ms(w.stage, self.keep_alive_ms, w.worker_id, w.hardware)

    # ---- applying a placement ------------------------------------------------------

    def acquire(self, placement: Placement, stage: str, config: Config, hardware: str, now_ms: float) -> FleetWorker:
        """The worker a dispatch runs on: an idle warm one, or a new one (after evictions).

        Raises:
            InvalidInputError: when the placement names a missing, busy or
                mismatched worker, or does not fit the free capacity.
        """
        for wid in placement.evict:
            victim = self.workers.get(wid)
            if victim is None or victim.busy:
                raise InvalidInputError(f"placement evicts {wid!r}, which is {'busy' if victim else 'unknown'}")
            self.retire(victim, now_ms)
        if placement.worker_id is not None:
            w = self.workers.get(placement.worker_id)
            if w is None or w.busy:
                raise InvalidInputError(
                    f"dispatch to worker {placement.worker_id!r}, which is {'busy' if w else 'unknown'}"
                )
            if not (
                w.stage == stage and w.vcpus == config.vcpus and w.share == config.gpu_share and w.hardware == hardware
            ):
                raise InvalidInputError(
                    f"dispatch of {stage} with {config} on {hardware} to worker {w.worker_id}, which holds "
                    f"{w.stage} with vcpus={w.vcpus} share={w.share} on {w.hardware}"
                )
            free = self._free_vcpus.get(w.node, 0)
            if free < w.vcpus:
                raise InvalidInputError(
                    f"dispatch to worker {w.worker_id} needs {w.vcpus} vCPUs on {w.node}, {free} free"
                )
            self._free_vcpus[w.node] = free - w.vcpus
            gaps = self.adaptive
            if (
                gaps is not None
                and w.idle_since_ms is not None
                and gaps.observe(w.stage, now_ms - w.idle_since_ms, w.worker_id)
            ):
                self._rearm(w.stage, w, now_ms)
            self._close_idle(w, now_ms)
            w.idle_since_ms = None
            w.fresh = False
            self.busy.change(w.stage, now_ms, 1)
            w.expiry_token += 1
            w.view = None
            self._snapshot = None
            return w
        w = self._start(placement, stage, config, hardware)
        self.busy.change(stage, now_ms, 1)
        return w

    def prewarm(self, placement: Placement, stage: str, config: Config, hardware: str, now_ms: float) -> FleetWorker:
        """Start a worker with no batch (a :class:`~esg_prefect.scheduling.base.Start`); :meth:`warmed` ends it.

        It holds its vCPUs and GPU share while it loads, like a batch's cold start.

        Raises:
            InvalidInputError: when the placement names a worker or does not fit.
        """
        if placement.worker_id is not None:
            raise InvalidInputError(f"a pre-warm start names worker {placement.worker_id!r}; it must place a new one")
        w = self.acquire(placement, stage, config, hardware, now_ms)
        w.starting = now_ms
        return w

    def warmed(self, w: FleetWorker, now_ms: float) -> float:
        """A pre-warm start is done at ``now_ms``: the worker is idle and warm; returns when its keep-alive runs out.

        Its idle time is counted from the start's beginning, so the load is billed
        (as the first part of its first idle interval, with the vCPUs it held,
        attributed to the runs of the worker's first batch).
        """
        if w.starting is None:
            raise InvalidInputError(f"worker {w.worker_id} is not starting")
        since, w.starting = w.starting, None
        w.fresh = True
        w.loaded_ms = max(since, now_ms)
        return self._to_idle(w, since)

    def finish(self, w: FleetWorker, record: BatchRecord, now_ms: float) -> float:
        """End a batch: bill it, make the worker idle; returns when its keep-alive runs out."""
        self.batches.append(record)
        return self._to_idle(w, now_ms)

    def lose(self, w: FleetWorker, record: BatchRecord | None = None) -> None:
        """A worker died (its batch, if any, billed up to its death): its capacity is free, no idle time."""
        if record is not None:
            self.batches.append(record)
        if self.workers.pop(w.worker_id, None) is None:
            return
        if w.busy:
            self.busy.change(w.stage, self.busy.last_ms(w.stage), -1)
        self._gone(w)
        if w.node in self._workers_on:
            self._workers_on[w.node] -= 1
            if w.busy:
                self._free_vcpus[w.node] += w.vcpus
        self._free_gpu(w)
        self._snapshot = None

    def _rearm(self, stage: str, reused: FleetWorker, now_ms: float) -> None:
        """The stage's gaps now set its keep-alive: its idle workers, kept the fixed window so far, follow it.

        ``rearmed_ms`` is the earliest new expiry, for the driver's wake-up (the core reads and clears it).
        """
        for w in self.workers.values():
            if w is reused or w.stage != stage or w.idle_since_ms is None:
                continue
            at = self._arm(w, w.idle_since_ms, now_ms)
            self.rearmed_ms = at if self.rearmed_ms is None else min(self.rearmed_ms, at)

    def _arm(self, w: FleetWorker, since_ms: float, not_before_ms: float | None = None) -> float:
        w.expiry_token += 1
        at = since_ms + self.keep_alive_of(w)
        if not_before_ms is not None and at < not_before_ms:
            at = not_before_ms  # already past: it expires now
        self._expiry_seq += 1
        heapq.heappush(self._expiries, (at, self._expiry_seq, w.worker_id, w.expiry_token))
        return at

    def _to_idle(self, w: FleetWorker, since_ms: float) -> float:
        """Give back the vCPUs ``w`` held while busy and count it idle from ``since_ms``; its expiry time."""
        if w.node in self._free_vcpus:
            self._free_vcpus[w.node] += w.vcpus
        w.idle_since_ms = since_ms
        w.free_at_ms = None
        w.view = None
        self._snapshot = None
        self.busy.change(w.stage, since_ms, -1)
        at = self._arm(w, since_ms)
        if self.adaptive is not None:
            if self.scale_down_waves > 0 and self.adaptive.waves.in_waves(w.stage):
                self._scale_down(w.stage, since_ms, self.scale_down_waves, lull=True)
            elif self.scale_down_utilization > 0:
                self._scale_down(w.stage, since_ms, self.scale_down_utilization)
        return at

    def _scale_down(self, stage: str, now_ms: float, utilization: float, lull: bool = False) -> None:
        """Past the workers a stage's measured load needs, its longest-idle workers get a short keep-alive.

        Needed: the stage's busy workers averaged over time (:class:`~esg_prefect.control.keepalive.BusyAverage`)
        over ``utilization``, at least one. The surplus that idled longest (no load comes back to them: the placement
        reuses the most recently idle first) expire after the floor, not the gaps' percentile; with ``lull`` (a
        stage in waves) after a lull, floor or not, but a pre-warmed worker with no batch yet keeps the usual rule.
        A worker whose idle time is free (:attr:`FleetWorker.idle_free`) is never surplus to cut: stopping it
        saves nothing.
        """
        assert self.adaptive is not None
        live = self._of_stage.get(stage)
        if not live:
            return
        needed = max(1, math.ceil(self.busy.value(stage, now_ms) / utilization))
        surplus = len(live) - needed
        if surplus <= 0:
            return
        idle = sorted(
            (w for w in live.values() if w.idle_since_ms is not None and w.starting is None and not w.idle_free),
            key=lambda w: (w.idle_since_ms, w.worker_id),
        )
        for w in idle[:surplus]:
            assert w.idle_since_ms is not None
            if lull and w.fresh:
                continue
            short = self.adaptive.lull_ms(stage, w.hardware) if lull else self.adaptive.floor_ms(stage, w.hardware)
            keep = min(short, self.keep_alive_of(w))
            at = max(now_ms, w.idle_since_ms + keep)
            w.expiry_token += 1
            self._expiry_seq += 1
            heapq.heappush(self._expiries, (at, self._expiry_seq, w.worker_id, w.expiry_token))
            self.rearmed_ms = at if self.rearmed_ms is None else min(self.rearmed_ms, at)

    def _start(self, placement: Placement, stage: str, config: Config, hardware: str) -> FleetWorker:
        node, dev = placement.node, placement.device_id
        need = round(config.gpu_share * 100)
        if node not in self._free_vcpus:
            raise InvalidInputError(f"placement on unknown node {node!r}")
        if self._free_vcpus[node] < config.vcpus:
            raise InvalidInputError(
                f"placement of {stage} needs {config.vcpus} vCPUs on {node}, {self._free_vcpus[node]} free"
            )
        limit = self._max_workers[node]
        if limit is not None and self._workers_on[node] >= limit:
            raise InvalidInputError(f"placement of {stage} on {node}: all {limit} worker slots are taken")
        if (dev is None) != (need == 0):
            raise InvalidInputError(f"placement device {dev!r} does not fit gpu_share {config.gpu_share}")
        if dev is not None:
            d = self.devices.get(dev)
            if d is None or d.node != node or d.hardware != hardware:
                raise InvalidInputError(f"placement names device {dev!r}, not a {hardware} on node {node}")
            if self._free_share[dev] < need or self._clients[dev] >= d.max_clients:
                raise InvalidInputError(
                    f"placement of {stage} needs share {config.gpu_share} of {dev}: "
                    f"{self._free_share[dev] / 100:.2f} free, {self._clients[dev]} clients"
                )
            self._free_share[dev] -= need
            self._clients[dev] += 1
        self._free_vcpus[node] -= config.vcpus
        self._workers_on[node] += 1
        self._next_worker += 1
        free = self.idle_is_free(hardware, config.vcpus, config.gpu_share)
        w = FleetWorker(f"w{self._next_worker}", node, dev, hardware, config.vcpus, config.gpu_share, stage, free)
        self.workers[w.worker_id] = w
        self._per_stage[stage] = self._per_stage.get(stage, 0) + 1
        self._of_stage.setdefault(stage, {})[w.worker_id] = w
        self.cold_starts += 1
        self._snapshot = None
        return w

    def _free_gpu(self, w: FleetWorker) -> None:
        if w.device_id is not None and w.device_id in self._free_share:
            self._free_share[w.device_id] += round(w.share * 100)
            self._clients[w.device_id] -= 1

    def retire(self, w: FleetWorker, now_ms: float) -> None:
        """Stop an idle worker now (eviction, keep-alive expiry or the end of a run)."""
        self._close_idle(w, now_ms)
        del self.workers[w.worker_id]
        self._gone(w)
        if w.node in self._workers_on:
            self._workers_on[w.node] -= 1
        self._free_gpu(w)
        self._snapshot = None

    def _gone(self, w: FleetWorker) -> None:
        """Forget a stopped worker; a stage left with one idle worker gives it the fixed window again."""
        self.best_effort.discard(w.worker_id)
        left = self._per_stage[w.stage] = self._per_stage.get(w.stage, 1) - 1
        self._of_stage.get(w.stage, {}).pop(w.worker_id, None)
        if self.adaptive is None:
            return
        self.adaptive.forget(w.worker_id)
        if left == 1:
            last = next(x for x in self.workers.values() if x.stage == w.stage)
            if last.idle_since_ms is not None and last.starting is None:
                self._arm(last, last.idle_since_ms)

    def open_idles(self, now_ms: float) -> list[IdleRecord]:
        """The idle intervals not yet closed, of the workers idle now, up to ``now_ms`` (a bill so far)."""
        out = []
        for w in self.workers.values():
            record = w.idle_record(now_ms, self.idle_vcpus)
            if record is not None:
                out.append(record)
        return out

    def _close_idle(self, w: FleetWorker, now_ms: float) -> None:
        record = w.idle_record(now_ms, self.idle_vcpus)
        w.loaded_ms = None
        if record is not None:
            self.idles.append(record)
            if self.totals is not None:
                self.totals.idle(record)

    # ---- keep-alive ----------------------------------------------------------------------

    def expire(self, now_ms: float) -> list[FleetWorker]:
        """Retire every idle worker whose keep-alive ran out at or before ``now_ms``; the workers retired."""
        heap = self._expiries
        gone: list[FleetWorker] = []
        while heap and heap[0][0] <= now_ms:
            at, _, wid, token = heapq.heappop(heap)
            w = self.workers.get(wid)
            if w is not None and w.expiry_token == token and not w.busy:
                self.retire(w, at)
                gone.append(w)
        return gone

    def next_expiry_ms(self) -> float | None:
        """When the next keep-alive may run out (None: no idle worker)."""
        heap = self._expiries
        while heap:
            _, _, wid, token = heap[0]
            w = self.workers.get(wid)
            if w is not None and w.expiry_token == token:
                return heap[0][0]
            heapq.heappop(heap)
        return None

    def retire_idle(self, now_ms: float) -> list[FleetWorker]:
        """Stop every idle worker now (the end of a run), billing its idle time up to ``now_ms``."""
        idle = [w for w in self.workers.values() if not w.busy]
        for w in idle:
            self.retire(w, now_ms)
        return idle
