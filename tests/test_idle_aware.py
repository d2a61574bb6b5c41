"""Idle-aware ESG (``idle_aware``): a new worker's options carry the keep-alive it will idle through.

Hand-worked on one CPU stage: batch time 10 ms + 2 ms per item, cold start 100 ms, one vCPU at
1e-3 $/s, keep-alive 60 s. A batch of 1 on a new worker bills 112 ms busy and at least 60 s idle;
a warm worker's batch bills only its busy time.
"""

from __future__ import annotations

import pytest

from esg_prefect.model import ConfigSpace, Job, LatencyProfile, PriceSheet, ProfilePoint, QueueKey, Workflow
from esg_prefect.model.cluster import ClusterSnapshot, Node, Worker
from esg_prefect.scheduling import ESGScheduler, ESGSettings, QueueState, Snapshot
from esg_prefect.scheduling.tables import CandidateTables

PROFILE = LatencyProfile(
    [ProfilePoint("m", "cpu", b, 1, 0.0, 10.0 + 2 * b, 10.0 + 2 * b) for b in (1, 2, 4)], {("m", "cpu"): 100.0}
)
PRICES = PriceSheet(1e-3, {})
WF = Workflow.chain("w", ["m"], 200.0)
Q = QueueKey("w", "m")


def settings(**kw: object) -> ESGSettings:
    return ESGSettings(config_space=ConfigSpace((1, 2, 4), (1,), (0.0,)), keep_alive_s=60.0, prewarm=False, **kw)  # type: ignore[arg-type]


def test_a_cold_option_costs_its_keep_alive_and_a_warm_one_does_not() -> None:
    on = CandidateTables(PROFILE, PRICES, settings())
    off = CandidateTables(PROFILE, PRICES, settings(idle_aware=False))
    cold, warm = ("cpu", 1, 0.0, False), ("cpu", 1, 0.0, True)
    assert off.single_option("m", cold, 1).cost == pytest.approx(1e-3 * 0.112)  # type: ignore[union-attr]
    assert on.single_option("m", cold, 1).cost == pytest.approx(1e-3 * (0.112 + 60.0))  # type: ignore[union-attr]
    assert on.single_option("m", warm, 4).cost == pytest.approx(1e-3 * 0.018 / 4)  # type: ignore[union-attr]


def jobs(n: int, deadline: float) -> tuple[Job, ...]:
    return tuple(Job(f"j{i}", f"r{i}", f"r{i}", Q, 0.0, 0.0, deadline, deadline) for i in range(n))


def worker(wid: str, busy: bool, free_at: float | None = None) -> Worker:
    return Worker(wid, "n0", None, "cpu", 1, 0.0, "m", busy, None if busy else 0.0, False, free_at)


def decide(s: ESGSettings, workers: list[Worker], n: int, deadline: float) -> tuple[list[tuple[int, bool]], list[str]]:
    sched = ESGScheduler(PROFILE, PRICES, s)
    cluster = ClusterSnapshot([Node("n0", 4, max_workers=8)], [], workers)
    res = sched.decide(Snapshot((QueueState(Q, jobs(n, deadline)),), cluster, {"w": WF}), 0.0)
    return [(d.config.batch, d.placement.cold) for d in res.dispatches], [h.reason for h in res.holds]


def test_a_warm_worker_soon_free_beats_starting_a_second_one_when_the_slack_allows() -> None:
    busy = [worker("w1", busy=True, free_at=20.0)]
    # Slack 150 ms: a new worker (100 ms cold + 18 ms for 4) fits, and so does w1 once free at 20 ms
    # (20 + 18). Busy time alone, the new worker is the plan; with its idle time billed, w1 is.
    assert decide(settings(idle_aware=False), busy, 4, 150.0) == ([(4, True)], [])
    dispatched, held = decide(settings(), busy, 4, 150.0)
    assert dispatched == [] and held == ["a busy warm worker frees up within the slack: no new worker"]
    # Free too late for the slack (w1 ends at 140 ms): a new worker starts, idle-aware or not.
    assert decide(settings(), [worker("w1", busy=True, free_at=140.0)], 4, 150.0)[0] == [(4, True)]


def test_an_idle_warm_worker_takes_the_whole_queue_in_one_batch() -> None:
    # Two jobs, slack 150 ms: the warm idle worker runs them as one batch; nobody starts.
    assert decide(settings(), [worker("w1", busy=False)], 2, 150.0) == ([(2, False)], [])


def test_the_worker_view_carries_when_a_busy_worker_frees_up() -> None:
    w = worker("w1", busy=True, free_at=20.0)
    assert w.free_at_ms == 20.0 and worker("w2", busy=False).free_at_ms is None
