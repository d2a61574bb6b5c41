"""ESG_Dispatch: put a chosen configuration on a worker (ESG-SPEC section 5).

Ranking of the places that have the capacity:

1. an idle warm worker of the same (stage, resources) on the node holding most
   of the batch's inputs;
2. an idle warm worker of the same (stage, resources) anywhere;
3. a cold start on the node holding most of the inputs;
4. a cold start anywhere; ties go to the device (or node, on the CPU) with the
   least capacity left over: best fit, less fragmentation.

Capacity (see :class:`~esg_prefect.model.cluster.Node`): a batch needs free
compute (vCPUs not used by busy workers) on the worker's node; a new worker
also needs a worker slot on the node and, for a GPU configuration, a free
share (and an MPS client slot) on a device of the right type. Idle workers
hold their slot and GPU share but no compute. When no slot or share is left,
idle workers of other stages may be stopped to make room (a knob, on by
default): those on the same device first, then the least recently used. If
nothing fits, the batch stays queued. GPU shares are counted in hundredths, so
capacity checks are exact.

:class:`ClusterView` is the mutable working copy of a
:class:`~esg_prefect.model.cluster.ClusterSnapshot` that one ``decide`` call
updates as it dispatches, so two batches never get the same capacity; where
a new worker fits (rules 3 and 4) is :mod:`~esg_prefect.scheduling.cluster_room`'s.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TypeVar, cast

from esg_prefect.model.cluster import ClusterSnapshot, Worker
from esg_prefect.scheduling.base import Placement
from esg_prefect.scheduling.cluster_room import ColdRoom, _h

T = TypeVar("T")
_MISSING = object()
_STAMPS = itertools.count(1)  # node stamps (ClusterView._room): unique, so diverged copies never share one


class _Static:
    """What a view takes from a cluster's nodes and devices alone (shared by the views of one cluster)."""

    __slots__ = (
        "by_hardware",
        "devices",
        "full_share",
        "hardware",
        "node_order",
        "slots",
        "vcpus",
        "zero_dev",
        "zero_node",
    )

    def __init__(self, cluster: ClusterSnapshot) -> None:
        self.node_order = [n.name for n in cluster.nodes]
        self.vcpus = {n.name: n.vcpus for n in cluster.nodes}
        self.slots = {
            n.name: float(n.max_workers) if n.max_workers is not None else float("inf") for n in cluster.nodes
        }
        self.devices = {d.device_id: d for d in cluster.devices}
        # Per GPU type, (device id, node, MPS client limit) in the cluster's order: capacity questions name a type.
        self.by_hardware: dict[str, tuple[tuple[str, str, int], ...]] = {}
        for d in cluster.devices:
            self.by_hardware[d.hardware] = (*self.by_hardware.get(d.hardware, ()), (d.device_id, d.node, d.max_clients))
        self.full_share = {d.device_id: 100 for d in cluster.devices}
        self.zero_dev = {d.device_id: 0 for d in cluster.devices}
        self.zero_node = {n.name: 0 for n in cluster.nodes}
        self.hardware = cluster.hardware_types()


class ClusterView(ColdRoom):
    """Free capacity and idle workers during one scheduling round.

    Args:
        cluster: the snapshot to start from.
        allow_eviction: whether idle workers may be stopped to make room.
        static: what the cluster's nodes and devices give, when the caller keeps it (:class:`ViewCache`).
    """

    def __init__(self, cluster: ClusterSnapshot, allow_eviction: bool = True, static: _Static | None = None) -> None:
        self.allow_eviction = allow_eviction
        if static is None:
            static = _Static(cluster)
        self.node_order = static.node_order
        self.devices = static.devices
        self._by_hardware = static.by_hardware
        self.hardware = static.hardware
        self.free_vcpus = dict(static.vcpus)
        self.free_slots: dict[str, float] = dict(static.slots)
        self.free_share = dict(static.full_share)
        self.clients = dict(static.zero_dev)
        self.idle: dict[str, Worker] = {}
        self._idle_by_stage: dict[str | None, list[Worker]] = {}
        # Idle workers by (stage, hardware, vcpus, share): the warm-worker questions read only their kind.
        self._idle_by_kind: dict[tuple[str | None, str, int, float], list[Worker]] = {}
        # What evicting every idle worker would free, per node and per device (kept up to date by commit).
        # Plain dicts holding every node and device (cheaper to build and copy than Counters).
        self._idle_on_node: dict[str, int] = dict(static.zero_node)
        self._idle_share: dict[str, int] = dict(static.zero_dev)
        self._idle_clients: dict[str, int] = dict(static.zero_dev)
        # One pass over the workers, with the dicts bound to locals: a cluster holds hundreds of them.
        free_slots, free_vcpus, free_share, clients = self.free_slots, self.free_vcpus, self.free_share, self.clients
        idle, by_stage, by_kind = self.idle, self._idle_by_stage, self._idle_by_kind
        # Busy workers per stage, as the snapshot had them (read-only: a batch placed this round is not added;
        # taken() lists those).
        self.busy_by_stage: dict[str | None, list[Worker]] = {}
        self._taken: dict[str | None, list[Worker]] = {}  # warm workers this round's commits took, busy till their end
        busy_by_stage = self.busy_by_stage
        idle_on_node, idle_share, idle_clients = self._idle_on_node, self._idle_share, self._idle_clients
        for w in cluster.workers:
            node, dev = w.node, w.device_id
            free_slots[node] -= 1
            if w.busy:
                free_vcpus[node] -= w.vcpus
                got = busy_by_stage.get(w.stage)
                if got is None:
                    busy_by_stage[w.stage] = [w]
                else:
                    got.append(w)
                if dev is not None:
                    free_share[dev] -= round(w.gpu_share * 100)
                    clients[dev] += 1
            else:
                idle[w.worker_id] = w
                got = by_stage.get(w.stage)
                if got is None:
                    by_stage[w.stage] = [w]
                else:
                    got.append(w)
                kind = (w.stage, w.hardware, w.vcpus, w.gpu_share)
                got = by_kind.get(kind)
                if got is None:
                    by_kind[kind] = [w]
                else:
                    got.append(w)
                idle_on_node[node] += 1
                if dev is not None:
                    need = round(w.gpu_share * 100)
                    free_share[dev] -= need
                    clients[dev] += 1
                    idle_share[dev] += need
                    idle_clients[dev] += 1
        # Answers to the capacity questions, valid until the next commit changes the capacity.
        self._version = 0
        self._memo: dict[tuple[object, ...], object] = {}
        # Per node, a stamp that changes with every change of its state (unique across views and
        # copies), and the rooms found on it under a stamp (_room).
        stamp = next(_STAMPS)
        self._node_stamp: dict[str, int] = dict.fromkeys(self.node_order, stamp)
        self._room_memo: dict[tuple[str, str | None, int, int], tuple[int, tuple[str, ...] | None]] = {}

    def _update(self, gone: list[Worker], came: list[Worker]) -> None:
        """Take ``gone`` workers out of a pristine view and put ``came`` ones in (:class:`ViewCache`).

        Lists shared with copies handed out earlier are replaced, never changed in place.
        """
        free_slots, free_vcpus, free_share, clients = self.free_slots, self.free_vcpus, self.free_share, self.clients
        idle, by_stage, busy_by_stage = self.idle, self._idle_by_stage, self.busy_by_stage
        by_kind = self._idle_by_kind
        idle_on_node, idle_share, idle_clients = self._idle_on_node, self._idle_share, self._idle_clients
        for w in gone:  # all the leavers first: a changed worker keeps its id
            node, dev = w.node, w.device_id
            free_slots[node] += 1
            if w.busy:
                free_vcpus[node] += w.vcpus
                busy_by_stage[w.stage] = [x for x in busy_by_stage[w.stage] if x is not w]
                if dev is not None:
                    free_share[dev] += round(w.gpu_share * 100)
                    clients[dev] -= 1
            else:
                del idle[w.worker_id]
                by_stage[w.stage] = [x for x in by_stage[w.stage] if x is not w]
                kind = (w.stage, w.hardware, w.vcpus, w.gpu_share)
                by_kind[kind] = [x for x in by_kind[kind] if x is not w]
                idle_on_node[node] -= 1
                if dev is not None:
                    need = round(w.gpu_share * 100)
                    free_share[dev] += need
                    clients[dev] -= 1
                    idle_share[dev] -= need
                    idle_clients[dev] -= 1
        for w in came:
            node, dev = w.node, w.device_id
            free_slots[node] -= 1
            if w.busy:
                free_vcpus[node] -= w.vcpus
                busy_by_stage[w.stage] = [*busy_by_stage.get(w.stage, ()), w]
                if dev is not None:
                    free_share[dev] -= round(w.gpu_share * 100)
                    clients[dev] += 1
            else:
                idle[w.worker_id] = w
                by_stage[w.stage] = [*by_stage.get(w.stage, ()), w]
                kind = (w.stage, w.hardware, w.vcpus, w.gpu_share)
                by_kind[kind] = [*by_kind.get(kind, ()), w]
                idle_on_node[node] += 1
                if dev is not None:
                    need = round(w.gpu_share * 100)
                    free_share[dev] -= need
                    clients[dev] += 1
                    idle_share[dev] += need
                    idle_clients[dev] += 1
        for w in (*gone, *came):
            self._node_stamp[w.node] = next(_STAMPS)
        self._version += 1
        self._memo = {}

    def copy(self) -> ClusterView:
        """An independent working copy (commits to one do not show in the other).

        The copy shares this view's answers to the capacity questions until its
        first commit (they are answers about the same state), so a view kept
        pristine across rounds of an unchanged cluster answers each question
        once (:class:`ViewCache`).
        """
        new = object.__new__(ClusterView)
        new.allow_eviction = self.allow_eviction
        new.node_order = self.node_order
        new.free_vcpus = dict(self.free_vcpus)
        new.free_slots = dict(self.free_slots)
        new.devices = self.devices
        new._by_hardware = self._by_hardware
        new.free_share = dict(self.free_share)
        new.clients = dict(self.clients)
        new.idle = dict(self.idle)
        new.hardware = self.hardware
        new._version = self._version
        new._memo = self._memo  # replaced, not cleared, at the first commit
        new._node_stamp = dict(self._node_stamp)
        new._room_memo = self._room_memo  # shared: entries hold the stamp they were computed under
        new._idle_by_stage = self._idle_by_stage  # never changed after construction: entries are checked against idle
        new._idle_by_kind = self._idle_by_kind  # the same
        new.busy_by_stage = self.busy_by_stage  # never changed after construction
        new._taken = {k: list(v) for k, v in self._taken.items()}
        new._idle_on_node = dict(self._idle_on_node)
        new._idle_share = dict(self._idle_share)
        new._idle_clients = dict(self._idle_clients)
        return new

    # ---- questions asked while building options --------------------------

    def idle_warm(self, stage: str, vcpus: int, share: float, hardware: str) -> list[Worker]:
        """Idle workers warm for ``stage`` with exactly these resources."""
        idle = self.idle
        return [w for w in self._idle_by_kind.get((stage, hardware, vcpus, share), ()) if w.worker_id in idle]

    def has_idle_warm(self, stage: str, vcpus: int, share: float, hardware: str) -> bool:
        """``bool(self.idle_warm(stage, vcpus, share, hardware))``, reading only workers of that kind."""
        idle = self.idle
        for w in self._idle_by_kind.get((stage, hardware, vcpus, share), ()):  # noqa: SIM110 - a plain loop: any() over a generator cost more here
            if w.worker_id in idle:
                return True
        return False

    def idle_of_stage(self, stage: str) -> list[Worker]:
        """Idle workers warm for ``stage`` (not taken by this round's commits), any resources."""
        idle = self.idle
        return [w for w in self._idle_by_stage.get(stage, ()) if w.worker_id in idle]

    def taken(self, stage: str) -> list[Worker]:
        """Workers warm for ``stage`` that this round's commits gave a batch, busy until its predicted end.

        Not in :attr:`busy_by_stage` (the snapshot's): a queue's next jobs may
        still wait for one when it frees within their slack
        (:meth:`~esg_prefect.scheduling.busy_warm.BusyWarm.taken_in_time`).
        """
        return self._taken.get(stage, [])

    def workers_of_kind(self, stage: str, hardware: str, vcpus: int, share: float) -> int:
        """Workers of the snapshot (busy or idle) warm for ``stage`` with exactly these resources.

        Read from the snapshot's own indexes (this round's commits are not
        counted): rate-driven autoscalers compare it with the instances they want.
        """
        n = len(self._idle_by_kind.get((stage, hardware, vcpus, share), ()))
        for w in self.busy_by_stage.get(stage, ()):
            if w.hardware == hardware and w.vcpus == vcpus and w.gpu_share == share:
                n += 1
        return n

    def warm_resources(self, stage: str) -> set[tuple[str, int, float]]:
        """(hardware, vcpus, share) of the idle workers warm for ``stage`` that have compute to run now."""
        key = ("warm", stage)
        got = self._memo.get(key)
        if got is None:
            got = {
                (w.hardware, w.vcpus, w.gpu_share)
                for w in self._idle_by_stage.get(stage, ())
                if w.worker_id in self.idle and self.free_vcpus[w.node] >= w.vcpus
            }
            self._memo[key] = got
        return got  # type: ignore[return-value]

    def warm_idle_since(self, stage: str) -> dict[tuple[str, int, float], float]:
        """Per (hardware, vcpus, share) of :meth:`warm_resources`, when its most recently idle worker went idle.

        A fresh worker (pre-warmed, no batch yet) reads as idle since +inf: just idle.
        """
        key = ("warm-since", stage)
        got = cast("dict[tuple[str, int, float], float] | None", self._memo.get(key))
        if got is None:
            got = {}
            for w in self._idle_by_stage.get(stage, ()):
                if w.worker_id in self.idle and self.free_vcpus[w.node] >= w.vcpus:
                    k = (w.hardware, w.vcpus, w.gpu_share)
                    # A fresh pre-warmed worker reads as just idle: its idle since the load began is
                    # the start's cost, already decided; priced by it, the start would idle out unused.
                    since = math.inf if w.fresh else (w.idle_since_ms or 0.0)
                    if since > got.get(k, -math.inf):
                        got[k] = since
            self._memo[key] = got
        return got

    def can_start(self, vcpus: int, share: float, hardware: str) -> bool:
        """Whether a new worker with these resources fits (evicting idle ones if allowed)."""
        return _h(share) <= self.max_room(vcpus, hardware)

    def startable(self, candidates: tuple[tuple[str, int, float], ...]) -> frozenset[tuple[str, int, float]]:
        """The (hardware, vcpus, share) among ``candidates`` a new worker could take now (memoised per round)."""
        key = ("startable", id(candidates))
        got = self._memo.get(key)
        if got is None or got[0] is not candidates:  # type: ignore[index]
            room = self.max_room
            got = (candidates, frozenset(c for c in candidates if _h(c[2]) <= room(c[1], c[0])))
            self._memo[key] = got
        return got[1]  # type: ignore[index, no-any-return]

    def remember(self, key: tuple[object, ...], build: Callable[[], T]) -> T:
        """``build()``, memoised until the next commit changes the capacity (callers' own questions)."""
        got = self._memo.get(key, _MISSING)
        if got is _MISSING:
            got = self._memo[key] = build()
        return got  # type: ignore[return-value]

    # ---- placement --------------------------------------------------------

    def place(
        self, stage: str, vcpus: int, share: float, hardware: str, input_nodes: Iterable[str | None]
    ) -> Placement | None:
        """Choose where to run, by the four rules; None if nothing fits."""
        counts: dict[str, int] = {}  # a plain dict: Counter's set-up cost more than counting a batch's nodes
        for n in input_nodes:
            if n is not None:
                counts[n] = counts.get(n, 0) + 1
        home = max(sorted(counts), key=counts.__getitem__) if counts else None
        warm = [w for w in self.idle_warm(stage, vcpus, share, hardware) if self.free_vcpus[w.node] >= vcpus]
        if warm:
            # Most inputs local first, then most recently idle (load gathers on few workers and the
            # rest expire: each use of a worker extends its keep-alive), then id (determinism).
            warm.sort(key=lambda w: (-counts.get(w.node, 0), -(w.idle_since_ms or 0.0), w.worker_id))
            w = warm[0]
            return Placement(w.node, w.device_id, w.worker_id, 1 if w.node == home and home else 2)
        if _h(share) > self.max_room(vcpus, hardware):
            return None  # no place fits a new worker, even stopping idle ones (one memoised pass answers it)
        slot = self._cold_slot(vcpus, share, hardware, home)
        if slot is None:
            return None
        node, device, evict = slot
        return Placement(node, device, None, 3 if node == home and home else 4, evict)

    def commit(self, placement: Placement, vcpus: int, share: float, free_at_ms: float | None = None) -> None:
        """Take the capacity of a placement so that later dispatches see it gone.

        ``free_at_ms``: when the batch placed on a warm worker is predicted to
        end; given, the worker is listed busy for the rest of the round (:meth:`taken`).
        """
        self._version += 1
        self._memo = {}  # a new dict: copies of a pristine view may share the old one
        self._node_stamp[placement.node] = next(_STAMPS)  # and, below, the node of every worker it takes
        gone = [*placement.evict, *([placement.worker_id] if placement.worker_id is not None else [])]
        for wid in gone:  # no longer idle: neither evictable nor warm for another batch
            w = self.idle[wid]
            self._node_stamp[w.node] = next(_STAMPS)
            self._idle_on_node[w.node] -= 1
            if w.device_id is not None:
                self._idle_share[w.device_id] -= _h(w.gpu_share)
                self._idle_clients[w.device_id] -= 1
        for wid in placement.evict:
            w = self.idle.pop(wid)
            self.free_slots[w.node] += 1
            if w.device_id is not None:
                self.free_share[w.device_id] += _h(w.gpu_share)
                self.clients[w.device_id] -= 1
        self.free_vcpus[placement.node] -= vcpus
        if placement.worker_id is not None:
            w = self.idle.pop(placement.worker_id)
            if free_at_ms is not None:
                busy = replace(w, busy=True, idle_since_ms=None, free_at_ms=free_at_ms, fresh=False)
                self._taken[w.stage] = [*self._taken.get(w.stage, ()), busy]
            return
        self.free_slots[placement.node] -= 1
        if placement.device_id is not None:
            self.free_share[placement.device_id] -= _h(share)
            self.clients[placement.device_id] += 1


class ViewCache:
    """The round's :class:`ClusterView`, kept up to date from one snapshot to the next.

    A simulator hands the scheduler the same snapshot object while its cluster
    has not changed, and many rounds in a row see the same cluster (rounds for
    arrivals that dispatch nothing). Each round then starts from a copy of one
    pristine view, and the capacity answers computed on it carry over.

    When a new snapshot has the same node and device objects, the pristine
    view is brought up to date from the workers that changed (by identity:
    immutable :class:`Worker` objects that left, and the ones that came)
    instead of being rebuilt from every worker: a simulated cluster changes a
    few workers between rounds and holds hundreds. The result is the view a
    rebuild gives (every answer the view gives depends on its counts and sets,
    not on the order its lists were filled in).
    """

    __slots__ = ("_base", "_by_id", "_snapshot", "_static", "allow_eviction")

    def __init__(self, allow_eviction: bool = True) -> None:
        self.allow_eviction = allow_eviction
        self._static: tuple[object, object, _Static] | None = None  # (nodes, devices, what they give)
        self._snapshot: ClusterSnapshot | None = None
        self._base: ClusterView | None = None
        self._by_id: dict[int, Worker] = {}  # the base's workers by id() (holding them keeps the ids unique)

    def view(self, cluster: ClusterSnapshot) -> ClusterView:
        """A fresh working view of ``cluster``."""
        base, old = self._base, self._snapshot
        if base is None or cluster is not old:
            workers = cluster.workers
            by_id = dict(zip(map(id, workers), workers, strict=True))
            if (
                base is not None
                and old is not None
                and cluster.nodes is old.nodes
                and cluster.devices is old.devices
                and len(by_id) == len(workers)
            ):
                prev = self._by_id
                # In the snapshots' own orders, never a set's: a set of ids iterates by memory address, so
                # which of two equal idle workers a batch got hung on garbage-collection timing.
                gone = [w for i, w in prev.items() if i not in by_id]
                came = [w for i, w in by_id.items() if i not in prev]
                base._update(gone, came)
            else:
                st = self._static
                if st is None or st[0] is not cluster.nodes or st[1] is not cluster.devices:
                    st = self._static = (cluster.nodes, cluster.devices, _Static(cluster))
                base = self._base = ClusterView(cluster, self.allow_eviction, st[2])
            self._by_id = by_id
            self._snapshot = cluster
        return base.copy()
