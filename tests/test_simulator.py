"""The simulator: event loop, a hand-worked run, determinism, cases, and the simulator half of conformance."""

from __future__ import annotations

import gc
import json
import math
import random
import re
from dataclasses import replace

import pytest

import esg_prefect.scheduling  # noqa: F401 - registers the baselines
from esg_prefect.control.core import Core
from esg_prefect.exceptions import ConfigError, InvalidInputError, WorkflowError
from esg_prefect.model.attribution import attribute_costs
from esg_prefect.model.config import ConfigSpace
from esg_prefect.model.jobs import Job
from esg_prefect.model.pricing import PriceSheet
from esg_prefect.model.profile import LatencyProfile, ProfilePoint
from esg_prefect.model.workflow import Workflow
from esg_prefect.scheduling.settings import ESGSettings
from esg_prefect.simulator import Case, ClusterSpec, NodeSpec, SimSpec, WorkloadSpec, run_case, simulate, tiny_case
from esg_prefect.simulator.cluster import lognormal_params
from esg_prefect.simulator.engine import EventLoop

# ---- the event loop ------------------------------------------------------------------------


def test_event_loop_orders_by_time_then_kind_then_insertion() -> None:
    loop = EventLoop()
    seen: list[object] = []
    loop.at(5.0, 2, "late kind")
    loop.at(5.0, 0, "first")
    loop.at(5.0, 0, "second")
    loop.at(1.0, 9, "earliest")
    loop.run(lambda k, p: seen.append(p), lambda t: seen.append(("settle", t)))
    assert seen == ["earliest", ("settle", 1.0), "first", "second", "late kind", ("settle", 5.0)]
    assert (loop.now_ms, loop.events, len(loop)) == (5.0, 4, 0)


def test_event_loop_until_and_stop_and_no_past_events() -> None:
    loop = EventLoop()
    for t in (1.0, 2.0, 3.0):
        loop.at(t, 0, t)
    seen: list[object] = []
    loop.run(lambda k, p: seen.append(p), lambda t: None, until_ms=2.0)
    assert seen == [1.0, 2.0] and loop.next_time() == 3.0
    with pytest.raises(InvalidInputError, match="before the simulated now"):
        loop.at(1.5, 0)
    loop.stop()
    assert len(loop) == 0


def test_lognormal_params_match_mean_and_p95() -> None:
    mu, sigma = lognormal_params(20.0, 26.0) or (0.0, 0.0)
    assert math.exp(mu + sigma**2 / 2) == pytest.approx(20.0)
    assert math.exp(mu + 1.6448536269514722 * sigma) == pytest.approx(26.0)
    assert lognormal_params(20.0, None) is None and lognormal_params(20.0, 19.0) is None
    rng = random.Random(0)
    draws = [math.exp(mu + sigma * rng.gauss(0, 1)) for _ in range(20000)]
    assert sum(draws) / len(draws) == pytest.approx(20.0, rel=0.01)


# ---- a hand-worked run -----------------------------------------------------------------------

CPU_PROFILE = LatencyProfile(
    [ProfilePoint("a", "cpu", 1, 1, 0.0, 10.0), ProfilePoint("b", "cpu", 1, 1, 0.0, 20.0)],
    {("a", "cpu"): 5.0, ("b", "cpu"): 5.0},
)
CHAIN = Workflow.chain("w", ["a", "b"], slo_ms=50.0)


def cpu_case(
    scheduler: str = "per-invocation", nodes: tuple[NodeSpec, ...] = (NodeSpec("n0", 4),), **settings: object
) -> Case:
    return Case(
        name="hand",
        workflows=(CHAIN,),
        profile=CPU_PROFILE,
        prices=PriceSheet(0.001, {}),
        cluster=ClusterSpec(nodes),
        workload=WorkloadSpec("poisson", 1.0),
        duration_s=1.0,
        scheduler=scheduler,
        settings=ESGSettings(config_space=ConfigSpace((1,), (1,), (0.0,)), **settings),  # type: ignore[arg-type]
        sim=SimSpec(service_time="mean", interference_per_corunner=0.0, round_interval_ms=0.0),
    )


def test_hand_worked_run_per_invocation() -> None:
    # r1 at 0: a cold on w1 (5 + 10, ends 15), b cold on w2 (5 + 20, ends 40): latency 40.
    # r2 at 100: a warm on w1 (ends 110), b warm on w2 (ends 130): latency 30.
    run = simulate(cpu_case(), arrivals=[(0.0, "w"), (100.0, "w")])
    assert [(r.request_id, r.arrival_ms, r.finish_ms, r.slo_met) for r in run.requests] == [
        ("r1", 0.0, 40.0, True),
        ("r2", 100.0, 130.0, True),
    ]
    assert [(s.job_id, s.worker_id, s.ready_ms, s.start_ms, s.end_ms, s.cold_start_ms) for s in run.stages] == [
        ("r1:a", "w1", 0.0, 0.0, 15.0, 5.0),
        ("r1:b", "w2", 15.0, 15.0, 40.0, 5.0),
        ("r2:a", "w1", 100.0, 100.0, 110.0, 0.0),
        ("r2:b", "w2", 110.0, 110.0, 130.0, 0.0),
    ]
    # idle: w1 15-100 and 110-130 (the run ends at 130), w2 40-110
    assert sorted((i.worker_id, i.start_ms, i.end_ms) for i in run.idles) == [
        ("w1", 15.0, 100.0),
        ("w1", 110.0, 130.0),
        ("w2", 40.0, 110.0),
    ]
    assert all(i.loading_ms == 0.0 for i in run.idles)  # no pre-warm start: no load in an idle interval
    rep = run.report
    # 1 vCPU at 0.001/s: batches 15 + 25 + 10 + 20 ms = 7e-5. The idle 85 + 20 + 70 ms is free: an idle
    # worker holds no vCPU, and these CPU workers hold no GPU share.
    assert rep.busy_cost == pytest.approx(7e-5) and rep.idle_cost == 0.0
    assert rep.overall.cost_total == pytest.approx(7e-5)
    assert (rep.overall.slo_hit_rate, rep.overall.latency_p50_ms, rep.overall.mean_batch_size) == (1.0, 35.0, 1.0)
    assert (run.rounds, run.cold_starts, run.end_ms) == (4, 2, 130.0)


def test_an_orchestrators_overheads_delay_the_calls_not_the_slo_clock() -> None:
    # As the hand-worked run above, with Prefect's overheads: r1's a reaches the pool 300 + 50 ms after
    # r1 arrives (cold: ends 365), its b 50 ms after a ended (cold: 415 + 25 = 440); latency 440, over
    # the 50 ms SLO, counted from the arrival at 0 as the live pool counts it.
    case = cpu_case().with_(sim=replace(cpu_case().sim, run_overhead_ms=300.0, call_overhead_ms=50.0))
    run = simulate(case, arrivals=[(0.0, "w")])
    assert [(r.arrival_ms, r.finish_ms, r.slo_met) for r in run.requests] == [(0.0, 440.0, False)]
    assert [(s.job_id, s.ready_ms, s.end_ms) for s in run.stages] == [("r1:a", 350.0, 365.0), ("r1:b", 415.0, 440.0)]
    written = case.with_(profile="examples_cpu").to_dict()  # the knobs travel in case files
    assert written["sim"]["run_overhead_ms"] == 300.0 and written["sim"]["call_overhead_ms"] == 50.0
    assert Case.from_dict(written).sim == case.sim
    with pytest.raises(ConfigError, match="call_overhead_ms"):
        SimSpec(call_overhead_ms=-1.0)


def test_a_run_overhead_counts_against_the_first_calls_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    # r1 arrives at 0; Prefect's run overhead brings its first call (a) to the core at 30 ms. Live, the pool gets
    # the flow run's creation as the arrival, so the 50 ms SLO ends at 50, not 80: 20 ms are left for a (5 + 10
    # cold) and b (5 + 20 cold), no plan fits and ESG runs it at risk. Without the overhead the same request is
    # planned within its SLO.
    jobs: list[Job] = []
    arrive = Core.arrive
    monkeypatch.setattr(Core, "arrive", lambda self, ev: jobs.append(arrive(self, ev)) or jobs[-1])
    case = cpu_case("esg")
    run = simulate(case.with_(sim=replace(case.sim, run_overhead_ms=30.0)), arrivals=[(0.0, "w")])
    a = jobs[0]
    assert (a.job_id, a.arrival_ms, a.ready_ms, a.e2e_deadline_ms) == ("r1:a", 0.0, 30.0, 50.0)
    assert a.deadline_ms < 50.0
    assert [(r.arrival_ms, r.at_risk) for r in run.requests] == [(0.0, True)]
    jobs.clear()
    run = simulate(case, arrivals=[(0.0, "w")])
    assert (jobs[0].ready_ms, jobs[0].e2e_deadline_ms) == (0.0, 50.0)
    assert [(r.at_risk, r.slo_met) for r in run.requests] == [(False, True)]


def test_inputs_on_another_node_pay_a_transfer() -> None:
    # One worker slot per node and no eviction: a's idle worker holds n0's slot, so b starts on n1
    # and fetches its input from n0: 0.5 ms + 150 KB over 10 Gb/s.
    nodes = (NodeSpec("n0", 4, max_workers=1), NodeSpec("n1", 4, max_workers=1))
    case = cpu_case(nodes=nodes, allow_eviction=False)
    run = simulate(case, arrivals=[(0.0, "w")])
    b = run.stages[1]
    assert b.transfer_ms == pytest.approx(0.5 + 150 * 8.192 / 10_000.0)
    assert b.end_ms == pytest.approx(15.0 + 5.0 + b.transfer_ms + 20.0)


def test_unfinished_requests_fail_after_the_drain() -> None:
    # Stage b needs 2 vCPUs of a 1-vCPU node: never placeable; the run still ends.
    prof = LatencyProfile(
        [ProfilePoint("a", "cpu", 1, 1, 0.0, 10.0), ProfilePoint("b", "cpu", 1, 2, 0.0, 20.0)],
        {("a", "cpu"): 5.0, ("b", "cpu"): 5.0},
    )
    case = cpu_case(nodes=(NodeSpec("n0", 1),)).with_(
        profile=prof, settings=ESGSettings(config_space=ConfigSpace((1,), (1, 2), (0.0,))), sim=SimSpec(drain_s=1.0)
    )
    run = simulate(case, arrivals=[(0.0, "w")])
    assert [(r.request_id, r.finish_ms) for r in run.requests] == [("r1", None)]
    assert run.report.overall.failed == 1 and run.report.overall.slo_hit_rate == 0.0


@pytest.mark.parametrize("scheduler", ["esg", "fast-gshare", "triton"])
def test_shedding_bounds_every_dispatch_and_loses_no_request(scheduler: str) -> None:
    # 600 requests/s on two T4s, four times what they serve: without shedding calls wait seconds.
    case = tiny_case(scheduler).with_(duration_s=2.0, workload=WorkloadSpec("poisson", 600.0), seed=1)
    slo = case.workflows[0].slo_ms
    runs = {k: simulate(case.with_(settings=replace(case.settings, shed_after_slo=k))) for k in (0.0, 2.0)}
    for k, run in runs.items():
        arrived = {r.request_id: r.arrival_ms for r in run.requests}
        dispatched = {b.batch_id: b.start_ms for b in run.batches}
        waited = max(dispatched[s.batch_id] - arrived[s.request_id] for s in run.stages)
        done = [r for r in run.requests if r.completed]
        assert len(run.requests) == len(case.arrivals()) == len(done) + run.report.overall.failed
        assert len({r.request_id for r in run.requests}) == len(run.requests)
        if k:  # no call goes out later than k x SLO after its request arrived; the others failed
            assert waited <= k * slo and run.report.overall.failed > len(run.requests) / 4
        else:
            assert waited > 4 * slo and run.report.overall.failed == 0
    assert runs[2.0].end_ms < runs[0.0].end_ms


def test_a_stage_without_profile_on_the_cluster_is_named() -> None:
    wf = Workflow.chain("x", ["a", "zzz"], 100.0)
    with pytest.raises(WorkflowError, match="'zzz' has no latency profile"):
        simulate(cpu_case().with_(workflows=(wf,)), arrivals=[(0.0, "x")])
    with pytest.raises(InvalidInputError, match="unknown workflow 'q'"):
        simulate(cpu_case(), arrivals=[(0.0, "q")])


# ---- real cases: determinism and invariants ------------------------------------------------------


@pytest.mark.parametrize("scheduler", ["esg", "fast-gshare"])
def test_same_case_and_seed_same_report(scheduler: str) -> None:
    case = tiny_case(scheduler).with_(duration_s=3.0)
    a, b = run_case(case, seed=3), run_case(case, seed=3)
    assert json.dumps(a.to_dict(), sort_keys=True) == json.dumps(b.to_dict(), sort_keys=True)
    assert run_case(case, seed=4).to_dict() != a.to_dict()


def test_esg_tiny_case_invariants() -> None:
    run = simulate(tiny_case().with_(duration_s=4.0), seed=1)
    done = [r for r in run.requests if r.completed]
    assert len(run.requests) == len(tiny_case().with_(duration_s=4.0).arrivals(1))
    assert len(done) == len(run.requests)  # light load: everything finishes
    # every completed request ran both stages; every job ran in exactly one batch of its size
    by_req: dict[str, set[str]] = {}
    for s in run.stages:
        by_req.setdefault(s.request_id, set()).add(s.stage)
    assert all(by_req[r.request_id] == {"resnet50", "resnext101"} for r in done)
    items = sum(len(b.items) for b in run.batches)
    assert items == len(run.stages)
    sizes = {b.batch_id: len(b.items) for b in run.batches}
    assert all(sizes[s.batch_id] == s.batch_size for s in run.stages)
    # each request finished when its last stage did
    last = {}
    for s in run.stages:
        last[s.request_id] = max(last.get(s.request_id, 0.0), s.end_ms)
    assert all(r.finish_ms == last[r.request_id] for r in done)
    # billing invariant: the report's total is every batch at its worker's rate and every idle interval
    # at its GPU share's price, plus its vCPUs for a pre-warm load at its start
    prices = PriceSheet.default()
    busy = sum(prices.batch_cost(b.config, b.hardware, b.duration_ms) for b in run.batches)
    idle = sum(
        (
            i.gpu_share * prices.gpu_price_s(i.hardware) * (i.end_ms - i.start_ms)
            + i.vcpus * prices.price_per_vcpu_s * i.loading_ms
        )
        / 1000
        for i in run.idles
    )
    assert any(i.loading_ms > 0 for i in run.idles)  # a pre-warm load is among them
    assert run.report.overall.cost_total == pytest.approx(busy + idle)
    assert len(run.decisions) >= run.rounds > 0


def mixed_case() -> Case:
    """The hand-worked case under ESG, on one node of 4 vCPUs and a T4: 20 requests/s for 3 s.

    Both stages run on 1 or 2 vCPUs alone or on 1 vCPU and half or all of the T4 (a cold start: 50 ms
    on the CPU, 80 on the GPU), so the run has CPU-only workers and GPU ones, and pre-warm loads on both.
    """
    points = [
        ProfilePoint(stage, hw, b, v, share, ms * (1 + 0.3 * (b - 1)) * scale)
        for stage, ms in (("a", 10.0), ("b", 20.0))
        for b in (1, 2, 4)
        for hw, v, share, scale in (
            ("cpu", 1, 0.0, 1.0),
            ("cpu", 2, 0.0, 1 / 1.6),
            ("T4", 1, 0.5, 1.0),
            ("T4", 1, 1.0, 0.5),
        )
    ]
    cold = {("a", "cpu"): 50.0, ("b", "cpu"): 50.0, ("a", "T4"): 80.0, ("b", "T4"): 80.0}
    return cpu_case("esg", nodes=(NodeSpec("n0", 4, ("T4",)),)).with_(
        profile=LatencyProfile(points, cold),
        prices=PriceSheet(1e-3, {"T4": 1e-3}),
        duration_s=3.0,
        workload=WorkloadSpec("poisson", 20.0),
        settings=ESGSettings(config_space=ConfigSpace((1, 2, 4), (1, 2), (0.0, 0.5, 1.0))),
    )


def test_billed_vcpus_never_exceed_the_nodes_and_cpu_idle_is_free_but_its_loads() -> None:
    case = mixed_case()
    run = simulate(case, seed=3)  # a seed with pre-warm loads on both kinds of worker
    assert all(r.finish_ms is not None for r in run.requests) and case.warmup_s == 0.0
    (node,) = case.cluster.nodes  # one node: every record is on it
    loads = [i for i in run.idles if i.loading_ms > 0]
    cpu_idles = [i for i in run.idles if i.gpu_share == 0.0]
    # The case exercises what it checks: pre-warm loads on both kinds of worker, idle CPU-only workers.
    assert {i.hardware for i in loads} == {"cpu", "T4"} and any(i.loading_ms == 0 for i in cpu_idles)
    # Capacity: a batch holds its worker's vCPUs for its whole duration (cold start included), an idle
    # interval only for its pre-warm load; idle workers hold none. Billed vCPU-ms stay within the node's.
    held = [(b.start_ms, b.end_ms, b.config.vcpus) for b in run.batches]
    held += [(i.start_ms, i.start_ms + i.loading_ms, i.vcpus) for i in loads]
    billed_vcpu_ms = sum(v * (end - start) for start, end, v in held)
    assert 0 < billed_vcpu_ms <= node.vcpus * run.end_ms
    # ... and at every instant too (an interval frees its vCPUs before one starting then takes them).
    edges = sorted([(start, v) for start, _, v in held] + [(end, -v) for _, end, v in held])
    in_use = 0
    for _, dv in edges:
        in_use += dv
        assert in_use <= node.vcpus
    # CPU-only workers' idle intervals bill their loads' vCPU time and nothing else; GPU workers'
    # their share all along. The report's idle cost is exactly that.
    p = case.prices
    cpu_loads = sum(i.vcpus * p.price_per_vcpu_s * i.loading_ms for i in cpu_idles) / 1000
    assert cpu_loads > 0
    assert attribute_costs(run.batches, cpu_idles, p).idle_total == pytest.approx(cpu_loads, rel=1e-12)
    gpu_idle = sum(
        (
            i.gpu_share * p.gpu_price_s(i.hardware) * (i.end_ms - i.start_ms)
            + i.vcpus * p.price_per_vcpu_s * i.loading_ms
        )
        / 1000
        for i in run.idles
        if i.gpu_share > 0
    )
    assert gpu_idle > 0
    assert run.report.idle_cost == pytest.approx(gpu_idle + cpu_loads, rel=1e-12)


def test_warmup_leaves_early_requests_out() -> None:
    case = tiny_case("fast-gshare").with_(duration_s=4.0)
    full = simulate(case)
    warm = simulate(case.with_(warmup_s=2.0))
    assert warm.report.overall.count == sum(1 for r in full.requests if r.arrival_ms >= 2000.0)
    assert warm.report.overall.count < full.report.overall.count


# ---- cases ----------------------------------------------------------------------------------------


def test_case_round_trips_through_json() -> None:
    from esg_prefect.simulator import standard_case

    case = standard_case("triton", rate_per_s=120.0, duration_s=30.0, seed=7)
    again = Case.from_dict(json.loads(json.dumps(case.to_dict())))
    assert again == case
    with pytest.raises(ConfigError, match="unknown case keys \\['colour'\\]"):
        Case.from_dict({**case.to_dict(), "colour": "red"})
    data = case.to_dict()
    typos = {  # a typo inside an object was ignored: the workflow ran with its slo_ms, the node without GPUs
        "workflows[0]": {**data, "workflows": [{**data["workflows"][0], "slo": 100}, *data["workflows"][1:]]},
        "cluster[0]": {**data, "cluster": [{**data["cluster"][0], "gpu": ["T4"]}, *data["cluster"][1:]]},
        "workload": {**data, "workload": {**data["workload"], "rate": 3}},
        "sim": {**data, "sim": {**data["sim"], "drain": 1}},
    }
    for where, bad in typos.items():
        with pytest.raises(ConfigError, match=re.escape(f"in the case's {where}; known: ")):
            Case.from_dict(bad)
    with pytest.raises(ConfigError, match="weights must be a list of finite numbers >= 0, one per workflow"):
        Case.from_dict({**data, "workload": {**data["workload"], "weights": {"other": 1.0}}})
    with pytest.raises(ConfigError, match="missing the key 'workload'"):
        Case.from_dict({k: v for k, v in case.to_dict().items() if k != "workload"})
    with pytest.raises(ConfigError, match="in-memory profile"):
        cpu_case().to_dict()


def test_case_validation_names_values() -> None:
    with pytest.raises(ConfigError, match="unique names"):
        cpu_case().with_(workflows=(CHAIN, CHAIN))
    with pytest.raises(ConfigError, match=r"warmup_s 2\.0 must be below duration_s 1\.0"):
        cpu_case().with_(warmup_s=2.0)
    with pytest.raises(ConfigError, match="service_time"):
        SimSpec(service_time="median")  # type: ignore[arg-type]
    base = cpu_case()  # a seed built in Python is checked as one read from JSON is (Case.from_dict)
    with pytest.raises(ConfigError, match=re.escape("the case's 'seed' must be an integer >= 0, got int -1")):
        Case(base.name, base.workflows, base.profile, base.prices, base.cluster, base.workload, 1.0, seed=-1)
    for bad, shown in ((1.5, "float 1.5"), (True, "bool True"), (None, "NoneType None")):
        with pytest.raises(ConfigError, match=re.escape(f"the case's 'seed' must be an integer >= 0, got {shown}")):
            base.with_(seed=bad)
    with pytest.raises(ConfigError, match="neither a shipped profile's name") as err:
        cpu_case().with_(profile="no-such-profile").load_profile()
    assert "nvidia_gpu" in str(err.value) and "_samples" not in str(err.value)  # profiles only, no side tables


def test_batching_headroom_hand_worked() -> None:
    from esg_prefect.simulator.experiments import batching_headroom, workflow_headroom

    # Whole T4: 10 ms at batch 1, 12 ms at batch 4; half a T4: 10 ms at batch 1 (the batch fits), 30 ms at 4.
    prof = LatencyProfile(
        [
            ProfilePoint("m", "T4", 1, 1, 1.0, 10.0),
            ProfilePoint("m", "T4", 4, 1, 1.0, 12.0),
            ProfilePoint("m", "T4", 1, 1, 0.5, 10.0),
            ProfilePoint("m", "T4", 4, 1, 0.5, 30.0),
        ]
    )
    prices = PriceSheet(0.0, {"T4": 1.0})
    rows = batching_headroom(prof, prices, ConfigSpace((1, 4), (1,), (0.5, 1.0)), "mean", stages=("m",))
    # batch 1: cheapest on half a GPU, 0.5 * 10 ms = 5e-3 $; batch 4: 12 ms on the whole GPU / 4 = 3e-3 $.
    assert len(rows) == 1
    r = rows[0]
    assert (r["batch1_share"], r["best_batch"], r["best_share"]) == (0.5, 4, 1.0)
    assert r["batch1_cost"] == pytest.approx(5e-3) and r["best_cost"] == pytest.approx(3e-3)
    assert r["headroom"] == pytest.approx(5 / 3)
    head = workflow_headroom([Workflow.chain("w", ["m"], 100.0)], rows)
    assert head["w"] == pytest.approx(5 / 3) and head["all"] == pytest.approx(5 / 3)


# ---- pre-warm starts ---------------------------------------------------------------------------


def test_prewarmed_workers_serve_their_first_batch_warm() -> None:
    # The standard case's warm-up leaves queues on V100 and A100 shares (the fastest, chosen best
    # effort while cold starts missed every slack); ESG then starts cheaper T4 shares with no job.
    from esg_prefect.simulator import standard_case

    case = standard_case("esg", duration_s=8.0, seed=0)
    runs = {on: simulate(replace(case, settings=replace(case.settings, prewarm=on))) for on in (True, False)}
    for run in runs.values():
        first: dict[str, object] = {}
        for s in sorted(run.stages, key=lambda s: (s.start_ms, s.job_id)):
            first.setdefault(s.worker_id, s)
        warm_first = [w for w, s in first.items() if s.cold_start_ms == 0]  # type: ignore[attr-defined]
        # A worker whose first batch had no cold start can only have been started without one; the
        # other pre-warmed workers expired unused (their idle records are all they left).
        never_used = {i.worker_id for i in run.idles} - {s.worker_id for s in run.stages}
        assert len(warm_first) + len(never_used) == run.prewarm_starts
        assert len(run.requests) == 2299 and all(r.finish_ms is not None for r in run.requests)
    assert runs[True].prewarm_starts > 0 and runs[False].prewarm_starts == 0
    # A pre-warm's load is billed as idle time from the instant it began: the worker's first
    # idle record starts before its first batch, by at least the cold start.
    on = runs[True]
    starts = {s.worker_id: s.start_ms for s in sorted(on.stages, key=lambda s: -s.start_ms)}
    for w in {s.worker_id for s in on.stages if s.cold_start_ms == 0} - {
        s.worker_id for s in on.stages if s.cold_start_ms > 0
    }:
        idle0 = min(i.start_ms for i in on.idles if i.worker_id == w)
        assert idle0 < starts[w]


def test_records_built_unchecked_pass_their_checks() -> None:
    """The controller and cluster skip the records' checks; rebuilding each with them changes nothing."""
    run = simulate(tiny_case("esg"))
    assert run.stages and run.batches and run.idles
    for record in (*run.requests, *run.stages, *run.batches, *run.idles):
        assert replace(record) == record  # replace() runs __init__, so every check
    for batch in run.batches:
        assert all(replace(item) == item for item in batch.items)


def test_bad_arrival_times_and_request_sizes_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    case = tiny_case("esg")
    wf = case.workflows[0].name
    with pytest.raises(InvalidInputError, match="nan"):
        simulate(case, arrivals=[(0.0, wf), (math.nan, wf)])
    monkeypatch.setattr(Case, "request_sizes", lambda self, n, seed: [1.0] * (n - 1) + [0.0])
    with pytest.raises(InvalidInputError, match=r"request size .* got 0\.0"):
        simulate(case, arrivals=[(0.0, wf), (5.0, wf)])


@pytest.mark.parametrize("enabled_before", [True, False])
def test_cyclic_gc_paused_during_a_run_and_restored(enabled_before: bool) -> None:
    seen: list[bool] = []
    was = gc.isenabled()
    try:
        gc.enable() if enabled_before else gc.disable()
        run = simulate(tiny_case(), progress=lambda _f: seen.append(gc.isenabled()))
        after = gc.isenabled()
    finally:
        gc.enable() if was else gc.disable()
    assert run.report.overall.count > 0
    assert seen and not any(seen)  # paused while the loop ran
    assert after is enabled_before  # the caller's setting is back


def test_pause_gc_false_leaves_the_collector_alone() -> None:
    seen: list[bool] = []
    run = simulate(tiny_case(), progress=lambda _f: seen.append(gc.isenabled()), pause_gc=False)
    assert run.report.overall.count > 0 and seen and all(seen) and gc.isenabled()


def test_cyclic_gc_restored_when_a_run_fails() -> None:
    def stop(_fraction: float) -> None:
        assert not gc.isenabled()
        raise RuntimeError("stopped by the progress callback")

    assert gc.isenabled()
    with pytest.raises(RuntimeError, match="stopped by the progress callback"):
        simulate(tiny_case(), progress=stop)
    assert gc.isenabled()


def test_keep_alive_by_price_stops_idle_workers_on_dear_gpus_sooner() -> None:
    # One stage profiled on a T4 only, one on an A100 only; a 1 s keep-alive. Each runs one job at 0
    # (cold start 5 + 10 ms), then idles until its keep-alive runs out (a third request at 5 s keeps
    # the run going). Priced, the A100 worker keeps 1 s x 0.35/3.67 (the default sheet's hourly
    # prices), the T4 worker (the cheapest type present) all of it.
    prof = LatencyProfile(
        [ProfilePoint("t", "T4", 1, 1, 1.0, 10.0), ProfilePoint("x", "A100", 1, 1, 1.0, 10.0)],
        {("t", "T4"): 5.0, ("x", "A100"): 5.0},
    )
    case = Case(
        name="priced-keep-alive",
        workflows=(Workflow.chain("wt", ["t"], slo_ms=100.0), Workflow.chain("wx", ["x"], slo_ms=100.0)),
        profile=prof,
        prices=PriceSheet.default(),
        cluster=ClusterSpec((NodeSpec("n0", 4, ("T4", "A100")),)),
        workload=WorkloadSpec("poisson", 1.0),
        duration_s=6.0,
        scheduler="per-invocation",
        settings=ESGSettings(config_space=ConfigSpace((1,), (1,), (1.0,)), keep_alive_s=1.0),
        sim=SimSpec(service_time="mean", interference_per_corunner=0.0, round_interval_ms=0.0),
    )
    arrivals = [(0.0, "wt"), (0.0, "wx"), (5000.0, "wt")]

    def first_idle(settings_change: dict[str, object]) -> dict[str, float]:
        run = simulate(replace(case, settings=replace(case.settings, **settings_change)), arrivals=arrivals)
        first: dict[str, float] = {}
        for i in run.idles:
            first.setdefault(i.hardware, i.end_ms - i.start_ms)
        return first

    assert first_idle({"keep_alive_by_price": False}) == {"T4": pytest.approx(1000.0), "A100": pytest.approx(1000.0)}
    assert case.settings.keep_alive_by_price  # the default
    priced = first_idle({})
    assert priced["T4"] == pytest.approx(1000.0)
    assert priced["A100"] == pytest.approx(1000.0 * 0.35 / 3.67)
