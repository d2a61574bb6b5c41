"""The simulated cluster: placements, idle billing, snapshots, eviction, and a batch's timing."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from esg_prefect.exceptions import InvalidInputError
from esg_prefect.model.cluster import ClusterSnapshot
from esg_prefect.model.config import Config
from esg_prefect.model.profile import LatencyProfile, ProfilePoint
from esg_prefect.scheduling.base import Placement
from esg_prefect.simulator import ClusterSpec, NodeSpec, SimSpec
from esg_prefect.simulator.cluster import SimCluster

GPU_PROFILE = LatencyProfile(
    [ProfilePoint("m", "T4", 1, 1, s, 10.0) for s in (0.5, 1.0)] + [ProfilePoint("m", "cpu", 1, 1, 0.0, 40.0)],
    {("m", "T4"): 100.0},
)


def cluster(sim: SimSpec | None = None) -> SimCluster:
    spec = ClusterSpec((NodeSpec("n0", 4, ("T4",)), NodeSpec("n1", 4)))
    return SimCluster(spec, GPU_PROFILE, sim or SimSpec(service_time="mean"), 1000.0, random.Random(0))


def test_cluster_applies_placements_and_bills_idle_time() -> None:
    c = cluster()
    w = c.acquire(Placement("n0", "n0/gpu0", None, 4), "m", Config(1, 1, 0.5), "T4", 0.0)
    assert (w.worker_id, w.busy, c.cold_starts) == ("w1", True, 1)
    assert c.snapshot().workers[0].busy
    with pytest.raises(InvalidInputError, match="which is busy"):
        c.acquire(Placement("n0", "n0/gpu0", "w1", 1), "m", Config(1, 1, 0.5), "T4", 1.0)
    with pytest.raises(InvalidInputError, match=r"needs share 0\.6 of n0/gpu0: 0\.50 free"):
        c.acquire(Placement("n0", "n0/gpu0", None, 4), "m", Config(1, 1, 0.6), "T4", 1.0)
    with pytest.raises(InvalidInputError, match="needs 5 vCPUs on n1, 4 free"):
        c.acquire(Placement("n1", None, None, 4), "m", Config(1, 5, 0.0), "cpu", 1.0)
    from esg_prefect.model.attribution import BatchItem, BatchRecord

    rec = BatchRecord("b1", "w1", (BatchItem("r", "r"),), Config(1, 1, 0.5), "T4", 0.0, 110.0)
    assert c.finish(w, rec, 110.0) == 1110.0  # idle from 110: its keep-alive runs out at 1110
    assert not w.busy and c.expire(500.0) == []  # not yet
    # reused at 300: idle 110-300 billed, and the expiry at 1110 no longer holds
    assert c.acquire(Placement("n0", "n0/gpu0", "w1", 1), "m", Config(1, 1, 0.5), "T4", 300.0) is w
    assert c.finish(w, replace(rec, start_ms=300.0, end_ms=310.0), 310.0) == 1310.0
    assert c.expire(1200.0) == [] and c.next_expiry_ms() == 1310.0
    assert c.expire(1400.0) == [w] and "w1" not in c.workers
    assert [(i.start_ms, i.end_ms) for i in c.idles] == [(110.0, 300.0), (310.0, 1310.0)]  # billed to its expiry
    # the capacity is back: a whole GPU fits again
    c.acquire(Placement("n0", "n0/gpu0", None, 4), "m", Config(1, 1, 1.0), "T4", 1400.0)


def test_cluster_snapshot_equals_a_checked_one() -> None:
    # The simulated cluster builds its snapshots without ClusterSnapshot's O(workers) check
    # (it checks each placement as it applies it); a checked snapshot of the same state is equal.
    c = cluster()
    w = c.acquire(Placement("n0", "n0/gpu0", None, 4), "m", Config(1, 1, 0.5), "T4", 0.0)
    c.acquire(Placement("n1", None, None, 4), "m", Config(1, 2, 0.0), "cpu", 0.0)
    from esg_prefect.model.attribution import BatchItem, BatchRecord

    c.finish(w, BatchRecord("b1", "w1", (BatchItem("r", "r"),), Config(1, 1, 0.5), "T4", 0.0, 10.0), 10.0)
    snap = c.snapshot()
    checked = ClusterSnapshot(snap.nodes, snap.devices, snap.workers)
    assert snap == checked and snap.hardware_types() == checked.hardware_types() == {"cpu", "T4"}
    assert [(x.worker_id, x.busy) for x in snap.workers] == [("w1", False), ("w2", True)]


def test_cluster_eviction_needs_an_idle_victim() -> None:
    c = cluster()
    c.acquire(Placement("n0", "n0/gpu0", None, 4), "m", Config(1, 1, 0.5), "T4", 0.0)
    with pytest.raises(InvalidInputError, match="evicts 'w1', which is busy"):
        c.acquire(Placement("n0", "n0/gpu0", None, 4, ("w1",)), "m", Config(1, 1, 1.0), "T4", 1.0)


def test_timing_cold_start_transfer_and_interference() -> None:
    sim = SimSpec(
        service_time="mean",
        interference_per_corunner=0.05,
        network_latency_ms=0.5,
        network_gbps=10.0,
        payload_kb=1000.0,
    )
    c = cluster(sim)
    w1 = c.acquire(Placement("n0", "n0/gpu0", None, 4), "m", Config(1, 1, 0.5), "T4", 0.0)
    t1 = c.timing(w1, "m", Config(1, 1, 0.5), cold=True, remote_inputs=0)
    assert (t1.cold_start_ms, t1.transfer_ms, t1.exec_ms, t1.total_ms) == (100.0, 0.0, 10.0, 110.0)
    c.begin(w1)
    w2 = c.acquire(Placement("n0", "n0/gpu0", None, 4), "m", Config(1, 1, 0.5), "T4", 0.0)
    t2 = c.timing(w2, "m", Config(1, 1, 0.5), cold=False, remote_inputs=2)
    # one busy co-runner: 10 * 1.05; two 1000 KB inputs over 10 Gb/s: 0.5 + 2 * 8192 kbit / 10,000 kbit/ms
    assert t2.exec_ms == pytest.approx(10.5)
    assert t2.transfer_ms == pytest.approx(0.5 + 2 * 8192.0 / 10_000.0)
    with pytest.raises(InvalidInputError, match="no profile covers it"):
        c.timing(w2, "m", Config(2, 1, 0.5), cold=False, remote_inputs=0)
