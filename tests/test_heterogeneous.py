"""E8's case and the simulator's co-run charge (esg_prefect/simulator/heterogeneous.py, cluster.py)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from esg_prefect.exceptions import ConfigError
from esg_prefect.model import Config
from esg_prefect.scheduling.base import Placement
from esg_prefect.simulator import simulate
from esg_prefect.simulator.case import ClusterSpec, NodeSpec, SimSpec, resolve_profile
from esg_prefect.simulator.cluster import SimCluster
from esg_prefect.simulator.heterogeneous import (
    ESG_VARIANTS,
    heterogeneous_case,
    heterogeneous_cluster,
    heterogeneous_profile,
    heterogeneous_workflows,
)
from esg_prefect.simulator.standard import tiny_case


def exec_ms_beside_two(sim: SimSpec) -> tuple[float, float]:
    """(exec time of a resnet50 batch beside 2 busy workers on its T4, the profile's mean)."""
    profile = resolve_profile("nvidia_gpu")
    cl = SimCluster(ClusterSpec((NodeSpec("n0", 8, ("T4",)),)), profile, sim, 60_000.0, random.Random(0))
    cfg = Config(1, 1, 0.1)
    place = Placement("n0", "n0/gpu0", None, 4)
    for _ in range(2):
        cl.begin(cl.acquire(place, "resnet50", cfg, "T4", 0.0))
    w = cl.acquire(place, "resnet50", cfg, "T4", 0.0)
    return cl.timing(w, "resnet50", cfg, False, 0).exec_ms, profile.latency_ms("resnet50", cfg, "T4", "mean")


def test_simulator_charges_the_corun_model_only_when_asked() -> None:
    got, mean = exec_ms_beside_two(SimSpec(service_time="mean", corun="default"))
    assert got == pytest.approx(mean * 1.30)  # 15 % per busy tenant on a GPU without a measured row
    legacy, _ = exec_ms_beside_two(SimSpec(service_time="mean"))
    assert legacy == pytest.approx(mean * 1.10)  # the historical 5 % linear model, unchanged


def test_hybrid_knob_turns_the_corun_model_on_in_the_simulator() -> None:
    case = tiny_case()
    base = simulate(case).report
    physics = simulate(case.with_(sim=replace(case.sim, corun="default"))).report
    both = simulate(
        case.with_(sim=replace(case.sim, corun="default"), settings=replace(case.settings, hybrid_sharing=True))
    )
    knob = simulate(case.with_(settings=replace(case.settings, hybrid_sharing=True))).report
    assert physics != base  # a different slowdown model gives a different run
    assert knob == both.report  # the knob alone brings the same physics as naming the table


def test_bad_corun_values_name_the_value() -> None:
    with pytest.raises(ConfigError, match="corun must be None, 'default' or a CSV path, got ''"):
        SimSpec(corun="")


def test_case_is_heterogeneous_and_covered() -> None:
    prof = heterogeneous_profile()
    cl = heterogeneous_cluster()
    assert cl.gpu_counts() == {"T4": 8, "A100": 2}
    assert cl.snapshot().hardware_types() == frozenset({"cpu", "T4", "A100"})
    for wf in heterogeneous_workflows():
        front = wf.topological_order()[0]
        assert prof.hardware_types(front) == frozenset({"cpu"})
        assert all(prof.hardware_types(s) == frozenset({"T4", "A100"}) for s in wf.stages if s != front)
    assert [w.slo_ms for w in heterogeneous_workflows()] == [90.0, 180.0, 220.0]
    case = heterogeneous_case("esg+both")
    assert (case.settings.hardware_selection, case.settings.hybrid_sharing, case.sim.corun) == (True, True, "default")
    assert heterogeneous_case("triton").scheduler == "triton"
    assert set(ESG_VARIANTS) == {"esg", "esg+hw", "esg+hybrid", "esg+both"}


def test_a_short_run_of_every_esg_variant() -> None:
    """A 3 s run at 60 requests/s: every variant serves the load."""
    out = {}
    for v in ESG_VARIANTS:
        run = simulate(heterogeneous_case(v, rate_per_s=60.0, duration_s=3.0, warmup_s=1.0))
        out[v] = run.report.overall
    for v, o in out.items():
        assert o.count > 50 and o.slo_hit_rate > 0.9, (v, o.slo_hit_rate)
