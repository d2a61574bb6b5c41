"""ESG_1Q and the round: hand-worked cases and pre-warm starts (oracles: test_esg_scheduler_oracle.py)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import replace

import pytest

from esg_prefect.exceptions import ConfigError, UnknownSchedulerError
from esg_prefect.model import (
    ClusterSnapshot,
    Config,
    ConfigSpace,
    Job,
    LatencyProfile,
    Node,
    PriceSheet,
    ProfilePoint,
    QueueKey,
    Worker,
    Workflow,
    cpu_cluster,
)
from esg_prefect.scheduling import (
    ESGScheduler,
    ESGSettings,
    QueueState,
    Snapshot,
    create_scheduler,
    scheduler_names,
)

CPU_PRICE = 1e-3  # per vCPU-second: cost per request = vcpus * 1e-3 * L / 1000 / batch


def jobs_for(q: QueueKey, n: int, deadline: float, e2e: float | None = None, now: float = 0.0) -> tuple[Job, ...]:
    return tuple(Job(f"{q.stage}-j{i}", f"r{i}", f"run{i}", q, now, now, deadline, e2e or deadline) for i in range(n))


def one_stage(latency: dict[int, float], cold_ms: float = 0.0, **settings: object) -> ESGScheduler:
    """A stage 'm' on one vCPU of a CPU, with the given batch latencies."""
    prof = LatencyProfile(
        [ProfilePoint("m", "cpu", b, 1, 0.0, lat) for b, lat in latency.items()], {("m", "cpu"): cold_ms}
    )
    space = ConfigSpace(tuple(latency), (1,), (0.0,))
    return ESGScheduler(prof, PriceSheet(CPU_PRICE, {}), ESGSettings(config_space=space, **settings))  # type: ignore[arg-type]


def snap(sched_wf: Workflow, queues: list[QueueState], cluster: ClusterSnapshot | None = None) -> Snapshot:
    return Snapshot(tuple(queues), cluster or cpu_cluster(1, 4), {sched_wf.name: sched_wf})


WF1 = Workflow.chain("w", ["m"], slo_ms=1000)
Q1 = QueueKey("w", "m")


def test_full_batch_is_cheapest_when_slack_allows() -> None:
    # L(b) = 10 + 2b ms: b=1 12 ms, b=2 14 ms, b=4 18 ms. Cost per request = 1e-6 * L / b:
    # 12e-6, 7e-6, 4.5e-6. With 4 jobs and 100 ms of slack the whole queue goes as one batch.
    s = one_stage({1: 12.0, 2: 14.0, 4: 18.0})
    res = s.decide(snap(WF1, [QueueState(Q1, jobs_for(Q1, 4, 100.0))]), now_ms=0.0)
    assert [(d.config, d.predicted_ms, d.at_risk) for d in res.dispatches] == [(Config(4, 1, 0.0), 18.0, False)]
    assert res.dispatches[0].placement.rule == 4 and res.dispatches[0].placement.cold


def test_tight_slack_forces_smaller_batches() -> None:
    # Slack 15 ms: only b=1 (12) and b=2 (14) fit. b=2 is cheaper per request (7e-6 < 12e-6),
    # so two batches of 2 go, on two cold workers (the node has 4 vCPUs).
    s = one_stage({1: 12.0, 2: 14.0, 4: 18.0})
    res = s.decide(snap(WF1, [QueueState(Q1, jobs_for(Q1, 4, 15.0))]), now_ms=0.0)
    assert [d.config.batch for d in res.dispatches] == [2, 2]
    assert [d.job_ids for d in res.dispatches] == [("m-j0", "m-j1"), ("m-j2", "m-j3")]
    assert len(res.stats) == 2 and all(st.feasible for st in res.stats)


def test_waits_for_a_fuller_batch_only_while_feasible() -> None:
    # 2 jobs queued, arrivals at 1000/s: batch 4 fills in (4-2)/1000 s = 2 ms, then takes 18 ms = 20 ms
    # at 4.5e-6 per request, cheaper than sending 2 now (14 ms, 7e-6). Slack 100 ms: hold.
    s = one_stage({1: 12.0, 2: 14.0, 4: 18.0})
    res = s.decide(snap(WF1, [QueueState(Q1, jobs_for(Q1, 2, 100.0), arrival_rate_per_s=1000.0)]), 0.0)
    assert res.dispatches == () and len(res.holds) == 1
    assert "waiting for batch 4" in res.holds[0].reason and "2.0 ms" in res.holds[0].reason
    # Slack 19 ms: waiting (20 ms) no longer fits; the 2 queued jobs go now.
    res = s.decide(snap(WF1, [QueueState(Q1, jobs_for(Q1, 2, 19.0), arrival_rate_per_s=1000.0)]), 0.0)
    assert [d.config.batch for d in res.dispatches] == [2]
    # Waiting switched off: dispatch now whatever the slack.
    s2 = one_stage({1: 12.0, 2: 14.0, 4: 18.0}, wait_for_batch=False)
    res = s2.decide(snap(WF1, [QueueState(Q1, jobs_for(Q1, 2, 100.0), arrival_rate_per_s=1000.0)]), 0.0)
    assert [d.config.batch for d in res.dispatches] == [2]


def test_max_batch_wait_bounds_the_hold_for_a_fuller_batch() -> None:
    # The queue above (2 jobs, 1000/s: one gap is 1 ms; 100 ms of slack), its jobs queued at 0 and
    # a 30 ms bound. At 25 ms the oldest job plus one gap (26 ms) is within the bound: hold.
    s = one_stage({1: 12.0, 2: 14.0, 4: 18.0}, max_batch_wait_ms=30.0)
    q = QueueState(Q1, jobs_for(Q1, 2, 125.0), arrival_rate_per_s=1000.0)
    res = s.decide(snap(WF1, [q]), 25.0)
    assert res.dispatches == () and "waiting for batch 4" in res.holds[0].reason
    # At 29.5 ms, 29.5 + 1 > 30: the 2 jobs go now, though 95 ms of slack would allow the wait.
    res = s.decide(snap(WF1, [q]), 29.5)
    assert [(d.config.batch, d.at_risk) for d in res.dispatches] == [(2, False)]
    # A slow stream (2/s: one gap is 500 ms) with 2 s of slack: without a bound ESG holds the jobs
    # for batch 4 (2 more in 1 s, then 18 ms); under the bound they go at once.
    slow = QueueState(Q1, jobs_for(Q1, 2, 2000.0), arrival_rate_per_s=2.0)
    res = one_stage({1: 12.0, 2: 14.0, 4: 18.0}, max_batch_wait_ms=0.0).decide(snap(WF1, [slow]), 0.0)
    assert res.dispatches == () and "~1000.0 ms to fill" in res.holds[0].reason
    res = s.decide(snap(WF1, [slow]), 0.0)
    assert [d.config.batch for d in res.dispatches] == [2]


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, "50"])
def test_max_batch_wait_rejects_bad_values_by_name(bad: object) -> None:
    with pytest.raises(ConfigError, match="max_batch_wait_ms"):
        ESGSettings(max_batch_wait_ms=bad)  # type: ignore[arg-type]


def test_partial_batch_uses_interpolated_latency() -> None:
    # 3 jobs, batches {1, 4}: sending all 3 is a batch of 3 whose latency is interpolated between
    # b=1 (12) and b=4 (18): 12 + 6 * (3-1)/(4-1) = 16 ms, 1e-6*16/3 per request: the cheapest option.
    s = one_stage({1: 12.0, 4: 18.0})
    res = s.decide(snap(WF1, [QueueState(Q1, jobs_for(Q1, 3, 100.0))]), 0.0)
    assert [(d.config.batch, d.predicted_ms) for d in res.dispatches] == [(3, 16.0)]


def test_infeasible_best_effort_is_at_risk() -> None:
    # Slack 5 ms < fastest 12 ms: best effort sends the largest fillable batch (4) on the fastest
    # resources and marks it at risk.
    s = one_stage({1: 12.0, 2: 14.0, 4: 18.0})
    res = s.decide(snap(WF1, [QueueState(Q1, jobs_for(Q1, 4, 5.0))]), 0.0)
    assert [(d.config.batch, d.at_risk) for d in res.dispatches] == [(4, True)]
    assert res.stats[0].feasible is False
    assert "best effort" in res.dispatches[0].reason


def test_best_effort_tolerance_takes_the_cheapest_near_fastest_option() -> None:
    # No plan meets a 5 ms slack. On 4 vCPUs the job takes 10 ms at 4x the price per vCPU-second
    # (cost 4 * 10 = 40 units) and on 1 vCPU 12 ms (12 units): 20 % slower, 3.3x cheaper.
    prof = LatencyProfile(
        [ProfilePoint("m", "cpu", 1, 1, 0.0, 12.0), ProfilePoint("m", "cpu", 1, 4, 0.0, 10.0)], {("m", "cpu"): 0.0}
    )
    space = ConfigSpace((1,), (1, 4), (0.0,))

    def best_effort(tolerance: float) -> tuple[int, float, bool, str]:
        settings = ESGSettings(config_space=space, best_effort_tolerance=tolerance)
        s = ESGScheduler(prof, PriceSheet(CPU_PRICE, {}), settings)
        res = s.decide(snap(WF1, [QueueState(Q1, jobs_for(Q1, 1, 5.0))]), 0.0)
        (d,) = res.dispatches
        return d.config.vcpus, d.predicted_ms, d.at_risk, d.reason

    assert best_effort(0.0)[:3] == (4, 10.0, True)  # the spec's rule: the fastest
    assert best_effort(0.1)[:3] == (4, 10.0, True)  # 12 ms is over 10 * 1.1
    vcpus, predicted, at_risk, reason = best_effort(0.25)  # 12 ms is within 10 * 1.25: the cheaper one
    assert (vcpus, predicted, at_risk) == (1, 12.0, True)
    assert "cheapest option within 25% of the fastest" in reason
    assert best_effort(0.2)[:3] == (1, 12.0, True)  # the bound is inclusive


def test_default_tolerance_and_the_esg_fastest_ablation() -> None:
    # 1 vCPU: 11 ms (11 units); 4 vCPUs: 10 ms (40 units). No plan meets a 5 ms slack. By default
    # (tolerance 0.1) best effort takes the 1-vCPU option, 10 % slower and 3.6x cheaper; the
    # esg-fastest ablation (the spec's rule) takes the 4-vCPU one.
    from esg_prefect.scheduling import create_scheduler

    prof = LatencyProfile(
        [ProfilePoint("m", "cpu", 1, 1, 0.0, 11.0), ProfilePoint("m", "cpu", 1, 4, 0.0, 10.0)], {("m", "cpu"): 0.0}
    )
    settings = ESGSettings(config_space=ConfigSpace((1,), (1, 4), (0.0,)))
    assert settings.best_effort_tolerance == 0.1
    picks = {}
    for name in ("esg", "esg-fastest"):
        s = create_scheduler(name, prof, PriceSheet(CPU_PRICE, {}), settings)
        assert s.name == name
        (d,) = s.decide(snap(WF1, [QueueState(Q1, jobs_for(Q1, 1, 5.0))]), 0.0).dispatches
        picks[name] = (d.config.vcpus, d.predicted_ms, d.at_risk)
    assert picks == {"esg": (1, 11.0, True), "esg-fastest": (4, 10.0, True)}


def test_infeasible_reject_policy_rejects_only_late_jobs() -> None:
    # Jobs 0-1 have 5 ms (below the fastest 12 ms): rejected. Jobs 2-3 have 50 ms: dispatched.
    s = one_stage({1: 12.0, 2: 14.0, 4: 18.0}, infeasible_policy="reject")
    jobs = jobs_for(Q1, 2, 5.0) + tuple(
        replace(j, job_id=f"late-ok{i}", deadline_ms=50.0, e2e_deadline_ms=50.0)
        for i, j in enumerate(jobs_for(Q1, 2, 50.0))
    )
    res = s.decide(snap(WF1, [QueueState(Q1, jobs)]), 0.0)
    assert [r.job_ids for r in res.rejects] == [("m-j0", "m-j1")]
    assert [d.job_ids for d in res.dispatches] == [("late-ok0", "late-ok1")]


def test_warm_worker_beats_cold_start() -> None:
    # Cold start 100 ms. A warm idle worker for (m, 1 vCPU) exists: no cold start is added, and
    # the batch goes to it (rule 1: warm on the inputs' node, since job inputs sit on node0).
    s = one_stage({1: 12.0, 2: 14.0, 4: 18.0}, cold_ms=100.0)
    warm = Worker("w0", "node0", None, "cpu", 1, 0.0, "m", busy=False, idle_since_ms=0.0)
    cluster = ClusterSnapshot([Node("node0", 4)], [], [warm])
    jobs = tuple(replace(j, input_node="node0") for j in jobs_for(Q1, 4, 60.0))
    res = s.decide(snap(WF1, [QueueState(Q1, jobs)], cluster), 0.0)
    d = res.dispatches[0]
    assert (d.placement.worker_id, d.placement.rule, d.predicted_ms) == ("w0", 1, 18.0)
    # Without the warm worker, a cold start (100 + L) cannot meet the 60 ms slack: at risk, and
    # best effort sends the whole queue (batch 4) at 100 + 18 = 118 ms.
    res = s.decide(snap(WF1, [QueueState(Q1, jobs)], ClusterSnapshot([Node("node0", 4)])), 0.0)
    assert res.dispatches[0].at_risk and res.dispatches[0].predicted_ms == 118.0


def test_best_effort_waits_for_a_busy_warm_worker_rather_than_evict() -> None:
    # Regression (cold-start storm under overload): no plan meets the 60 ms slack. A worker warm
    # for m is busy; even if it runs the largest batch (18 ms) it then runs ours (18 ms) by 36 ms,
    # sooner than a cold start (100 + 18 = 118 ms). The node's two worker slots are taken (the busy
    # worker and an idle one of another stage): a cold start would evict, so the jobs wait for it.
    s = one_stage({1: 12.0, 2: 14.0, 4: 18.0}, cold_ms=100.0)
    busy = Worker("w0", "node0", None, "cpu", 1, 0.0, "m", busy=True)
    other = Worker("w1", "node0", None, "cpu", 1, 0.0, "x", busy=False, idle_since_ms=0.0)
    full = ClusterSnapshot([Node("node0", 4, max_workers=2)], [], [busy, other])
    res = s.decide(snap(WF1, [QueueState(Q1, jobs_for(Q1, 4, 60.0))], full), 0.0)
    assert res.dispatches == () and len(res.holds) == 1 and "busy warm worker" in res.holds[0].reason
    assert [st.feasible for st in res.stats] == [False]
    # With a free slot, idle-aware ESG still waits (a new worker would then idle); on the busy-time
    # objective the new worker starts without evicting anyone.
    roomy = ClusterSnapshot([Node("node0", 4, max_workers=3)], [], [busy, other])
    res = s.decide(snap(WF1, [QueueState(Q1, jobs_for(Q1, 4, 60.0))], roomy), 0.0)
    assert res.dispatches == () and "busy warm worker" in res.holds[0].reason
    busy_only = one_stage({1: 12.0, 2: 14.0, 4: 18.0}, cold_ms=100.0, idle_aware=False)
    res = busy_only.decide(snap(WF1, [QueueState(Q1, jobs_for(Q1, 4, 60.0))], roomy), 0.0)
    assert [(d.placement.cold, d.placement.evict, d.at_risk) for d in res.dispatches] == [(True, (), True)]
    # On the busy-time objective, a cold start quicker than the busy worker's bound goes even when
    # it evicts (10 + 18 < 36); idle-aware ESG never evicts for late jobs of a stage that has a
    # worker (past capacity such evictions feed each other: tests/test_idle_aware.py).
    quick = one_stage({1: 12.0, 2: 14.0, 4: 18.0}, cold_ms=10.0, idle_aware=False)
    res = quick.decide(snap(WF1, [QueueState(Q1, jobs_for(Q1, 4, 20.0))], full), 0.0)
    assert [(d.placement.evict, d.at_risk, d.predicted_ms) for d in res.dispatches] == [(("w1",), True, 28.0)]
    aware = one_stage({1: 12.0, 2: 14.0, 4: 18.0}, cold_ms=10.0)
    res = aware.decide(snap(WF1, [QueueState(Q1, jobs_for(Q1, 4, 20.0))], full), 0.0)
    assert res.dispatches == () and "busy warm worker" in res.holds[0].reason
    # The knob off (the paper's behaviour): the cold start goes, evicting the idle worker.
    paper = one_stage({1: 12.0, 2: 14.0, 4: 18.0}, cold_ms=100.0, wait_for_busy_warm=False)
    res = paper.decide(snap(WF1, [QueueState(Q1, jobs_for(Q1, 4, 60.0))], full), 0.0)
    assert [(d.placement.evict, d.at_risk, d.predicted_ms) for d in res.dispatches] == [(("w1",), True, 118.0)]


def test_no_capacity_holds_the_queue() -> None:
    # The only node's 1 vCPU is held by a busy worker: nothing can be placed, jobs stay queued.
    s = one_stage({1: 12.0})
    busy = Worker("w0", "node0", None, "cpu", 1, 0.0, "other", busy=True)
    cluster = ClusterSnapshot([Node("node0", 1)], [], [busy])
    res = s.decide(snap(WF1, [QueueState(Q1, jobs_for(Q1, 1, 100.0))], cluster), 0.0)
    assert res.dispatches == () and "no capacity" in res.holds[0].reason


def test_missing_profile_rejects_with_the_stage_named() -> None:
    s = one_stage({1: 12.0})
    wf = Workflow.chain("w2", ["unknown"], 100)
    q = QueueKey("w2", "unknown")
    res = s.decide(Snapshot((QueueState(q, jobs_for(q, 2, 50.0)),), cpu_cluster(1, 2), {"w2": wf}), 0.0)
    assert len(res.rejects) == 1 and "'unknown'" in res.rejects[0].reason and len(res.rejects[0].job_ids) == 2


def test_queues_are_served_by_earliest_deadline() -> None:
    # Two workflows share the only vCPU: the queue with the earlier deadline gets it.
    s = one_stage({1: 12.0})
    wf_a, wf_b = Workflow.chain("a", ["m"], 100), Workflow.chain("b", ["m"], 100)
    qa, qb = QueueKey("a", "m"), QueueKey("b", "m")
    ja = tuple(dataclasses.replace(j, job_id=f"a-{j.job_id}") for j in jobs_for(qa, 1, 80.0))
    snapshot = Snapshot(
        (QueueState(qa, ja), QueueState(qb, jobs_for(qb, 1, 30.0))),
        cpu_cluster(1, 1),
        {"a": wf_a, "b": wf_b},
    )
    res = s.decide(snapshot, 0.0)
    assert [d.queue for d in res.dispatches] == [qb] and [h.queue for h in res.holds] == [qa]


def test_registry() -> None:
    assert {"esg", "esg-unpruned"} <= set(scheduler_names())
    prof = LatencyProfile([ProfilePoint("m", "cpu", 1, 1, 0.0, 1.0)])
    assert create_scheduler("esg", prof, PriceSheet(0.0, {})).name == "esg"
    with pytest.raises(UnknownSchedulerError, match="'nope'"):
        create_scheduler("nope", prof, PriceSheet(0.0, {}))


# ---- pre-warm starts (ESGSettings.prewarm) ----------------------------------------------------

PW_SPACE = ConfigSpace((1,), (1, 4), (0.0,))


def prewarm_sched(**settings: object) -> ESGScheduler:
    """Stage m on the CPU: 20 ms on 1 vCPU, 8 ms on 4 vCPUs; a cold start takes 100 ms.

    Per job, 1 vCPU costs 1e-3 * 20 / 1000 = 2.0e-5 and 4 vCPUs 4e-3 * 8 / 1000 = 3.2e-5.
    """
    prof = LatencyProfile(
        [ProfilePoint("m", "cpu", 1, 1, 0.0, 20.0), ProfilePoint("m", "cpu", 1, 4, 0.0, 8.0)], {("m", "cpu"): 100.0}
    )
    return ESGScheduler(prof, PriceSheet(CPU_PRICE, {}), ESGSettings(config_space=PW_SPACE, **settings))  # type: ignore[arg-type]


def big_warm() -> Worker:
    return Worker("w0", "node0", None, "cpu", 4, 0.0, "m", busy=False, idle_since_ms=0.0)


def test_prewarm_starts_the_cheaper_worker_off_the_requests_path() -> None:
    # Slack 60 ms: a cold start (100 ms) never fits, so the job goes to the warm 4-vCPU worker
    # (8 ms, 3.2e-5 per job). Warm, 1 vCPU would run it in 20 ms for 2.0e-5 (37.5 % less, over
    # the 20 % threshold): ESG starts one, with no job on it, on the free vCPUs.
    cluster = ClusterSnapshot([Node("node0", 8)], [], [big_warm()])
    res = prewarm_sched().decide(snap(WF1, [QueueState(Q1, jobs_for(Q1, 1, 60.0))], cluster), 0.0)
    assert [(d.placement.worker_id, d.config.vcpus, d.at_risk) for d in res.dispatches] == [("w0", 4, False)]
    assert [(s.queue, s.config, s.hardware, s.placement.cold, s.placement.evict) for s in res.starts] == [
        (Q1, Config(1, 1, 0.0), "cpu", True, ())
    ]
    assert "pre-warm" in res.starts[0].reason and "2e-05" in res.starts[0].reason


def test_prewarm_holds_back_when_it_would_not_pay_or_not_fit() -> None:
    jobs = [QueueState(Q1, jobs_for(Q1, 1, 60.0))]
    roomy = ClusterSnapshot([Node("node0", 8)], [], [big_warm()])
    # The knob off (the paper's ESG): no start.
    assert prewarm_sched(prewarm=False).decide(snap(WF1, jobs, roomy), 0.0).starts == ()
    # A saving of 37.5 % does not reach a 50 % threshold.
    assert prewarm_sched(prewarm_saving=0.5).decide(snap(WF1, jobs, roomy), 0.0).starts == ()
    # Slack 15 ms: the 4-vCPU worker (8 ms) fits, 1 vCPU (20 ms) would not even warm.
    tight = [QueueState(Q1, jobs_for(Q1, 1, 15.0))]
    res = prewarm_sched().decide(snap(WF1, tight, roomy), 0.0)
    assert len(res.dispatches) == 1 and res.starts == ()
    # A worker of the stage is already starting: one start at a time.
    starting = Worker("w9", "node0", None, "cpu", 1, 0.0, "m", busy=True, starting=True)
    cluster = ClusterSnapshot([Node("node0", 8)], [], [big_warm(), starting])
    assert prewarm_sched().decide(snap(WF1, jobs, cluster), 0.0).starts == ()
    # No free slot without stopping an idle worker of another stage: no start (it would evict).
    other = Worker("w1", "node0", None, "cpu", 1, 0.0, "x", busy=False, idle_since_ms=0.0)
    full = ClusterSnapshot([Node("node0", 8, max_workers=2)], [], [big_warm(), other])
    res = prewarm_sched().decide(snap(WF1, jobs, full), 0.0)
    assert len(res.dispatches) == 1 and res.starts == ()


def test_prewarm_is_not_needed_once_the_cheap_worker_is_warm() -> None:
    # With an idle 1-vCPU worker the search itself picks it (cheaper, fits): no start.
    small = Worker("w2", "node0", None, "cpu", 1, 0.0, "m", busy=False, idle_since_ms=0.0)
    cluster = ClusterSnapshot([Node("node0", 8)], [], [big_warm(), small])
    res = prewarm_sched().decide(snap(WF1, [QueueState(Q1, jobs_for(Q1, 1, 60.0))], cluster), 0.0)
    assert [d.placement.worker_id for d in res.dispatches] == ["w2"] and res.starts == ()


def test_a_fresh_prewarmed_worker_takes_the_queue_though_it_has_idled() -> None:
    # The 1-vCPU worker went idle at -5000 ms (its load began then). Priced by that idle gap, a use
    # of it costs more than one of the 4-vCPU worker, idle since -1 ms: the pre-warm would idle out
    # unused. Fresh (warm from a pre-warm start, no batch yet), its idle is the start's cost,
    # already decided: the search takes it (20 ms on 1 vCPU, against 8 ms on 4).
    def pick(fresh: bool) -> str | None:
        small = Worker("w2", "node0", None, "cpu", 1, 0.0, "m", idle_since_ms=-5000.0, fresh=fresh)
        big = Worker("w0", "node0", None, "cpu", 4, 0.0, "m", idle_since_ms=-1.0)
        cluster = ClusterSnapshot([Node("node0", 8)], [], [big, small])
        res = prewarm_sched().decide(snap(WF1, [QueueState(Q1, jobs_for(Q1, 1, 60.0))], cluster), 0.0)
        return res.dispatches[0].placement.worker_id

    assert pick(fresh=False) == "w0"
    assert pick(fresh=True) == "w2"


def test_start_must_place_a_new_worker() -> None:
    from esg_prefect.exceptions import InvalidInputError
    from esg_prefect.scheduling import Placement, Start

    with pytest.raises(InvalidInputError, match="'w0'"):
        Start(Q1, Config(1, 1, 0.0), "cpu", Placement("node0", None, "w0", 2))
