"""bench/plan_probe.py: the plan it holds ESG to fits each stage's budget, and the hold restricts ESG."""

from __future__ import annotations

import math
from types import ModuleType

import pytest

from tests.scripts import load_script


def _bench() -> ModuleType:
    return load_script("plan_probe_bench", "bench/plan_probe.py")


pp = _bench()


def test_each_stages_plan_carries_its_rate_within_its_budget_at_least_price() -> None:
    from esg_prefect.scheduling.tables import CandidateTables

    case = pp.wb.job_case(pp.wb.Job(pp.wb.Cell("tiny", "azure_functions_2019", 80.0, 0), "esg", (), 4.0, 1.0))
    tables = CandidateTables(case.load_profile(), case.prices, case.settings)
    hardware = frozenset(case.cluster.gpu_counts()) | {"cpu"}
    budgets = pp.stage_budgets(tuple(case.workflows), tables, hardware)
    stages = sorted({s for wf in case.workflows for s in wf.topological_order()})
    rates = {s: 20.0 + 10.0 * i for i, s in enumerate(stages)}
    plans = pp.plan(case, rates, 0.6)
    assert plans.keys() == set(stages)
    for stage, (price, hw, vcpus, share, batch, n, lat) in plans.items():
        lam = rates[stage]
        assert lat == tables.latency_ms(stage, batch, vcpus, share, hw)
        assert lat + (batch - 1) / lam * 1000.0 <= budgets[stage]  # fills and runs within its part of the SLO
        assert n == max(1, math.ceil(lam * lat / 1000.0 / batch / 0.6))  # at most 0.6 busy
        assert price == pytest.approx(
            n
            * (
                share * case.prices.gpu_price_s(hw)
                + vcpus * case.prices.price_per_vcpu_s * lam * lat / 1000 / batch / n
            )
        )
    # a higher rate never plans a cheaper fleet for a stage: the same options, more work
    doubled = pp.plan(case, {s: 2 * r for s, r in rates.items()}, 0.6)
    assert all(doubled[s][0] >= plans[s][0] * (1 - 1e-12) for s in stages)


def test_held_to_a_plan_esg_offers_only_its_kind_and_no_start_past_its_count() -> None:
    calls = []

    class View:
        def __init__(self, held: int) -> None:
            self.held = held

        def workers_of_kind(self, stage: str, hw: str, vcpus: int, share: float) -> int:
            calls.append((stage, hw, vcpus, share))
            return self.held

    offered = (("T4", 1, 0.2, 0), ("T4", 1, 0.4, 0), ("T4", 1, 0.4, 3), ("V100", 1, 0.4, 0))
    original = pp.esg_1q.ESG1Q._placeable
    pp.esg_1q.ESG1Q._placeable = lambda self, stage, view, now_ms: offered
    try:
        hold = pp.held_to({"s": (1.0, "T4", 1, 0.4, 2, 2, 5.0)}, {"s": 2})
        assert hold(None, "s", View(1), 0.0) == (("T4", 1, 0.4, 0), ("T4", 1, 0.4, 3))  # room for one more
        assert hold(None, "s", View(2), 0.0) == (("T4", 1, 0.4, 3),)  # full: only the warm one
        assert hold(None, "other", View(9), 0.0) == offered  # a stage without a plan is left alone
        pp.SPILL = True
        no_room = (("T4", 1, 0.4, 3), ("V100", 1, 0.4, 0))  # the plan's kind only warm: no room for another
        pp.esg_1q.ESG1Q._placeable = lambda self, stage, view, now_ms: no_room
        hold = pp.held_to({"s": (1.0, "T4", 1, 0.4, 2, 2, 5.0)}, {"s": 2})
        assert hold(None, "s", View(1), 0.0) == no_room  # below its count: any kind, as ESG would choose
        assert hold(None, "s", View(2), 0.0) == (("T4", 1, 0.4, 3),)  # at its count: still held
        pp.SPILL, pp.SOFT = False, True
        pp.esg_1q.ESG1Q._placeable = lambda self, stage, view, now_ms: (*offered, ("V100", 1, 0.4, 2))
        hold = pp.held_to({"s": (1.0, "T4", 1, 0.4, 2, 2, 5.0)}, {"s": 2})
        soft_full = (("T4", 1, 0.4, 3), ("V100", 1, 0.4, 2))  # any warm worker serves; no new one at the count
        assert hold(None, "s", View(2), 0.0) == soft_full
        assert hold(None, "s", View(1), 0.0) == (("T4", 1, 0.4, 0), *soft_full)  # below it: the plan's kind
    finally:
        pp.esg_1q.ESG1Q._placeable = original
        pp.SPILL = pp.SOFT = False
    assert calls == [("s", "T4", 1, 0.4)] * 6


def test_the_online_count_follows_the_calls_counted_over_its_window_and_holds_its_peak() -> None:
    from types import SimpleNamespace as NS

    def snapshot(stage_jobs: dict[str, list[tuple[str, float]]]) -> NS:
        return NS(
            queues=[
                NS(key=NS(stage=st), jobs=[NS(job_id=j, ready_ms=t) for j, t in jobs], arrival_rate_per_s=0.0)
                for st, jobs in stage_jobs.items()
            ]
        )

    original = pp.ESGScheduler.decide
    pp.ESGScheduler.decide = lambda self, snapshot, now_ms: "decided"
    try:
        plans = {"s": (1.0, "T4", 1, 0.4, 2, 1, 100.0)}  # batch 2 in 100 ms: 20 calls/s per worker at full load
        counts = {"s": 1}
        decide = pp.counted_by_rate(plans, counts, 0.5, 0, 1000.0)
        burst = [(f"j{i}", 900.0 + i) for i in range(40)]  # 40 calls in the last second: 40/s
        assert decide(None, snapshot({"s": burst}), 1000.0) == "decided"
        assert counts["s"] == 4  # 40/s x 0.1 s / 2 per batch / 0.5 utilisation
        assert decide(None, snapshot({"s": burst}), 1500.0) == "decided" and counts["s"] == 4  # each call once
        decide(None, snapshot({"s": []}), 2000.0)  # the window has passed them: none left
        assert counts["s"] == 1
        peak = pp.counted_by_rate(plans, counts, 0.5, 0, 1000.0, peak_ms=5000.0)
        peak(None, snapshot({"s": burst}), 1000.0)
        peak(None, snapshot({"s": []}), 2000.0)
        assert counts["s"] == 4  # the burst's count holds for the peak window
        peak(None, snapshot({"s": []}), 6500.0)
        assert counts["s"] == 1
    finally:
        pp.ESGScheduler.decide = original
