"""Idle-aware ESG (``idle_aware``): options carry the idle time they cause as well as their busy time.

Hand-worked on one CPU stage: batch time 10 ms + 2 ms per item, cold start 100 ms, one vCPU at
1e-3 $/s, keep-alive 60 s (at least 20 cold starts, 2 s, under the histogram policy). A batch of 1 on a new worker bills
112 ms busy and at least its keep-alive idle; a warm worker's batch bills its busy time and the idle
gap it closes past one cold start.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import pytest

from esg_prefect.exceptions import ConfigError
from esg_prefect.model import ConfigSpace, Job, LatencyProfile, PriceSheet, ProfilePoint, QueueKey, Workflow
from esg_prefect.model.cluster import ClusterSnapshot, Node, Worker
from esg_prefect.scheduling import ESGScheduler, ESGSettings, QueueState, Snapshot
from esg_prefect.scheduling.tables import CandidateTables, gap_class, gap_ms

PROFILE = LatencyProfile(
    [ProfilePoint("m", "cpu", b, 1, 0.0, 10.0 + 2 * b, 10.0 + 2 * b) for b in (1, 2, 4)], {("m", "cpu"): 100.0}
)
PRICES = PriceSheet(1e-3, {})
WF = Workflow.chain("w", ["m"], 200.0)
Q = QueueKey("w", "m")


def settings(**kw: object) -> ESGSettings:
    return ESGSettings(config_space=ConfigSpace((1, 2, 4), (1,), (0.0,)), keep_alive_s=60.0, prewarm=False, **kw)  # type: ignore[arg-type]


def test_a_cold_option_costs_its_keep_alive_and_a_warm_one_the_gap_it_closes() -> None:
    fixed = CandidateTables(PROFILE, PRICES, settings(keep_alive_policy="fixed"))
    hist = CandidateTables(PROFILE, PRICES, settings())
    off = CandidateTables(PROFILE, PRICES, settings(idle_aware=False))
    cold, warm = ("cpu", 1, 0.0, 0), ("cpu", 1, 0.0, 1)
    assert off.single_option("m", cold, 1).cost == pytest.approx(1e-3 * 0.112)  # type: ignore[union-attr]
    assert fixed.single_option("m", cold, 1).cost == pytest.approx(1e-3 * (0.112 + 60.0))  # type: ignore[union-attr]
    assert hist.single_option("m", cold, 1).cost == pytest.approx(1e-3 * (0.112 + 2.0))  # type: ignore[union-attr]
    assert hist.single_option("m", warm, 4).cost == pytest.approx(1e-3 * 0.018 / 4)  # type: ignore[union-attr]
    # Idle 800 ms: class 2 + floor(log2(800 / 8)) = 8, which stands for 8 * 2^6 = 512 ms; past the
    # 100 ms cold start, 412 ms are billed to the batch that ends the gap.
    assert gap_class(800.0) == 8 and gap_ms(8) == 512.0 and gap_class(7.9) == 1 and gap_ms(1) == 0.0
    long_gap = ("cpu", 1, 0.0, 8)
    assert hist.single_option("m", long_gap, 4).cost == pytest.approx(1e-3 * (0.018 + 0.412) / 4)  # type: ignore[union-attr]
    # Never more than its cold twin's extra (cold start + keep-alive): a 60 s gap bills 2.1 s.
    assert hist.single_option("m", ("cpu", 1, 0.0, gap_class(60_000.0)), 1).cost == pytest.approx(  # type: ignore[union-attr]
        1e-3 * (0.012 + 2.1)
    )
    assert off.single_option("m", long_gap, 4).cost == pytest.approx(1e-3 * 0.018 / 4)  # type: ignore[union-attr]


def test_a_worker_in_steady_use_beats_a_cheaper_one_that_has_idled() -> None:
    """Two idle warm workers: 2 vCPUs (busy dearer: 7 ms at 2e-3 $/s) used 2 ms ago, 1 vCPU (12 ms at 1e-3)
    idle for 800 ms. Busy time alone the 1-vCPU one is cheaper; using it bills its 800 ms gap, and the
    other's does not, so idle-aware ESG takes the worker in use and lets the idle one expire."""
    profile = LatencyProfile(
        [ProfilePoint("m", "cpu", b, v, 0.0, t, t) for b in (1, 2, 4) for v, t in ((1, 10.0 + 2 * b), (2, 6.0 + b))],
        {("m", "cpu"): 100.0},
    )
    space = ConfigSpace((1, 2, 4), (1, 2), (0.0,))
    recent = Worker("w2", "n0", None, "cpu", 2, 0.0, "m", False, 998.0, False, None)
    stale = Worker("w1", "n0", None, "cpu", 1, 0.0, "m", False, 200.0, False, None)
    cluster = ClusterSnapshot([Node("n0", 4, max_workers=8)], [], [stale, recent])
    job = (Job("j0", "r0", "r0", Q, 1000.0, 1000.0, 1150.0, 1150.0),)
    for aware, chosen in ((False, "w1"), (True, "w2")):
        s = ESGSettings(config_space=space, prewarm=False, idle_aware=aware)
        res = ESGScheduler(profile, PRICES, s).decide(Snapshot((QueueState(Q, job),), cluster, {"w": WF}), 1000.0)
        assert [d.placement.worker_id for d in res.dispatches] == [chosen]


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


def test_late_jobs_wait_for_their_stages_busy_worker_rather_than_evict_another_stages_idle_one() -> None:
    """A full node (2 worker slots): m's worker busy until 10 s, x's worker idle. A late job of m would
    start a worker by stopping x's; idle-aware ESG keeps it waiting instead (past capacity, such
    evictions feed a cold-start storm), the paper's ESG evicts."""
    busy = Worker("w1", "n0", None, "cpu", 1, 0.0, "m", True, None, False, 10_000.0)
    other = Worker("w2", "n0", None, "cpu", 1, 0.0, "x", False, 0.0, False, None)
    cluster = ClusterSnapshot([Node("n0", 2, max_workers=2)], [], [busy, other])
    late = (Job("j0", "r0", "r0", Q, 0.0, 0.0, 50.0, 50.0),)  # a cold start (100 ms) cannot make it
    for aware in (False, True):
        res = ESGScheduler(PROFILE, PRICES, settings(idle_aware=aware)).decide(
            Snapshot((QueueState(Q, late),), cluster, {"w": WF}), 0.0
        )
        if aware:
            assert res.dispatches == () and [h.reason for h in res.holds] == [
                "no plan meets the slack; the jobs wait for a busy warm worker of the stage"
            ]
        else:
            (d,) = res.dispatches
            assert d.at_risk and d.placement.cold and d.placement.evict == ("w2",)
    # A stage with no worker at all may still evict: it would otherwise never run.
    alone = ClusterSnapshot([Node("n0", 1, max_workers=1)], [], [other])
    res = ESGScheduler(PROFILE, PRICES, settings()).decide(Snapshot((QueueState(Q, late),), alone, {"w": WF}), 0.0)
    assert [d.placement.evict for d in res.dispatches] == [("w2",)]


def test_a_queues_second_batch_waits_for_the_worker_its_first_took() -> None:
    """One warm worker, four jobs 150 ms from their deadline, batches of 0.1 ms (1 job) or 1.5 ms (2-4 jobs,
    so one at a time is cheapest per job) and a 800 ms cold start. The round sends the first job to the
    warm worker; the other three then see no idle worker, and a cold start misses their deadline: no plan
    meets the slack. Before, best effort started a worker for them (800 ms, late); the worker the first
    batch took frees 0.1 ms later and runs them well in time, so they wait for it."""
    profile = LatencyProfile(
        [ProfilePoint("m", "cpu", b, 1, 0.0, t, t) for b, t in ((1, 0.1), (2, 1.5), (4, 1.5))],
        {("m", "cpu"): 800.0},
    )
    cluster = ClusterSnapshot([Node("n0", 4, max_workers=8)], [], [worker("w1", busy=False)])
    snap = Snapshot((QueueState(Q, jobs(4, 1150.0)),), cluster, {"w": WF})
    for wait, cold_starts in ((True, 0), (False, 1)):
        res = ESGScheduler(profile, PRICES, settings(wait_for_busy_warm=wait)).decide(snap, 1000.0)
        assert (len(res.dispatches[0].job_ids), res.dispatches[0].placement.worker_id) == (1, "w1")
        assert sum(d.placement.worker_id is None for d in res.dispatches) == cold_starts
        if wait:
            assert any("a worker this round took frees up within the slack" in h.reason for h in res.holds)


def test_no_lookahead_start_for_a_next_stage_whose_busy_worker_serves_it_first() -> None:
    """A wavy stage 'n' after 'm': 0.04 ms batches, a 360 ms cold start. A batch of 'm' going out calls for a
    worker of 'n'; its one worker is busy for 0.05 ms more. Before, a lookahead start loaded a second one
    (360 ms of load per burst, more than the whole pipeline's compute); now that worker serves the batch,
    and a start is made only when the busy worker would be as late as a tenth of the cold start."""
    from esg_prefect.model.cluster import ClusterSnapshot
    from esg_prefect.scheduling.dispatch import ClusterView

    profile = LatencyProfile(
        [ProfilePoint(s, "cpu", b, 1, 0.0, t, t) for s, t in (("m", 0.1), ("n", 0.04)) for b in (1, 2, 4)],
        {("m", "cpu"): 800.0, ("n", "cpu"): 360.0},
    )
    wf = Workflow.chain("w", ["m", "n"], 200.0)
    sched = ESGScheduler(profile, PRICES, settings(lookahead_starts=True))
    look = sched._lookahead
    assert look is not None
    look.observe({"n": [0.0, 10.0, 1000.0, 1010.0, 2000.0, 3000.0]})  # calls in bursts a second apart: waves
    assert look.waves.in_waves("n")
    for free_in, started in ((0.05, 0), (50.0, 1)):
        busy = Worker("w2", "n0", None, "cpu", 1, 0.0, "n", True, None, False, 3000.0 + free_in)
        view = ClusterView(ClusterSnapshot([Node("n0", 4, max_workers=8)], [], [busy]))
        starts: list[Any] = []
        look.starts(
            [(wf, "m", 1)], (wf,), view, partial(sched.placeable_resources, view=view, now_ms=3000.0), starts, 3000.0
        )
        assert len(starts) == started, (free_in, starts)


# A stage whose profile makes one call at a time the cheapest per call (as a noisy CPU profile may): 0.2 ms for
# a batch of 1, 3 ms for 2, 5 ms for 4, and a 250 ms cold start, one vCPU at 1e-5 $/s.
SPLIT = LatencyProfile(
    [ProfilePoint("m", "cpu", b, 1, 0.0, t, t) for b, t in ((1, 0.2), (2, 3.0), (4, 5.0))], {("m", "cpu"): 250.0}
)


@pytest.mark.parametrize(("wait", "cold_starts"), [(0.0, 1), (0.05, 0), (ESGSettings().wait_for_taken, 0)])
def test_a_planned_cold_start_waits_for_a_worker_the_round_took(wait: float, cold_starts: int) -> None:
    """Three idle warm workers, four jobs with 430 ms of slack. ESG sends one job to each warm worker (batches
    of one are the cheapest per job); the fourth then sees no idle worker, and a cold start (250 ms) fits its
    slack: a planned start. With ``wait_for_taken`` it waits for a worker the round took, free 0.2 ms later
    (within 5 % of the cold option's 250.2 ms), instead of paying 250 ms of cold start for 0.2 ms of work."""
    warm = [Worker(f"w{i}", "n0", None, "cpu", 1, 0.0, "m", False, 900.0, False, None) for i in (1, 2, 3)]
    cluster = ClusterSnapshot([Node("n0", 4, max_workers=8)], [], warm)
    snap = Snapshot((QueueState(Q, jobs(4, 1430.0)),), cluster, {"w": Workflow.chain("w", ["m"], 500.0)})
    res = ESGScheduler(SPLIT, PriceSheet(1e-5, {}), settings(wait_for_taken=wait)).decide(snap, 1000.0)
    used = [d.placement.worker_id for d in res.dispatches]
    assert sorted(w for w in used if w) == ["w1", "w2", "w3"] and used.count(None) == cold_starts
    assert all(not d.at_risk and d.config.batch == 1 for d in res.dispatches)
    if wait:
        assert [h.reason for h in res.holds] == ["a worker this round took frees up within the slack: no new worker"]


def test_waiting_for_a_taken_worker_saves_the_cold_start_on_the_whole_bill() -> None:
    """The same stage simulated: one job at 0 ms starts w1; three at 400 ms. w1 takes the first at once and the
    next at 401 ms; the third then started w2 (250 ms of cold start, billed) and now waits 1 ms for w1. Every
    request meets its 500 ms SLO either way; the bill after the 300 ms warm-up falls from 2.506e-6 $ (two
    batches of 0.2 ms and w2's 250.2 ms) to 6e-9 $ (three of 0.2 ms)."""
    from esg_prefect.simulator import SimSpec, simulate
    from esg_prefect.simulator.case import Case, ClusterSpec, NodeSpec, WorkloadSpec

    arrivals = [(0.0, "w")] + [(400.0 + 0.01 * i, "w") for i in range(3)]
    bills = {}
    for wait, workers in ((0.0, 2), (0.05, 1)):
        case = Case(
            "split",
            (Workflow.chain("w", ["m"], 500.0),),
            SPLIT,
            PriceSheet(1e-5, {}),
            ClusterSpec((NodeSpec("n0", 4),)),
            WorkloadSpec("poisson", 1.0),
            1.0,
            settings=ESGSettings(config_space=ConfigSpace((1, 2, 4), (1,), (0.0,)), wait_for_taken=wait),
            sim=SimSpec(service_time="p95"),
            warmup_s=0.3,
        )
        run = simulate(case, arrivals=arrivals)
        assert run.cold_starts == workers and run.report.overall.slo_hit_rate == 1.0
        bills[wait] = run.report.overall.cost_total
    assert bills[0.0] == pytest.approx(1e-5 * (0.2 + 0.2 + 250.2) / 1000.0)
    assert bills[0.05] == pytest.approx(1e-5 * 3 * 0.2 / 1000.0)


def test_wait_for_taken_is_a_fraction() -> None:
    for bad in (-0.1, 1.5, math.nan, "0.05", True):
        with pytest.raises(ConfigError, match="wait_for_taken must be in \\[0, 1\\]"):
            ESGSettings(wait_for_taken=bad)  # type: ignore[arg-type]
