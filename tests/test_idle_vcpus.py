"""Idle vCPUs billed where the platform holds them (``idle_vcpus``; docs/decisions/idle-vcpus.md).

By default an idle worker pays for its GPU share only. A backend that reserves a
worker's vCPUs for its whole life (Ray's ``cpu_reservation="lifetime"``) makes the
pool bill them while it idles, so that the bill is what the workers held; the same
knob in the simulator gives the same records, billed the same way.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from esg_prefect.control.totals import Totals
from esg_prefect.model import PriceSheet, Workflow
from esg_prefect.model.attribution import IdleRecord, attribute_costs, idle_cost, idle_cost_split, idle_rates
from esg_prefect.runtime.pool import Pool
from esg_prefect.runtime.pool_resources import within_backend
from esg_prefect.runtime.workers import LocalProcessBackend
from esg_prefect.scheduling import ESGSettings
from tests.toy_stages import toy_profile

PRICES = PriceSheet(0.5, {"T4": 4.0})  # per second: a vCPU 0.5, a whole T4 4.0


def test_an_idle_interval_with_its_vcpus_held_is_billed_at_the_whole_rate() -> None:
    # two vCPUs and a quarter T4, idle 2 s of which the first 0.5 s loads
    share_only = IdleRecord("w1", 2, 0.25, "T4", 1000.0, 3000.0, loading_ms=500.0)
    held = replace(share_only, vcpus_held=True)
    whole_rate = 2 * 0.5 + 0.25 * 4.0  # 2.0 per s
    assert idle_cost_split(share_only, PRICES) == pytest.approx((0.5 * whole_rate, 1.5 * 0.25 * 4.0))
    assert idle_cost_split(held, PRICES) == pytest.approx((0.5 * whole_rate, 1.5 * whole_rate))
    assert idle_cost(held, PRICES) - idle_cost(share_only, PRICES) == pytest.approx(1.5 * 2 * 0.5)
    cpu = IdleRecord("w2", 1, 0.0, "cpu", 0.0, 4000.0, vcpus_held=True)  # a CPU worker: 0 by default
    assert idle_cost(cpu, PRICES) == pytest.approx(4 * 0.5)
    assert idle_cost(replace(cpu, vcpus_held=False), PRICES) == 0.0


@pytest.mark.parametrize("held", [False, True])
def test_the_running_totals_bill_an_idle_worker_as_attribution_does(held: bool) -> None:
    # one rule of idle prices (idle_rates): the pool's counters and the reports cannot disagree
    record = IdleRecord("w1", 2, 0.25, "T4", 1000.0, 3000.0, loading_ms=500.0, vcpus_held=held)
    whole_rate, share_rate = 2 * 0.5 + 0.25 * 4.0, 0.25 * 4.0
    assert idle_rates(PRICES, 2, 0.25, "T4", held) == (whole_rate, whole_rate if held else share_rate)
    totals = Totals()
    totals.idle(record)
    expected = 0.5 * whole_rate + 1.5 * (whole_rate if held else share_rate)
    assert totals.bill(PRICES)["idle"] == pytest.approx(idle_cost(record, PRICES), rel=1e-12)
    assert idle_cost(record, PRICES) == pytest.approx(expected, rel=1e-12)


class _Holding(LocalProcessBackend):
    holds_idle_vcpus = True


class _NotABool(LocalProcessBackend):
    holds_idle_vcpus = "yes"  # only True turns billing on


def test_a_backend_that_holds_vcpus_for_life_makes_the_pool_bill_them_idle() -> None:
    assert within_backend(ESGSettings(), LocalProcessBackend(vcpus=2, spares=0)).idle_vcpus is False
    assert within_backend(ESGSettings(), _NotABool(vcpus=2, spares=0)).idle_vcpus is False
    held = within_backend(ESGSettings(), _Holding(vcpus=2, spares=0))
    assert held.idle_vcpus is True and held.config_space.vcpus == (1,)  # the vCPU cap still applies
    assert within_backend(ESGSettings(idle_vcpus=True), LocalProcessBackend(vcpus=2, spares=0)).idle_vcpus
    pool = Pool(toy_profile(), PRICES, backend=_Holding(vcpus=2, spares=0))
    try:
        assert pool.settings.idle_vcpus and pool.settings.platform.idle_vcpus
    finally:
        pool.close()


@pytest.mark.parametrize("seed", [0, 1])
def test_the_simulator_bills_held_vcpus_on_the_same_records_and_runs_still_sum_to_the_bill(seed: int) -> None:
    from esg_prefect.simulator import SimSpec, simulate
    from esg_prefect.simulator.standard import tiny_case

    chain = Workflow.chain("classify", ["resnet50", "resnext101"], 150.0)
    case = replace(tiny_case("esg", [chain]), sim=SimSpec(service_time="mean"), duration_s=3.0, warmup_s=0.0, seed=seed)
    off = simulate(case)
    on = simulate(replace(case, settings=replace(case.settings, idle_vcpus=True)))
    # the knob is the bill's, not a decision's: the same batches and idle intervals, now marked
    assert on.batches == off.batches
    assert [replace(i, vcpus_held=False) for i in on.idles] == list(off.idles)
    assert off.idles and all(i.vcpus_held for i in on.idles) and not any(i.vcpus_held for i in off.idles)
    prices = case.prices
    extra = sum(i.vcpus * prices.price_per_vcpu_s * (i.end_ms - i.start_ms - i.loading_ms) / 1000.0 for i in on.idles)
    assert extra > 0
    bill_off = sum(idle_cost(i, prices) for i in off.idles)
    bill_on = sum(idle_cost(i, prices) for i in on.idles)
    assert bill_on - bill_off == pytest.approx(extra, rel=1e-9)
    rep = on.report
    busy = sum(prices.batch_cost(b.config, b.hardware, b.duration_ms) for b in on.batches)
    assert math.isclose(
        sum(c.total for c in rep.per_run.values()) + rep.idle_unattributed, busy + bill_on, rel_tol=1e-9
    )
    ref = attribute_costs(on.batches, on.idles, prices, case.settings.cost_split, case.settings.idle_billing)
    assert sum(c.idle for c in rep.per_run.values()) == pytest.approx(sum(ref.run_cost(r).idle for r in ref.per_run))
    assert rep.idle_cost > off.report.idle_cost


def test_the_store_keeps_whether_an_idle_worker_held_its_vcpus() -> None:
    from esg_prefect.store import rows
    from esg_prefect.store.tables import IdleRow

    for held in (False, True):
        record = IdleRecord("w1", 2, 0.25, "T4", 1000.0, 3000.0, loading_ms=500.0, vcpus_held=held)
        (row,) = rows.idle_rows([record], PRICES, "")
        assert row["vcpus_held"] is held
        assert rows.idle_record(IdleRow(**row)) == record
