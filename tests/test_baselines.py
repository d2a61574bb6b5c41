"""Baselines: registration, hand-worked decisions of each, and a run of each on a small case."""

from __future__ import annotations

from dataclasses import replace

import pytest

from esg_prefect.model import (
    ClusterSnapshot,
    Device,
    Job,
    LatencyProfile,
    Node,
    PriceSheet,
    ProfilePoint,
    QueueKey,
    Worker,
    Workflow,
)
from esg_prefect.model.config import Config, ConfigSpace
from esg_prefect.scheduling import QueueState, Snapshot, create_scheduler, scheduler_names
from esg_prefect.scheduling.baselines import (
    ABLATIONS,
    BASELINES,
    FaSTGShareScheduler,
    GreedyESGScheduler,
    INFlessScheduler,
    LlamaScheduler,
    PerInvocationScheduler,
    TritonScheduler,
    even_split_deadline_ms,
    no_share_settings,
    stage_budget_ms,
)
from esg_prefect.scheduling.dispatch import ClusterView
from esg_prefect.scheduling.settings import ESGSettings
from esg_prefect.simulator import run_case, simulate, standard_case, tiny_case
from esg_prefect.simulator.run import SimRun

# Stage m on a T4: whole GPU L(b) = 12, 14, 18, 26 ms for b = 1, 2, 4, 8; half a GPU 14, 18, 30, 50 ms.
# A whole T4 costs 1 per second, vCPUs nothing: cost per request = share * L / 1000 / b.
LAT = {1.0: {1: 12.0, 2: 14.0, 4: 18.0, 8: 26.0}, 0.5: {1: 14.0, 2: 18.0, 4: 30.0, 8: 50.0}}
PROFILE = LatencyProfile(
    [ProfilePoint("m", "T4", b, 1, s, lat) for s, row in LAT.items() for b, lat in row.items()], {("m", "T4"): 100.0}
)
PRICES = PriceSheet(0.0, {"T4": 1.0})
SETTINGS = ESGSettings(config_space=ConfigSpace((1, 2, 4, 8), (1,), (0.5, 1.0)))
WF = Workflow.chain("w", ["m"], slo_ms=40.0)
Q = QueueKey("w", "m")


def jobs(n: int, ready: float = 0.0, deadline: float = 40.0) -> tuple[Job, ...]:
    return tuple(Job(f"j{i}", f"r{i}", f"r{i}", Q, ready + i, ready + i, deadline, deadline) for i in range(n))


def snapshot(queue: tuple[Job, ...], rate: float = 0.0, workers: tuple[Worker, ...] = (), gpus: int = 1) -> Snapshot:
    cluster = ClusterSnapshot([Node("n0", 8)], [Device(f"n0/g{i}", "n0", "T4") for i in range(gpus)], workers)
    return Snapshot((QueueState(Q, queue, rate),), cluster, {"w": WF})


WARM_WHOLE = Worker("w0", "n0", "n0/g0", "T4", 1, 1.0, "m", busy=False, idle_since_ms=0.0)


def test_every_baseline_is_registered() -> None:
    assert set(BASELINES) | set(ABLATIONS) <= set(scheduler_names())
    for name in (*BASELINES, "esg-noshare", "esg-greedy", "esg-fastest"):  # esg-unpruned is the core's ESGScheduler
        sched = create_scheduler(name, PROFILE, PRICES, SETTINGS)
        assert sched.name == name


def test_even_split() -> None:
    # a -> {b -> e, c} -> d: depths a 1, b 2, c 2, e 3, d 4; K = 4
    wf = Workflow("f", ["a", "b", "c", "e", "d"], [("a", "b"), ("a", "c"), ("b", "e"), ("e", "d"), ("c", "d")], 100.0)
    assert [even_split_deadline_ms(wf, s, 10.0) for s in ("a", "c", "e", "d")] == [35.0, 60.0, 85.0, 110.0]
    assert stage_budget_ms(wf) == 25.0


def test_per_invocation_sends_the_oldest_job_alone_on_a_whole_gpu() -> None:
    s = PerInvocationScheduler(PROFILE, PRICES, SETTINGS)
    res = s.decide(snapshot(jobs(3)), now_ms=5.0)
    assert [(d.job_ids, d.config, d.predicted_ms, d.placement.cold) for d in res.dispatches] == [
        (("j0",), Config(1, 1, 1.0), 112.0, True)
    ]
    assert [h.queue for h in res.holds] == [Q]
    # a warm whole-GPU worker: no cold start
    res = s.decide(snapshot(jobs(1), workers=(WARM_WHOLE,)), now_ms=5.0)
    assert [(d.placement.worker_id, d.predicted_ms) for d in res.dispatches] == [("w0", 12.0)]


def test_one_worker_starts_at_a_time_per_stage() -> None:
    s = PerInvocationScheduler(PROFILE, PRICES, SETTINGS)
    res = s.decide(snapshot(jobs(2), gpus=2), now_ms=0.0)
    assert len(res.dispatches) == 1  # the second job waits: a worker of m is starting (100 ms)
    res = s.decide(snapshot(jobs(1), gpus=2), now_ms=50.0)
    assert res.dispatches == ()
    res = s.decide(snapshot(jobs(1), gpus=2), now_ms=100.0)
    assert len(res.dispatches) == 1


def test_triton_batches_until_full_or_the_delay() -> None:
    s = TritonScheduler(PROFILE, PRICES, SETTINGS)
    res = s.decide(snapshot(jobs(3)), now_ms=5.0)  # oldest waited 5 ms < 10 ms, 3 < 8
    assert res.dispatches == () and "batching: 3 of 8" in res.holds[0].reason
    res = s.decide(snapshot(jobs(3)), now_ms=10.0)
    # batch of 3 on a whole GPU: L(3) = 14 + (18 - 14) / 2 = 16 ms, plus the 100 ms cold start
    assert [(len(d.job_ids), d.config, d.predicted_ms) for d in res.dispatches] == [(3, Config(3, 1, 1.0), 116.0)]
    s2 = TritonScheduler(PROFILE, PRICES, SETTINGS)
    res = s2.decide(snapshot(jobs(9), workers=(WARM_WHOLE,)), now_ms=0.0)
    assert [(len(d.job_ids), d.placement.worker_id) for d in res.dispatches] == [(8, "w0")]
    assert len(res.holds) == 1  # the ninth job waits for a fuller batch


def test_infless_chooses_by_budget_and_rate() -> None:
    s = INFlessScheduler(PROFILE, PRICES, SETTINGS)
    view = ClusterView(snapshot(()).cluster)
    # 1000/s: half a GPU at batch 8 (cheapest) takes 50 + 7 ms to fill > 40; a whole GPU at 8: 26 + 7 = 33
    assert s.choose("m", 40.0, 1000.0, view) == (("T4", 1, 1.0), 8, 26.0)
    # rate unknown: no batching; the cheapest single job within 40 ms is half a GPU (14 ms)
    assert s.choose("m", 40.0, 0.0, view) == (("T4", 1, 0.5), 1, 14.0)
    # nothing fits 5 ms: the fastest single job
    assert s.choose("m", 5.0, 0.0, view) == (("T4", 1, 1.0), 1, 12.0)


def test_infless_dispatches_full_or_timed_out_batches() -> None:
    s = INFlessScheduler(PROFILE, PRICES, SETTINGS)
    # rate 1000/s -> batch 8 on a whole GPU (26 ms); timeout = 40 - 26 = 14 ms after the oldest job
    res = s.decide(snapshot(jobs(3), rate=1000.0), now_ms=10.0)
    assert res.dispatches == () and "batching to 8" in res.holds[0].reason
    res = s.decide(snapshot(jobs(3), rate=1000.0), now_ms=14.0)
    assert [(len(d.job_ids), d.config.gpu_share) for d in res.dispatches] == [(3, 1.0)]


def test_fast_gshare_takes_the_cheapest_share_within_the_budget() -> None:
    s = FaSTGShareScheduler(PROFILE, PRICES, SETTINGS)
    view = ClusterView(snapshot(()).cluster)
    assert s.choose("m", 20.0, view) == (("T4", 1, 0.5), 14.0)
    assert s.choose("m", 13.0, view) == (("T4", 1, 1.0), 12.0)
    res = s.decide(snapshot(jobs(2)), now_ms=0.0)
    assert [(d.config.batch, d.config.gpu_share) for d in res.dispatches] == [(1, 0.5)]  # one starting at a time


def test_llama_meets_the_target_on_whole_devices() -> None:
    s = LlamaScheduler(PROFILE, PRICES, SETTINGS)
    assert s.stage_share(WF, "m", frozenset({"cpu", "T4"})) == 1.0
    # cold only: 100 ms + L exceeds the 40 ms target: the largest batch on the fastest option, at risk
    res = s.decide(snapshot(jobs(4)), now_ms=0.0)
    assert [(len(d.job_ids), d.config.gpu_share, d.at_risk, d.predicted_ms) for d in res.dispatches] == [
        (4, 1.0, True, 118.0)
    ]
    # warm whole GPU: batch 4 (18 ms, 0.0045 per request) is the cheapest within the target
    res = LlamaScheduler(PROFILE, PRICES, SETTINGS).decide(snapshot(jobs(4), workers=(WARM_WHOLE,)), now_ms=0.0)
    assert [(len(d.job_ids), d.placement.worker_id, d.at_risk) for d in res.dispatches] == [(4, "w0", False)]


def test_ablations() -> None:
    assert no_share_settings(SETTINGS).config_space.gpu_shares == (1.0,)
    assert no_share_settings(ESGSettings()).config_space.gpu_shares == (0.0, 1.0)
    noshare = create_scheduler("esg-noshare", PROFILE, PRICES, SETTINGS)
    res = noshare.decide(snapshot(jobs(1, deadline=500.0)), now_ms=0.0)
    assert [d.config.gpu_share for d in res.dispatches] == [1.0]
    greedy = GreedyESGScheduler(PROFILE, PRICES, SETTINGS)
    wf2 = Workflow.chain("w2", ["m", "m2"], 100.0)
    assert greedy.tables.horizon(wf2, "m", frozenset({"T4"})) == ("m",)
    # a job whose (dominator) deadline is already past, but whose even-split deadline (40) is not:
    # the greedy ablation judges it by the even split and finds a feasible plan.
    late = tuple(Job(f"j{i}", f"r{i}", f"r{i}", Q, 0.0, 0.0, 1.0, 40.0) for i in range(2))
    res = greedy.decide(snapshot(late, workers=(WARM_WHOLE,)), now_ms=0.0)
    assert res.dispatches and not res.dispatches[0].at_risk
    assert all(st.feasible for st in res.stats)


@pytest.mark.slow
def test_default_best_effort_avoids_the_cold_start_storm_past_capacity() -> None:
    """At twice the standard load (6 s, seed 0) the spec's best effort (``esg-fastest``) starts
    thousands of workers, each on the fastest GPU share and stopping idle ones, and misses most SLOs;
    ESG's default (the cheapest option within 10 % of the fastest) keeps its SLOs with fewer.
    Measured when the default changed: ESG 96.6 % with 714 workers, esg-fastest 19.3 % with 2,040
    (10 s: 99.3 % with 285 against 44.3 % with 2,681). Short, to keep the suite's load down."""

    def run(name: str) -> SimRun:
        case = standard_case(name, rate_per_s=600.0, duration_s=6.0, warmup_s=2.0, seed=0)
        if name == "esg-fastest":  # the spec's rule alone: busy-time objective, no waiting for a warm worker
            case = replace(case, settings=replace(case.settings, idle_aware=False, wait_for_busy_warm=False))
        return simulate(case)

    runs = {name: run(name) for name in ("esg", "esg-fastest")}
    esg, fastest = runs["esg"], runs["esg-fastest"]
    assert esg.report.overall.slo_hit_rate >= 0.9
    assert esg.cold_starts < 1000
    assert fastest.report.overall.slo_hit_rate <= 0.6  # the case does make the spec's rule storm
    assert fastest.cold_starts > 2 * esg.cold_starts


@pytest.mark.parametrize("name", scheduler_names())  # every registered one: a new scheduler is tested here too
def test_each_scheduler_serves_a_light_load(name: str) -> None:
    rep = run_case(tiny_case(name).with_(duration_s=3.0), seed=0)
    assert rep.overall.count > 50
    assert rep.overall.failed == 0
    assert rep.overall.batches > 0 and rep.overall.cost_total > 0


def test_per_invocation_merge_is_fifo_and_drops_blocked_stages() -> None:
    """The lazy merge of per-queue FIFO orders is the global FIFO order, minus blocked stages."""
    import random

    from esg_prefect.scheduling.baselines.common import fifo
    from esg_prefect.scheduling.baselines.simple import _merge_unblocked, fifo_iter

    rng = random.Random(3)
    keys = [QueueKey("w", s) for s in ("a", "b", "c")]
    queues = [
        [Job(f"{k.stage}{i}", f"r{i}", f"r{i}", k, 0.0, float(rng.randint(0, 20)), 50.0, 50.0) for i in range(15)]
        for k in keys
    ]
    everything = fifo(j for q in queues for j in q)
    assert list(_merge_unblocked([fifo_iter(tuple(q)) for q in queues], set())) == everything
    blocked: set[str] = set()
    seen = []
    for job in _merge_unblocked([fifo_iter(tuple(q)) for q in queues], blocked):
        seen.append(job)
        if len(seen) == 10:
            blocked.add("b")  # from now on no job of stage b comes out
    assert seen == everything[:10] + [j for j in everything[10:] if j.queue.stage != "b"]


def test_fifo_iter_equals_fifo_in_ready_order_or_not() -> None:
    import random

    from esg_prefect.scheduling.baselines.common import fifo
    from esg_prefect.scheduling.baselines.simple import fifo_iter

    rng = random.Random(8)
    for _ in range(200):
        jobs = [
            Job(f"j{rng.randint(0, 999)}-{i}", "r", "r", Q, 0.0, float(rng.randint(0, 6)), 9.0, 9.0) for i in range(12)
        ]
        in_ready_order = sorted(jobs, key=lambda j: j.ready_ms)  # ties in arbitrary id order, as queues hold them
        for given in (jobs, in_ready_order):
            assert list(fifo_iter(tuple(given))) == fifo(given)
