"""The one cost of a flow run worked by hand: attribution, the linear grouping, the report, ledger and simulator."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import pytest

from esg_prefect.model import PriceSheet
from esg_prefect.model.attribution import BatchItem, BatchRecord, IdleRecord, attribute_costs, idle_cost
from esg_prefect.model.config import Config
from esg_prefect.model.ledger import CostLedger
from esg_prefect.model.report import _attribute, summarize
from esg_prefect.model.window import after_warmup

# A vCPU-second costs 0.25, a whole T4-second 0.5: a worker with 1 vCPU and half a T4 costs 0.5 per second
# busy, 0.25 per second idle (it holds its GPU share but no vCPU), and its vCPU's 0.25 more while it loads.
PRICES = PriceSheet(0.25, {"T4": 0.5})
CFG = Config(2, 1, 0.5)


def _batch(bid: str, worker: str, runs: Sequence[str], start: float, end: float) -> BatchRecord:
    items = tuple(BatchItem(f"{bid}-{r}", r) for r in runs)
    return BatchRecord(bid, worker, items, CFG.with_batch(len(items)), "T4", start, end)


def _idle(worker: str, start: float, end: float, loading_ms: float = 0.0) -> IdleRecord:
    return IdleRecord(worker, 1, 0.5, "T4", start, end, loading_ms)


# wA is pre-warmed at 0 (loading until 40) and idles warm until b1 (A and B) at 100; idles 300-500; runs
# b2 (C) 500-600; idles until its keep-alive runs out at 1600. wB starts at 0 and never runs a batch (1 s idle).
B1 = _batch("b1", "wA", ["A", "B"], 100.0, 300.0)  # 0.2 s * 0.5: 0.1, 0.05 each
B2 = _batch("b2", "wA", ["C"], 500.0, 600.0)  # 0.1 s * 0.5: 0.05
# 0.1 s * 0.25 + its vCPU for the 0.04 s load (0.04 * 0.25): 0.035; no batch before it on wA: to b1, the first after
LEAD = _idle("wA", 0.0, 100.0, loading_ms=40.0)
AFTER_B1 = _idle("wA", 300.0, 500.0)  # 0.2 s * 0.25: 0.05, to b1, the batch that ended just before it
AFTER_B2 = _idle("wA", 600.0, 1600.0)  # 1 s * 0.25: 0.25, to b2
NEVER_USED = _idle("wB", 0.0, 1000.0)  # 1 s * 0.25: 0.25, wB ran no batch: the separate idle line
BATCHES = [B2, B1]  # out of order on purpose
IDLES = [AFTER_B2, NEVER_USED, AFTER_B1, LEAD]
# busy time at the whole rate, idle time at the share's, the load at the vCPU's on top: 0.735
WHOLE_BILL = 0.1 + 0.05 + 0.035 + 0.05 + 0.25 + 0.25


def test_lead_idle_goes_to_the_first_batch_after_it_and_a_never_used_worker_to_the_line() -> None:
    rep = attribute_costs(BATCHES, IDLES, PRICES)
    approx = lambda v: pytest.approx(v, rel=1e-12)  # noqa: E731
    # A and B: half of b1 (0.05), half of the lead idle, load included (0.0175), half of the idle after b1 (0.025)
    for run in ("A", "B"):
        c = rep.run_cost(run)
        assert (c.busy, c.idle, c.total, c.unit) == (approx(0.05), approx(0.0425), approx(0.0925), "$")
    c = rep.run_cost("C")  # b2 and the idle after it until the keep-alive ran out
    assert (c.busy, c.idle, c.total) == (approx(0.05), approx(0.25), approx(0.3))
    assert rep.idle_unattributed == approx(0.25)  # wB's idle time only
    assert rep.per_run == {r: rep.run_cost(r).total for r in ("A", "B", "C")}
    # the invariant, exact on this example: the runs and the line are the whole bill
    assert math.isclose(sum(rep.per_run.values()) + rep.idle_unattributed, WHOLE_BILL, rel_tol=1e-12)
    assert math.isclose(rep.total, WHOLE_BILL, rel_tol=1e-12)
    # every worker ran a batch: the runs alone are the whole bill
    used = attribute_costs(BATCHES, [i for i in IDLES if i.worker_id != "wB"], PRICES)
    assert used.idle_unattributed == 0.0
    assert math.isclose(sum(used.per_run.values()), WHOLE_BILL - 0.25, rel_tol=1e-12)


def test_separate_idle_billing_keeps_every_idle_interval_on_the_line() -> None:
    rep = attribute_costs(BATCHES, IDLES, PRICES, idle_billing="separate")
    assert {r: rep.run_cost(r).idle for r in ("A", "B", "C")} == {"A": 0.0, "B": 0.0, "C": 0.0}
    assert rep.idle_unattributed == pytest.approx(0.035 + 0.05 + 0.25 + 0.25, rel=1e-12)
    assert sum(rep.per_run.values()) + rep.idle_unattributed == pytest.approx(WHOLE_BILL, rel=1e-12)


def test_a_window_cut_does_not_make_idle_time_lead_idle_time() -> None:
    """After a warm-up cut at 400 ms, b1 is out: the idle after it stays on the line, not on b2's run."""
    window = after_warmup([], [], BATCHES, IDLES, 400.0)
    assert window.prior_workers == {"wA"}
    rep = summarize([], [], window.batches, window.idles, PRICES, [], prior_workers=window.prior_workers)
    assert rep.per_run["C"].idle == pytest.approx(0.25)  # only the idle after b2
    assert rep.idle_unattributed == pytest.approx(0.025 + 0.15)  # 400-500 of the idle after b1, wB's 400-1000
    naive = summarize([], [], window.batches, window.idles, PRICES, [])
    assert naive.per_run["C"].idle == pytest.approx(0.275)  # without it, that idle would count as b2's lead


def test_linear_grouping_and_the_report_give_the_same_figures() -> None:
    ref = attribute_costs(BATCHES, IDLES, PRICES)
    got = _attribute(BATCHES, IDLES, PRICES, "equal", "attribute")
    assert got.per_run == pytest.approx(ref.per_run, rel=1e-12)
    assert got.per_run_idle == pytest.approx(ref.per_run_idle, rel=1e-12)
    assert got.idle_unattributed == pytest.approx(ref.idle_unattributed, rel=1e-12)
    rep = summarize([], [], BATCHES, IDLES, PRICES, [])
    assert {r: c.total for r, c in rep.per_run.items()} == pytest.approx(ref.per_run, rel=1e-12)


def test_the_ledger_settles_a_run_once_the_idle_after_its_batches_has_closed() -> None:
    ledger = CostLedger()
    # As a pool hands them over: b1 with the lead idle closed at its dispatch; A and B end.
    ledger.add([B1], [LEAD])
    ledger.watch("A", ["b1"])
    ledger.watch("B", ["b1"])
    assert ledger.ready() == []  # wA is idle since b1 ended
    ledger.sync({"wA": B1.end_ms, "wB": 0.0})
    assert ledger.ready() == [] and [b.batch_id for b in ledger.waiting()] == ["b1"]
    ledger.add([B2], [AFTER_B1])  # b2 ran on wA: the idle after b1 closed at its start
    ready = dict(ledger.ready())
    assert set(ready) == {"A", "B"} and set(ready["A"]) == {AFTER_B1, LEAD}
    for run in ("A", "B"):  # the ledger's intervals give the run exactly its figure over all the records
        assert attribute_costs([B1], ready[run], PRICES).run_cost(run).total == pytest.approx(0.0925, rel=1e-12)
    ledger.watch("C", ["b2"])
    ledger.sync({"wA": B2.end_ms})
    assert ledger.ready() == []
    ledger.add([], [AFTER_B2])  # keep-alive expiry
    ((run, idles),) = ledger.ready()
    assert (run, idles) == ("C", (AFTER_B2,))
    # a worker gone without a recorded interval (lost, or retired at once) settles on sync
    b3 = _batch("b3", "wC", ["D"], 0.0, 10.0)
    ledger.add([b3], [])
    ledger.watch("D", ["b3"])
    ledger.sync({})
    assert ledger.ready() == [("D", ())]
    # a pool's close settles everything; wB's idle (never used) is no run's
    b4 = _batch("b4", "wD", ["E"], 0.0, 10.0)
    ledger.add([b4], [NEVER_USED])
    ledger.watch("E", ["b4"])
    ledger.close()
    assert ledger.ready() == [("E", ())]


@pytest.mark.parametrize("seed", [0, 1])
def test_the_simulators_per_run_costs_are_attribute_costs_on_its_records(seed: int) -> None:
    from esg_prefect.model import Workflow
    from esg_prefect.simulator import SimSpec, simulate
    from esg_prefect.simulator.standard import tiny_case

    chain = Workflow.chain("classify", ["resnet50", "resnext101"], 150.0)
    case = tiny_case("esg", [chain])
    case = replace(case, sim=SimSpec(service_time="mean"), duration_s=3.0, warmup_s=0.0, seed=seed)
    run = simulate(case)
    rep = run.report
    ref = attribute_costs(run.batches, run.idles, case.prices, case.settings.cost_split, case.settings.idle_billing)
    assert len(rep.per_run) > 10 and rep.per_run.keys() == ref.per_run.keys()
    for r, c in rep.per_run.items():
        want = ref.run_cost(r)
        assert (c.busy, c.idle) == (pytest.approx(want.busy, rel=1e-9), pytest.approx(want.idle, rel=1e-9))
    bill = sum(case.prices.batch_cost(b.config, b.hardware, b.duration_ms) for b in run.batches) + sum(
        idle_cost(i, case.prices) for i in run.idles
    )
    assert math.isclose(sum(c.total for c in rep.per_run.values()) + rep.idle_unattributed, bill, rel_tol=1e-9)
