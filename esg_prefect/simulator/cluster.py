"""The simulated cluster: workers with keep-alive, cold starts, service times and billing.

It holds what the live runtime's worker backend holds (nodes, GPU devices,
worker processes bound to ``(device, gpu_share, vcpus)`` with one stage's
model warm) and bills them as ESG-SPEC section 6 says: a batch's record spans
its dispatch to its end (a cold start included); a warm worker's idle time
between batches, and after its last batch until its keep-alive runs out, is an
idle record. It applies a scheduler's placements exactly as given and raises
when one does not fit, so a scheduler bug cannot pass unnoticed.

Capacity follows :class:`~esg_prefect.model.cluster.Node`: a worker's vCPUs
are taken only while it runs a batch (an idle worker sleeps), its worker slot
on the node (``max_workers``), its GPU share and its MPS client slot for its
whole life.

Service time of a batch (ESG-SPEC section 2, plus what the profile leaves out)::

    cold start (if a new worker)  +  input transfer (if any input is on another node)
      +  L(stage, config, hardware) * (1 + interference * other busy workers on the GPU)

where ``L`` is drawn per :class:`~esg_prefect.simulator.case.SimSpec`
``service_time`` (log-normal with the profile's mean and p95 by default).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from esg_prefect.exceptions import InvalidInputError
from esg_prefect.model.attribution import BatchRecord, IdleRecord
from esg_prefect.model.cluster import ClusterSnapshot, Device, Node, Worker
from esg_prefect.model.config import Config
from esg_prefect.model.interference import CoRunModel
from esg_prefect.model.profile import LatencyProfile
from esg_prefect.model.unchecked import unchecked
from esg_prefect.scheduling.base import Placement
from esg_prefect.simulator.case import ClusterSpec, SimSpec

_Z95 = 1.6448536269514722  # standard normal 95th percentile


def lognormal_params(mean_ms: float, p95_ms: float | None) -> tuple[float, float] | None:
    """``(mu, sigma)`` of a log-normal with this mean and 95th percentile; None for a fixed value.

    ``mean = exp(mu + sigma^2 / 2)`` and ``p95 = exp(mu + z95 * sigma)`` give
    ``sigma^2 / 2 - z95 * sigma + ln(p95 / mean) = 0``; the smaller root is
    taken. A p95 at or below the mean (or none) means no spread.

    Examples:
        >>> mu, sigma = lognormal_params(10.0, 12.0)
        >>> round(math.exp(mu + sigma * sigma / 2), 9), round(math.exp(mu + 1.6448536269514722 * sigma), 9)
        (10.0, 12.0)
    """
    if p95_ms is None or p95_ms <= mean_ms:
        return None
    d = math.log(p95_ms / mean_ms)
    disc = _Z95 * _Z95 - 2.0 * d
    sigma = _Z95 - math.sqrt(disc) if disc > 0 else _Z95
    return math.log(mean_ms) - sigma * sigma / 2.0, sigma


def _unchecked_snapshot(
    nodes: tuple[Node, ...], devices: tuple[Device, ...], workers: tuple[Worker, ...]
) -> ClusterSnapshot:
    """A :class:`ClusterSnapshot` built without its O(workers) consistency check.

    The simulated cluster checks every placement as it applies it (and raises
    on any that does not fit), so its state is consistent by construction;
    repeating the snapshot's check after every change of a cluster with
    hundreds of warm workers cost more than the scheduling itself. Tests build
    checked snapshots from the same state (``ClusterSnapshot(...)``) and
    compare.
    """
    snap = object.__new__(ClusterSnapshot)
    object.__setattr__(snap, "nodes", nodes)
    object.__setattr__(snap, "devices", devices)
    object.__setattr__(snap, "workers", workers)
    object.__setattr__(snap, "_index", {})
    return snap


# Views and records built from the cluster's own state, consistent by construction: without their
# checks (esg_prefect.model.unchecked).
_worker = unchecked(Worker)
_idle_record = unchecked(IdleRecord)


class SimWorker:
    """A worker process as the simulated cluster tracks it (mutable; snapshots copy it)."""

    __slots__ = (
        "device_id",
        "expiry_token",
        "hardware",
        "idle_since_ms",
        "last_batch_end_ms",
        "node",
        "share",
        "stage",
        "starting",
        "vcpus",
        "view",
        "worker_id",
    )

    def __init__(
        self, worker_id: str, node: str, device_id: str | None, hardware: str, vcpus: int, share: float, stage: str
    ) -> None:
        self.worker_id = worker_id
        self.node = node
        self.device_id = device_id
        self.hardware = hardware
        self.vcpus = vcpus
        self.share = share
        self.stage = stage
        self.idle_since_ms: float | None = None  # None while busy (or starting)
        self.starting: float | None = None  # when a pre-warm start began, while it loads
        self.expiry_token = 0
        self.last_batch_end_ms = 0.0
        self.view: Worker | None = None  # the immutable view, until the state changes

    @property
    def busy(self) -> bool:
        """Whether it runs (or is starting for) a batch."""
        return self.idle_since_ms is None

    def as_worker(self) -> Worker:
        """The immutable view the scheduler sees (cached until the worker changes)."""
        if self.view is None:
            self.view = self._build()
        return self.view

    def _build(self) -> Worker:
        # Built without Worker's checks: they held when the worker started (its share comes from a
        # checked Config, already on the 1/100 grid), and a worker's view is rebuilt at every change.
        return _worker(
            self.worker_id,
            self.node,
            self.device_id,
            self.hardware,
            self.vcpus,
            self.share,
            self.stage,
            self.idle_since_ms is None,
            self.idle_since_ms,
            self.starting is not None,
        )


@dataclass(frozen=True, slots=True)
class BatchTiming:
    """How long a dispatched batch takes, in parts."""

    cold_start_ms: float
    transfer_ms: float
    exec_ms: float

    @property
    def total_ms(self) -> float:
        """Dispatch to end."""
        return self.cold_start_ms + self.transfer_ms + self.exec_ms


_batch_timing = unchecked(BatchTiming)


class SimCluster:
    """Nodes, devices and workers; billing records; service times.

    Args:
        spec: the cluster.
        profile: the latency model (service times and cold starts).
        sim: platform behaviour (noise, interference, network).
        keep_alive_ms: how long an idle worker is kept.
        rng: the run's service-time random source.
        keep_alive_scales: per hardware type, the fraction of ``keep_alive_ms`` its
            idle workers get (``ESGSettings.keep_alive_by_price``); None: all of it.
    """

    def __init__(
        self,
        spec: ClusterSpec,
        profile: LatencyProfile,
        sim: SimSpec,
        keep_alive_ms: float,
        rng: random.Random,
        keep_alive_scales: Mapping[str, float] | None = None,
    ) -> None:
        base = spec.snapshot()
        self.nodes = base.nodes
        self.devices = {d.device_id: d for d in base.devices}
        self._device_tuple = tuple(base.devices)
        self.profile = profile
        self.sim = sim
        self.keep_alive_ms = keep_alive_ms
        self._keep_alive_scales = dict(keep_alive_scales or {})
        self.rng = rng
        self.workers: dict[str, SimWorker] = {}
        self.batches: list[BatchRecord] = []
        self.idles: list[IdleRecord] = []
        self._busy_on_device: dict[str, int] = {d: 0 for d in self.devices}
        self._free_vcpus = {n.name: n.vcpus for n in self.nodes}  # vCPUs not used by busy workers
        self._max_workers = {n.name: n.max_workers for n in self.nodes}
        self._workers_on = {n.name: 0 for n in self.nodes}
        self._free_share = {d: 100 for d in self.devices}
        self._clients = {d: 0 for d in self.devices}
        self._snapshot: ClusterSnapshot | None = base
        self._next_worker = 0
        self._lat: dict[tuple[str, str, int, int, float], tuple[float, tuple[float, float] | None]] = {}
        self.cold_starts = 0
        # PALDIA's co-run model, only where the case uses one (SimSpec.corun): otherwise the linear
        # interference_per_corunner, so that runs without it are unchanged.
        self._corun = CoRunModel.load(sim.corun) if sim.corun is not None else None

    # ---- the scheduler's view ----------------------------------------------------

    def snapshot(self) -> ClusterSnapshot:
        """The cluster now, rebuilt only after a change."""
        if self._snapshot is None:
            self._snapshot = _unchecked_snapshot(
                self.nodes, self._device_tuple, tuple([w.as_worker() for w in self.workers.values()])
            )
        return self._snapshot

    def hardware_types(self) -> frozenset[str]:
        """``"cpu"`` and every GPU type present."""
        return self.snapshot().hardware_types()

    # ---- applying a placement ------------------------------------------------------

    def acquire(self, placement: Placement, stage: str, config: Config, hardware: str, now_ms: float) -> SimWorker:
        """The worker a dispatch runs on: an idle warm one, or a new one (after evictions).

        Raises:
            InvalidInputError: when the placement names a missing, busy or
                mismatched worker, or does not fit the free capacity.
        """
        for wid in placement.evict:
            victim = self.workers.get(wid)
            if victim is None or victim.busy:
                raise InvalidInputError(f"placement evicts {wid!r}, which is {'busy' if victim else 'unknown'}")
            self._retire(victim, now_ms)
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
            assert w.idle_since_ms is not None
            if self._free_vcpus[w.node] < w.vcpus:
                raise InvalidInputError(
                    f"dispatch to worker {w.worker_id} needs {w.vcpus} vCPUs on {w.node}, "
                    f"{self._free_vcpus[w.node]} free"
                )
            self._free_vcpus[w.node] -= w.vcpus
            self._close_idle(w, now_ms)
            w.idle_since_ms = None
            w.expiry_token += 1
            w.view = None
            self._snapshot = None
            return w
        return self._start(placement, stage, config, hardware)

    def prewarm(self, placement: Placement, stage: str, config: Config, hardware: str, now_ms: float) -> SimWorker:
        """Start a worker with no batch (a :class:`~esg_prefect.scheduling.base.Start`); :meth:`warmed` ends it.

        It holds its vCPUs and GPU share while it loads, like a batch's cold
        start, but does not count as a busy co-runner on its GPU (loading
        weights is a copy, not compute).

        Raises:
            InvalidInputError: when the placement names a worker or does not fit.
        """
        if placement.worker_id is not None:
            raise InvalidInputError(f"a pre-warm start names worker {placement.worker_id!r}; it must place a new one")
        w = self.acquire(placement, stage, config, hardware, now_ms)
        w.starting = now_ms
        return w

    def warmed(self, w: SimWorker) -> int:
        """A pre-warm start is done: the worker is idle and warm; returns the token its expiry must carry.

        Its idle time is counted from the start's beginning, so the load is billed
        (as idle time: no run's batch held it).
        """
        if w.starting is None:
            raise InvalidInputError(f"worker {w.worker_id} is not starting")
        since, w.starting = w.starting, None
        return self._to_idle(w, since)

    def _to_idle(self, w: SimWorker, since_ms: float) -> int:
        """Give back the vCPUs ``w`` held while busy and count it idle from ``since_ms``; its new expiry token."""
        self._free_vcpus[w.node] += w.vcpus
        w.idle_since_ms = since_ms
        w.expiry_token += 1
        w.view = None
        self._snapshot = None
        return w.expiry_token

    def _start(self, placement: Placement, stage: str, config: Config, hardware: str) -> SimWorker:
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
        w = SimWorker(f"w{self._next_worker}", node, dev, hardware, config.vcpus, config.gpu_share, stage)
        self.workers[w.worker_id] = w
        self.cold_starts += 1
        self._snapshot = None
        return w

    def _retire(self, w: SimWorker, now_ms: float) -> None:
        """Stop an idle worker now (eviction or keep-alive expiry)."""
        self._close_idle(w, now_ms)
        del self.workers[w.worker_id]
        self._workers_on[w.node] -= 1
        if w.device_id is not None:
            self._free_share[w.device_id] += round(w.share * 100)
            self._clients[w.device_id] -= 1
        self._snapshot = None

    def _close_idle(self, w: SimWorker, now_ms: float) -> None:
        start = w.idle_since_ms
        if start is not None and now_ms > start:
            self.idles.append(_idle_record(w.worker_id, w.vcpus, w.share, w.hardware, start, now_ms))

    # ---- batches ------------------------------------------------------------------------

    def timing(
        self,
        w: SimWorker,
        stage: str,
        config: Config,
        cold: bool,
        remote_inputs: int,
        item_sizes: Sequence[float] | None = None,
    ) -> BatchTiming:
        """Service time of a batch about to start on ``w`` (draws from the run's RNG).

        ``item_sizes`` (the jobs' input sizes) rescale the profile's time by its
        size model (:meth:`LatencyProfile.size_factor`) where it has one: the
        simulated platform's truth for inputs of varied size, whether or not
        the scheduler plans with it.

        Raises:
            InvalidInputError: when the profile does not cover the configuration.
        """
        key = (stage, w.hardware, config.batch, config.vcpus, config.gpu_share)
        entry = self._lat.get(key)
        if entry is None:
            mean = self.profile.try_latency_ms(stage, config, w.hardware, "mean")
            if mean is None:
                raise InvalidInputError(f"dispatch of {stage} with {config} on {w.hardware}: no profile covers it")
            p95 = self.profile.try_latency_ms(stage, config, w.hardware, "p95")
            entry = (mean, lognormal_params(mean, p95))
            if self.sim.service_time == "p95":
                entry = (p95 if p95 is not None else mean, None)
            elif self.sim.service_time == "mean":
                entry = (mean, None)
            self._lat[key] = entry
        value, params = entry
        if params is not None:
            value = math.exp(params[0] + params[1] * self.rng.gauss(0.0, 1.0))
        if item_sizes:
            value *= self.profile.size_factor(stage, config, w.hardware, item_sizes)
        if w.device_id is not None:
            others = self._busy_on_device[w.device_id]
            if self._corun is not None:
                value *= self._corun.slowdown(stage, w.hardware, others)
            else:
                value *= 1.0 + self.sim.interference_per_corunner * others
        cold_ms = self.profile.cold_start_ms(stage, w.hardware) if cold else 0.0
        transfer = 0.0
        if remote_inputs:
            kbits = remote_inputs * self.sim.payload_kb * 8.192  # 1 KB = 8.192 kbit
            transfer = self.sim.network_latency_ms + kbits / (self.sim.network_gbps * 1000.0)
        return _batch_timing(cold_ms, transfer, value)

    def begin(self, w: SimWorker) -> None:
        """Count ``w`` as busy on its GPU (for interference)."""
        if w.device_id is not None:
            self._busy_on_device[w.device_id] += 1

    def finish(self, w: SimWorker, record: BatchRecord, now_ms: float) -> int:
        """End a batch: bill it, make the worker idle; returns the token its expiry must carry."""
        self.batches.append(record)
        if w.device_id is not None:
            self._busy_on_device[w.device_id] -= 1
        w.last_batch_end_ms = now_ms
        return self._to_idle(w, now_ms)

    def keep_alive_of(self, w: SimWorker) -> float:
        """How long ``w`` is kept once idle, in ms."""
        return self.keep_alive_ms * self._keep_alive_scales.get(w.hardware, 1.0)

    def expire(self, worker_id: str, token: int, now_ms: float) -> bool:
        """Retire an idle worker whose keep-alive ran out; False if it was used (or stopped) since."""
        w = self.workers.get(worker_id)
        if w is None or w.expiry_token != token or w.busy:
            return False
        self._retire(w, now_ms)
        return True

    def retire_idle(self, now_ms: float) -> None:
        """Stop every idle worker now (the end of a run), billing its idle time up to ``now_ms``."""
        for w in [w for w in self.workers.values() if not w.busy]:
            self._retire(w, now_ms)

    def busy_workers(self) -> int:
        """Workers running or starting a batch."""
        return sum(1 for w in self.workers.values() if w.busy)
