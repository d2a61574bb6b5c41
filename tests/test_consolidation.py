"""Consolidation (``consolidate_slack``): wait for a busy, no dearer worker rather than keep a surplus one.

Hand-worked on one CPU stage ``m``: batch 1 takes 10 ms on 1 vCPU (cost 10
units), 8 ms on 2 vCPUs (16 units). ``w0`` is busy until ``free`` ms, ``w1``
idle since ``idle_since`` ms; each queue holds one job due at 100 ms, so at
``now = 0`` the slack is 100 ms and, by default, a hold may use half of it.
"""

from __future__ import annotations

import math

import pytest

from esg_prefect.exceptions import ConfigError
from esg_prefect.model import (
    ClusterSnapshot,
    ConfigSpace,
    Job,
    LatencyProfile,
    Node,
    PriceSheet,
    ProfilePoint,
    QueueKey,
    Worker,
    Workflow,
)
from esg_prefect.scheduling import ESGScheduler, ESGSettings, QueueState, SchedulingResult, Snapshot

PROFILE = LatencyProfile(
    [ProfilePoint("m", "cpu", 1, 1, 0.0, 10.0), ProfilePoint("m", "cpu", 1, 2, 0.0, 8.0)], {("m", "cpu"): 100.0}
)
SPACE = ConfigSpace((1,), (1, 2), (0.0,))
FLOWS = [Workflow.chain(f"w{i}", ["m"], slo_ms=1000) for i in range(3)]


def decide(
    free: float = 5.0, idle_since: float = -200.0, queues: int = 1, busy_vcpus: int = 1, **settings: object
) -> SchedulingResult:
    sched = ESGScheduler(PROFILE, PriceSheet(1e-3, {}), ESGSettings(config_space=SPACE, **settings))  # type: ignore[arg-type]
    busy = Worker("w0", "node0", None, "cpu", busy_vcpus, 0.0, "m", busy=True, free_at_ms=free)
    idle = Worker("w1", "node0", None, "cpu", 1, 0.0, "m", idle_since_ms=idle_since)
    cluster = ClusterSnapshot([Node("node0", 4, max_workers=2)], [], [busy, idle])
    qs = []
    for wf in FLOWS[:queues]:
        key = QueueKey(wf.name, "m")
        job = Job(f"{wf.name}-j", f"{wf.name}-r", f"{wf.name}-run", key, 0.0, 0.0, 100.0, 100.0)
        qs.append(QueueState(key, (job,)))
    return sched.decide(Snapshot(tuple(qs), cluster, {wf.name: wf for wf in FLOWS}), 0.0)


def where(res: SchedulingResult) -> list[str]:
    """Per queue in decision order: the worker dispatched to, or 'hold'."""
    out = {d.queue.workflow: d.placement.worker_id for d in res.dispatches}
    out.update({h.queue.workflow: "hold" for h in res.holds})
    return [out[k] for k in sorted(out)]


def test_a_surplus_idle_worker_is_passed_over_for_a_busy_one_that_ends_in_time() -> None:
    # w0 frees at 5 ms and runs the job by 15 ms, within half the 100 ms slack, at the same cost
    # per job as w1: the queue waits for w0, and w1 (idle 200 ms) is left to expire.
    res = decide()
    assert where(res) == ["hold"]
    assert "no dearer per job" in res.holds[0].reason
    assert where(decide(consolidate_slack=0.0)) == ["w1"]  # off: the idle worker is used
    assert where(decide(idle_aware=False)) == ["w1"]  # busy-time objective: no idle to save


def test_a_worker_in_steady_use_is_used_at_once() -> None:
    # w1 has idled 50 ms, under consolidate_idle_ms (100): it is in use, waiting would only delay.
    assert where(decide(idle_since=-50.0)) == ["w1"]
    assert where(decide(idle_since=-50.0, consolidate_idle_ms=40.0)) == ["hold"]


def test_the_hold_uses_at_most_its_fraction_of_the_slack() -> None:
    # w0 frees at 45 ms: 45 + 10 = 55 ms, over half the slack (50 ms) but within all of it.
    assert where(decide(free=45.0)) == ["w1"]
    assert where(decide(free=45.0, consolidate_slack=0.6)) == ["hold"]
    assert where(decide(free=40.0)) == ["hold"]  # 40 + 10 = 50: at the limit, still in


def test_a_dearer_busy_worker_is_not_waited_for() -> None:
    # w0 holds 2 vCPUs: the job would cost 2 x 8 = 16 units there against 10 on w1.
    assert where(decide(busy_vcpus=2)) == ["w1"]


def test_holds_of_one_round_book_the_busy_worker_in_turn() -> None:
    # Three queues of stage m, w0 free at 25 ms: the first waits (ends 35), the second after it
    # (45), the third would end at 55 > 50 and takes w1. Without booking all three would wait.
    assert where(decide(free=25.0, queues=3)) == ["hold", "hold", "w1"]


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        ("consolidate_slack", -0.1),
        ("consolidate_slack", 1.5),
        ("consolidate_slack", math.nan),
        ("consolidate_slack", "0.5"),
        ("consolidate_slack", True),
        ("consolidate_idle_ms", -1.0),
        ("consolidate_idle_ms", math.inf),
        ("consolidate_idle_ms", math.nan),
        ("consolidate_idle_ms", "100"),
    ],
)
def test_bad_consolidation_values_are_refused_by_name(name: str, bad: object) -> None:
    with pytest.raises(ConfigError, match=name):
        ESGSettings(**{name: bad})  # type: ignore[arg-type]
