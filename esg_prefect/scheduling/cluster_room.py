"""Room for a new worker on a :class:`~esg_prefect.scheduling.dispatch.ClusterView` (ESG-SPEC section 5).

Where a cold start fits: the largest share a new worker could take on a GPU
type, every (node, device) it fits with the idle workers to evict first, and
the best of them (rules 3 and 4 of ESG_Dispatch: the inputs' node first, then
fewest evictions, best fit, name). Kept apart from the view's bookkeeping
(its counts, commits and warm-worker questions), which it only reads.
"""

from __future__ import annotations

from esg_prefect.model.cluster import Device, Worker
from esg_prefect.model.config import CPU

_MISSING = object()


def _h(share: float) -> int:
    return round(share * 100)


_ColdPlace = tuple[tuple[int, int, str], tuple[str, str | None, tuple[str, ...]]]
"""A place a new worker fits: (rank, (node, device, idle workers to evict))."""


def _best_cold(places: list[_ColdPlace], home: str | None) -> tuple[str, str | None, tuple[str, ...]] | None:
    """The best place: on the inputs' node first, then by rank (fewest evictions, best fit, name)."""
    best: tuple[tuple[int, tuple[int, int, str]], tuple[str, str | None, tuple[str, ...]]] | None = None
    for rank, slot in places:
        key = (0 if slot[0] == home else 1, rank)
        if best is None or key < best[0]:
            best = (key, slot)
    return None if best is None else best[1]


class ColdRoom:
    """The room-finding questions of a :class:`~esg_prefect.scheduling.dispatch.ClusterView`.

    A base class that holds no state of its own: it reads the view's capacity,
    idle workers and memos, declared here for the type checker and set by the view.
    """

    allow_eviction: bool
    node_order: list[str]
    devices: dict[str, Device]
    _by_hardware: dict[str, tuple[tuple[str, str, int], ...]]
    free_vcpus: dict[str, int]
    free_slots: dict[str, float]
    free_share: dict[str, int]
    clients: dict[str, int]
    idle: dict[str, Worker]
    _idle_on_node: dict[str, int]
    _idle_share: dict[str, int]
    _idle_clients: dict[str, int]
    _memo: dict[tuple[object, ...], object]
    _node_stamp: dict[str, int]
    _room_memo: dict[tuple[str, str | None, int, int], tuple[int, tuple[str, ...] | None]]

    def max_room(self, vcpus: int, hardware: str) -> int:
        """The largest share (hundredths) a new worker with ``vcpus`` could take on ``hardware``; -1 if none.

        A new worker fits where the node has the compute and a worker slot and
        the device a share and an MPS client slot, counting what evicting idle
        workers would free when eviction is allowed. Whether some place fits
        does not depend on the share asked for except through the free share,
        so one pass over the places answers every share at once (memoised
        until the next commit). On the CPU the answer is 0 (fits) or -1.
        """
        key = ("room", vcpus, hardware)
        got = self._memo.get(key)
        if got is not None:
            return got  # type: ignore[return-value]
        evictable = self.allow_eviction
        best = -1
        if hardware == CPU:
            for n in self.node_order:
                if (
                    self.free_vcpus[n] >= vcpus
                    and self.free_slots[n] + (self._idle_on_node[n] if evictable else 0) >= 1
                ):
                    best = 0
                    break
        else:
            free_vcpus = self.free_vcpus
            for dev_id, node, max_clients in self._by_hardware.get(hardware, ()):
                if free_vcpus[node] < vcpus:
                    continue
                slots = self.free_slots[node] + (self._idle_on_node[node] if evictable else 0)
                share = self.free_share[dev_id] + (self._idle_share[dev_id] if evictable else 0)
                clients = self.clients[dev_id] - (self._idle_clients[dev_id] if evictable else 0)
                if slots >= 1 and clients < max_clients and share > best:
                    best = share
        self._memo[key] = best
        return best

    def _cold_slot(
        self, vcpus: int, share: float, hardware: str, home: str | None
    ) -> tuple[str, str | None, tuple[str, ...]] | None:
        # A function of the capacity alone: memoised until the next commit (a round under a backlog
        # asks the same question for every queue it cannot serve). The places that fit do not depend
        # on the inputs' node, so they are found once for every ``home`` asked.
        key = ("cold", vcpus, share, hardware, home)
        got = self._memo.get(key, _MISSING)
        if got is _MISSING:
            places_key = ("cold-places", vcpus, share, hardware)
            places = self._memo.get(places_key)
            if places is None:
                places = self._memo[places_key] = self._cold_places(vcpus, share, hardware)
            got = self._memo[key] = _best_cold(places, home)  # type: ignore[arg-type]
        return got  # type: ignore[return-value]

    def _find_cold_slot(
        self, vcpus: int, share: float, hardware: str, home: str | None
    ) -> tuple[str, str | None, tuple[str, ...]] | None:
        """Where a new worker would start (node, device, idle workers to evict); None if nowhere."""
        return _best_cold(self._cold_places(vcpus, share, hardware), home)

    def _cold_places(self, vcpus: int, share: float, hardware: str) -> list[_ColdPlace]:
        """Every place a new worker fits, with its rank after the inputs' node (:func:`_best_cold`)."""
        need = _h(share)
        if hardware == CPU:
            places: list[tuple[str, str | None]] = [(n, None) for n in self.node_order]
        else:
            places = [(node, dev_id) for dev_id, node, _ in self._by_hardware.get(hardware, ())]
        out: list[_ColdPlace] = []
        for node, dev in places:
            evict = self._room(node, dev, vcpus, need)
            if evict is None:
                continue
            leftover = self.free_share[dev] - need if dev is not None else self.free_vcpus[node] - vcpus
            # Rank (after the inputs' node first): fewest evictions, then best fit, then name.
            out.append(((len(evict), int(leftover), dev or node), (node, dev, evict)))
        return out

    def _room(self, node: str, dev: str | None, vcpus: int, need: int) -> tuple[str, ...] | None:
        """Idle workers to evict so that (vcpus, need) fits on node/dev; None if impossible.

        The answer depends only on the node's own state, so it is kept with the
        node's stamp (renewed by :meth:`ClusterView.commit` and :meth:`ClusterView._update`
        whenever the node changes) across commits that change other nodes: a busy
        round places many batches, each asking about every device.
        """
        key = (node, dev, vcpus, need)
        stamp = self._node_stamp[node]
        got = self._room_memo.get(key)
        if got is not None and got[0] == stamp:
            return got[1]
        found = self._find_room(node, dev, vcpus, need)
        self._room_memo[key] = (stamp, found)
        return found

    def _find_room(self, node: str, dev: str | None, vcpus: int, need: int) -> tuple[str, ...] | None:
        """:meth:`_room`, worked out."""
        if self.free_vcpus[node] < vcpus:
            return None  # compute is held by busy workers only: evicting idle ones frees none

        def fits(freed_slots: int, freed_share: int, freed_clients: int) -> bool:
            if self.free_slots[node] + freed_slots < 1:
                return False
            if dev is None:
                return True
            d = self.devices[dev]
            return self.free_share[dev] + freed_share >= need and self.clients[dev] - freed_clients < d.max_clients

        if fits(0, 0, 0):
            return ()
        if not self.allow_eviction:
            return None
        # Workers on the same device free share as well as vCPUs: they go first, then least recently used.
        victims = sorted(
            (w for w in self.idle.values() if w.node == node),
            key=lambda w: (
                0 if dev is not None and w.device_id == dev else 1,
                w.idle_since_ms if w.idle_since_ms is not None else 0.0,
                w.worker_id,
            ),
        )
        chosen: list[str] = []
        share = clients = 0
        for w in victims:
            chosen.append(w.worker_id)
            if dev is not None and w.device_id == dev:
                share += _h(w.gpu_share)
                clients += 1
            if fits(len(chosen), share, clients):
                return tuple(chosen)
        return None
