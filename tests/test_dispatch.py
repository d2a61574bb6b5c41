"""ESG_Dispatch placement rules, best fit, eviction and capacity bookkeeping."""

from __future__ import annotations

from esg_prefect.model import ClusterSnapshot, Device, Node, Worker
from esg_prefect.scheduling.base import Placement
from esg_prefect.scheduling.dispatch import ClusterView


def gpu_worker(
    wid: str, node: str, dev: str, share: float, stage: str | None, busy: bool = False, idle: float = 0.0
) -> Worker:
    return Worker(wid, node, dev, "T4", 1, share, stage, busy=busy, idle_since_ms=None if busy else idle)


NODES = [Node("n0", 8), Node("n1", 8)]
DEVS = [Device("n0/g0", "n0", "T4"), Device("n1/g0", "n1", "T4"), Device("n1/g1", "n1", "T4")]


def test_rule1_warm_on_inputs_node_beats_warm_elsewhere() -> None:
    ws = [gpu_worker("a", "n0", "n0/g0", 0.5, "m"), gpu_worker("b", "n1", "n1/g0", 0.5, "m")]
    view = ClusterView(ClusterSnapshot(NODES, DEVS, ws))
    p = view.place("m", 1, 0.5, "T4", ["n1", "n1", "n0"])
    assert p is not None and (p.worker_id, p.rule) == ("b", 1)


def test_rule2_warm_anywhere_when_none_is_local() -> None:
    ws = [gpu_worker("a", "n0", "n0/g0", 0.5, "m")]
    view = ClusterView(ClusterSnapshot(NODES, DEVS, ws))
    p = view.place("m", 1, 0.5, "T4", ["n1"])
    assert p is not None and (p.worker_id, p.rule, p.cold) == ("a", 2, False)


def test_among_equally_local_warm_workers_the_most_recently_idle_goes_first() -> None:
    """Load gathers on the worker in use; the one idle longest is left to expire (and its gap is reported)."""
    ws = [
        gpu_worker("long-idle", "n1", "n1/g0", 0.5, "m", idle=10.0),
        gpu_worker("recent", "n1", "n1/g1", 0.5, "m", idle=90.0),
        gpu_worker("local", "n0", "n0/g0", 0.5, "m", idle=5.0),
    ]
    view = ClusterView(ClusterSnapshot(NODES, DEVS, ws))
    p = view.place("m", 1, 0.5, "T4", [])
    assert p is not None and p.worker_id == "recent"
    p = view.place("m", 1, 0.5, "T4", ["n0"])  # locality still comes first
    assert p is not None and p.worker_id == "local"
    assert view.warm_idle_since("m") == {("T4", 1, 0.5): 90.0}


def test_busy_or_mismatched_workers_are_not_warm() -> None:
    ws = [
        gpu_worker("busy", "n0", "n0/g0", 0.5, "m", busy=True),
        gpu_worker("other-share", "n1", "n1/g0", 0.3, "m"),
        gpu_worker("other-stage", "n1", "n1/g1", 0.5, "x"),
    ]
    view = ClusterView(ClusterSnapshot(NODES, DEVS, ws))
    p = view.place("m", 1, 0.5, "T4", [])
    assert p is not None and p.cold


def test_rule3_cold_on_inputs_node_then_rule4_best_fit() -> None:
    # n1/g0 has 0.3 free, n1/g1 0.8 free, n0/g0 1.0 free.
    ws = [gpu_worker("x", "n1", "n1/g0", 0.7, "x", busy=True), gpu_worker("y", "n1", "n1/g1", 0.2, "y", busy=True)]
    view = ClusterView(ClusterSnapshot(NODES, DEVS, ws))
    # Inputs on n1: rule 3 on n1, best fit among n1's devices with room for 0.3: g0 (0 left) over g1.
    p = view.place("m", 1, 0.3, "T4", ["n1"])
    assert p is not None and (p.node, p.device_id, p.rule) == ("n1", "n1/g0", 3)
    # No inputs: rule 4, best fit over all devices for 0.6: n1/g1 (0.2 left) beats n0/g0 (0.4 left).
    p = view.place("m", 1, 0.6, "T4", [])
    assert p is not None and (p.device_id, p.rule) == ("n1/g1", 4)


def test_commit_prevents_double_booking() -> None:
    view = ClusterView(ClusterSnapshot([Node("n0", 2)], [Device("n0/g0", "n0", "T4")]))
    first = view.place("m", 1, 0.6, "T4", [])
    assert first is not None
    view.commit(first, 1, 0.6)
    assert view.place("m", 1, 0.6, "T4", []) is None  # only 0.4 of the GPU left
    second = view.place("m", 1, 0.4, "T4", [])
    assert second is not None
    view.commit(second, 1, 0.4)
    assert view.place("m", 1, 0.0, "cpu", []) is None  # both vCPUs taken by the two new (busy) workers


def test_warm_worker_is_used_once_per_round() -> None:
    ws = [gpu_worker("a", "n0", "n0/g0", 0.5, "m")]
    view = ClusterView(ClusterSnapshot(NODES, DEVS, ws))
    p = view.place("m", 1, 0.5, "T4", [])
    assert p is not None and p.worker_id == "a"
    view.commit(p, 1, 0.5)
    p2 = view.place("m", 1, 0.5, "T4", [])
    assert p2 is not None and p2.worker_id is None  # a second batch needs a new worker


def test_eviction_frees_a_worker_slot_least_recently_used_first() -> None:
    # One node with room for 2 workers, both taken by idle workers of other stages; the older goes.
    ws = [
        Worker("old", "n0", None, "cpu", 1, 0.0, "x", idle_since_ms=10.0),
        Worker("new", "n0", None, "cpu", 1, 0.0, "y", idle_since_ms=50.0),
    ]
    view = ClusterView(ClusterSnapshot([Node("n0", 2, max_workers=2)], [], ws))
    p = view.place("m", 1, 0.0, "cpu", [])
    assert p is not None and p.evict == ("old",) and p.cold
    view.commit(p, 1, 0.0)
    assert "old" not in view.idle and view.free_vcpus["n0"] == 1 and view.free_slots["n0"] == 0
    no_evict = ClusterView(ClusterSnapshot([Node("n0", 2, max_workers=2)], [], ws), allow_eviction=False)
    assert no_evict.place("m", 1, 0.0, "cpu", []) is None


def test_idle_workers_hold_no_compute_but_busy_ones_do() -> None:
    # 2 vCPUs: an idle 2-vCPU worker leaves both free; a busy one leaves none, and eviction cannot help.
    idle = Worker("i", "n0", None, "cpu", 2, 0.0, "x", idle_since_ms=0.0)
    view = ClusterView(ClusterSnapshot([Node("n0", 2)], [], [idle]))
    assert view.free_vcpus["n0"] == 2 and view.can_start(2, 0.0, "cpu")
    busy = Worker("b", "n0", None, "cpu", 2, 0.0, "x", busy=True)
    view = ClusterView(ClusterSnapshot([Node("n0", 2)], [], [busy, idle]))
    assert not view.can_start(1, 0.0, "cpu")
    assert view.place("x", 2, 0.0, "cpu", []) is None  # the idle warm worker has no compute to run on


def test_mps_client_limit_is_respected() -> None:
    dev = Device("n0/g0", "n0", "T4", max_clients=2)
    ws = [gpu_worker("a", "n0", "n0/g0", 0.1, "x", busy=True), gpu_worker("b", "n0", "n0/g0", 0.1, "y", busy=True)]
    view = ClusterView(ClusterSnapshot([Node("n0", 8)], [dev], ws))
    assert view.place("m", 1, 0.1, "T4", []) is None  # 0.8 free, but two clients already


def test_cpu_placement_best_fit_on_vcpus() -> None:
    busy = Worker("w", "n1", None, "cpu", 6, 0.0, "x", busy=True)  # n1: 2 vCPUs free, n0: 8
    view = ClusterView(ClusterSnapshot(NODES, [], [busy]))
    p = view.place("m", 2, 0.0, "cpu", [])
    assert p is not None and (p.node, p.device_id) == ("n1", None)  # 0 vCPUs left on n1 vs 6 on n0
    assert view.free_slots["n0"] == float("inf")


def _fits_by_search(view: ClusterView, vcpus: int, share: float, hardware: str) -> bool:
    """The capacity question answered the slow way: is there a place where ``_room`` finds room?"""
    need = round(share * 100)
    if hardware == "cpu":
        return any(view._room(n, None, vcpus, 0) is not None for n in view.node_order)
    return any(
        view._room(d.node, dev, vcpus, need) is not None for dev, d in view.devices.items() if d.hardware == hardware
    )


def test_can_start_agrees_with_placement_search_for_every_share() -> None:
    ws = [
        gpu_worker("a", "n0", "n0/g0", 0.6, "m", busy=True),
        gpu_worker("b", "n1", "n1/g0", 0.3, "x", idle=5.0),
        gpu_worker("c", "n1", "n1/g1", 0.9, "y", busy=True),
    ]
    for evict in (True, False):
        view = ClusterView(ClusterSnapshot(NODES, DEVS, ws), allow_eviction=evict)
        for share in (0.1, 0.3, 0.4, 0.5, 0.7, 1.0):
            assert view.can_start(1, share, "T4") == _fits_by_search(view, 1, share, "T4"), (evict, share)
        assert view.max_room(1, "T4") == (100 if evict else 70)
        assert view.max_room(9, "T4") == -1  # no node has 9 vCPUs


def test_view_copies_are_independent_and_share_answers_until_a_commit() -> None:
    snap = ClusterSnapshot(NODES, DEVS, [gpu_worker("a", "n0", "n0/g0", 0.5, "m")])
    base = ClusterView(snap)
    first = base.copy()
    assert first.warm_resources("m") == {("T4", 1, 0.5)}
    p = first.place("m", 1, 0.5, "T4", [])
    assert p is not None and p.worker_id == "a"
    first.commit(p, 1, 0.5)
    assert first.warm_resources("m") == set() and "a" not in first.idle
    second = base.copy()  # the commit to the first copy shows in neither the base nor a later copy
    assert "a" in second.idle and second.warm_resources("m") == {("T4", 1, 0.5)}
    assert second.free_vcpus == {"n0": 8, "n1": 8}


def test_view_cache_rebuilds_only_for_a_new_snapshot() -> None:
    from esg_prefect.scheduling.dispatch import ViewCache

    snap = ClusterSnapshot(NODES, DEVS, [gpu_worker("a", "n0", "n0/g0", 0.5, "m")])
    cache = ViewCache()
    v1 = cache.view(snap)
    v1.commit(Placement("n0", "n0/g0", "a", 2), 1, 0.5)
    assert "a" in cache.view(snap).idle  # a fresh copy, not the committed one
    other = ClusterSnapshot(NODES, DEVS, [])
    assert cache.view(other).idle == {}
