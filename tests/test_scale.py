"""The scale case (issue #25) and partitioned control: what the case holds, how partitions split it.

Nothing here reads a wall clock: timed runs take a counting clock, so the
checks hold on any machine at any speed.
"""

from __future__ import annotations

import math
import subprocess
import sys
from array import array
from collections import Counter
from pathlib import Path

import pytest

import esg_prefect.scheduling  # noqa: F401 - registers the baselines
from esg_prefect.exceptions import ConfigError, InvalidInputError
from esg_prefect.model.pricing import PriceSheet
from esg_prefect.simulator import simulate
from esg_prefect.simulator.case import Case
from esg_prefect.simulator.partitioned import (
    partition_case,
    plan_partitions,
    simulate_partitioned,
    split_arrivals,
)
from esg_prefect.simulator.run import SimRun
from esg_prefect.simulator.scale import (
    SCALE_GPU_MIX,
    scale_case,
    scale_cluster,
    scale_profile,
    scale_workflows,
    window_rate_factor,
)
from esg_prefect.simulator.timed import PartitionResult, merge, simulate_timed

ROOT = Path(__file__).resolve().parents[1]


class CountingClock:
    """A clock that moves 1 ms at each reading: timings become counts, the same on every machine."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def small_case(scheduler: str = "esg") -> Case:
    return scale_case(scheduler, gpus=24, workflows=4, rate_per_s=100.0, duration_s=3.0, warmup_s=1.0)


@pytest.fixture(scope="module")
def plain() -> SimRun:
    """The small case through the plain simulator."""
    return simulate(small_case())


# ---- the case ---------------------------------------------------------------------------------


def test_full_case_holds_a_thousand_gpus_of_the_sheets_types() -> None:
    case = scale_case()
    counts = case.cluster.gpu_counts()
    assert sum(counts.values()) == 1000
    sheet = PriceSheet.default()
    profile = scale_profile()
    assert set(counts) == {hw for hw, _, _ in SCALE_GPU_MIX}
    for hw in counts:
        assert hw in sheet.price_per_gpu_s
        assert any(hw in profile.hardware_types(s) for s in profile.stages())
    assert counts == {"T4": 664, "V100": 168, "A100": 168}
    assert all(len(n.gpus) == 8 and len(set(n.gpus)) == 1 for n in case.cluster.nodes)


def test_hundred_workflows_of_two_to_eight_stages_chains_and_dags() -> None:
    wfs = scale_workflows()
    assert len(wfs) == 100 and len({w.name for w in wfs}) == 100
    profile = scale_profile()
    gpu_stages = {s for s in profile.stages() if "cpu" not in profile.hardware_types(s)}
    chains = dags = 0
    for w in wfs:
        assert 2 <= len(w.stages) <= 8
        assert set(w.stages) & gpu_stages, w.name
        assert w.slo_ms % 10 == 0
        is_chain = len(w.edges) == len(w.stages) - 1 and all(len(w.successors(s)) <= 1 for s in w.stages)
        is_chain = is_chain and len(w.entries) == 1
        chains += is_chain
        dags += not is_chain
        if not is_chain:
            assert len(w.entries) == 1 and len(w.exits) == 1
    assert chains >= 30 and dags >= 30
    assert scale_workflows() == wfs
    assert scale_workflows(seed=1) != wfs


def test_window_holds_ten_thousand_requests_per_second() -> None:
    case = scale_case()
    assert case.duration_s == 120.0
    assert window_rate_factor(100, 120.0) == pytest.approx(1.0)
    arrivals = case.arrivals()
    assert len(arrivals) / case.duration_s == pytest.approx(10_000, rel=0.005)
    assert len({wf for _, wf in arrivals}) == 100
    assert arrivals == sorted(arrivals)
    short = scale_case(duration_s=10.0).arrivals()
    assert len(short) / 10.0 == pytest.approx(10_000, rel=0.02)


def test_cluster_sizes_that_are_not_whole_nodes() -> None:
    spec = scale_cluster(20)
    assert sum(spec.gpu_counts().values()) == 20
    with pytest.raises(ConfigError):
        scale_cluster(0)
    with pytest.raises(ConfigError):
        scale_workflows(0)


# ---- partitions ---------------------------------------------------------------------------------


@pytest.mark.parametrize("by", ["workflow", "pool"])
@pytest.mark.parametrize("k", [1, 3, 16])
def test_partitions_are_disjoint_and_every_request_goes_to_one(by: str, k: int) -> None:
    case = scale_case(duration_s=2.0)
    arrivals = case.arrivals()
    parts = plan_partitions(case, k, arrivals, by)  # type: ignore[arg-type]
    assert [p.index for p in parts] == list(range(k))
    nodes = [n for p in parts for n in p.nodes]
    assert sorted(nodes) == sorted(n.name for n in case.cluster.nodes)
    assert all(p.nodes for p in parts)
    names = [w.name for w in case.workflows]
    assert all(len(set(p.workflows)) == len(p.workflows) for p in parts)
    if by == "workflow":
        assert {w for p in parts for w in p.workflows} == set(names)
        if k == 16:  # the hottest workflows are cut into slices, each in its own partition
            assert any(sum(w in p.workflows for p in parts) > 1 for w in names)
    else:
        assert all(list(p.workflows) == names for p in parts)
    assert sum(p.demand for p in parts) == pytest.approx(1.0)
    split = split_arrivals(parts, arrivals)
    assert Counter(a for mine in split for a in mine) == Counter(arrivals)
    for p, mine in zip(parts, split, strict=True):
        assert mine == sorted(mine)
        assert {wf for _, wf in mine} <= set(p.workflows)
        sub = partition_case(case, p)
        assert [n.name for n in sub.cluster.nodes] == list(p.nodes)
        assert [w.name for w in sub.workflows] == list(p.workflows)
    per = [Counter(wf for _, wf in mine) for mine in split]
    for wf in names:  # round robin: each partition serving a workflow gets its share, within one request
        got = [c[wf] for c, p in zip(per, parts, strict=True) if wf in p.workflows]
        assert max(got) - min(got) <= 1


def test_plan_is_a_function_of_its_inputs_and_checks_k() -> None:
    case = scale_case(duration_s=2.0)
    arrivals = case.arrivals()
    assert plan_partitions(case, 8, arrivals) == plan_partitions(case, 8, arrivals)
    with pytest.raises(ConfigError):
        plan_partitions(case, 0, arrivals)
    with pytest.raises(ConfigError):
        plan_partitions(case, 126, arrivals, "pool")
    with pytest.raises(ConfigError):
        plan_partitions(case, 101, arrivals, "workflow")
    with pytest.raises(ConfigError):
        plan_partitions(case, 2, arrivals, "stage")  # type: ignore[arg-type]


def test_split_refuses_an_arrival_no_partition_serves() -> None:
    case = small_case()
    parts = plan_partitions(case, 2, case.arrivals())
    with pytest.raises(InvalidInputError):
        split_arrivals(parts, [(1.0, "nobody")])


# ---- runs -------------------------------------------------------------------------------------


def test_timed_run_decides_what_the_plain_simulation_decides(plain: SimRun) -> None:
    case = small_case()
    timed, times = simulate_timed(case, case.arrivals(), clock=CountingClock())
    assert times is not None
    assert timed.requests == plain.requests
    assert timed.batches == plain.batches
    assert timed.idles == plain.idles
    assert timed.stages == plain.stages
    assert timed.decisions == plain.decisions
    assert timed.report == plain.report
    assert len(times.rounds_ms) == timed.rounds == plain.rounds
    assert times.core_ms >= sum(times.rounds_ms) > 0
    assert len(timed.decide_ms) == timed.rounds


def test_one_partition_is_the_plain_controller(plain: SimRun) -> None:
    case = small_case()
    (one,) = simulate_partitioned(case, 1, clock=CountingClock())
    figures = merge([one])
    o = plain.report.overall
    assert figures.requests == o.count
    assert figures.slo_hit_rate == o.slo_hit_rate
    assert figures.latency_p99_ms == pytest.approx(o.latency_p99_ms)
    assert figures.whole_cost_per_request == pytest.approx(
        plain.report.busy_cost / o.count + plain.report.idle_cost / o.count
    )
    assert figures.batch_cost_per_request == pytest.approx(o.batch_cost_per_request)
    assert figures.rounds == plain.rounds
    assert figures.workers == plain.cold_starts
    assert figures.realtime_factor == figures.realtime_factor_one_core


@pytest.mark.parametrize("by", ["workflow", "pool"])
def test_partitioned_cost_against_one_controller(by: str, plain: SimRun) -> None:
    case = small_case()
    one = merge(simulate_partitioned(case, 1))
    assert one.whole_cost_per_request == pytest.approx(
        (plain.report.busy_cost + plain.report.idle_cost) / plain.report.overall.count
    )
    two_runs = simulate_partitioned(case, 2, by=by, clock=CountingClock())  # type: ignore[arg-type]
    two = merge(two_runs)
    assert two.requests == one.requests and two.simulated_requests == one.simulated_requests
    assert two.partitions == 2 and one.partitions == 1
    ratio = two.whole_cost_per_request / one.whole_cost_per_request
    assert math.isfinite(ratio) and ratio > 0
    assert two.realtime_factor is not None and two.realtime_factor_one_core is not None
    assert two.realtime_factor >= two.realtime_factor_one_core
    assert two.core_s_max is not None and two.core_s_total is not None
    assert two.core_s_total == pytest.approx(sum((r.core_ms or 0.0) for r in two_runs) / 1000.0)
    assert one.realtime_factor is None  # untimed


def _result(index: int, core_ms: float, requests: int, met: int, cost: float) -> PartitionResult:
    return PartitionResult(
        index=index,
        workflows=1,
        gpus=8,
        requests=requests,
        slo_met=met,
        latencies_ms=array("d", [10.0 * (index + 1)] * requests),
        whole_cost=cost,
        batch_cost=cost / 2,
        batches=requests,
        batched_jobs=requests,
        workers=1,
        simulated_requests=requests,
        duration_s=10.0,
        end_ms=10_500.0,
        rounds=3,
        core_ms=core_ms,
        decide_ms=core_ms / 2,
        rounds_ms=array("d", [1.0, 2.0, 3.0]),
    )


def test_merge_adds_partitions_up() -> None:
    f = merge([_result(0, 4000.0, 10, 9, 1.0), _result(1, 1000.0, 30, 30, 2.0)])
    assert f.requests == 40 and f.slo_hit_rate == pytest.approx(39 / 40)
    assert f.whole_cost_per_request == pytest.approx(3.0 / 40)
    assert f.sim_s == 10.0
    assert f.realtime_factor == pytest.approx(10.0 / 4.0)
    assert f.realtime_factor_one_core == pytest.approx(10.0 / 5.0)
    assert f.round_p50_ms == 2.0 and f.rounds == 6
    with pytest.raises(InvalidInputError):
        merge([])


def test_bench_quick_mode_ends_with_its_result_line() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "scale.py"), "--quick"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        timeout=120,
    ).stdout
    last = out.strip().splitlines()[-1]
    assert last.startswith("RESULT realtime_factor=")
    keys = [kv.split("=")[0] for kv in last.split()[1:]]
    assert keys == ["realtime_factor", "decision_p99_ms", "peak_rss_mb", "partitions"]
