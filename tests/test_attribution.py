"""Cost attribution (ESG-SPEC section 6): worked examples, the billing invariant, bad input."""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from esg_prefect.exceptions import InvalidInputError, PriceError
from esg_prefect.model.attribution import (
    BatchItem,
    BatchRecord,
    CostSplit,
    IdleBilling,
    IdleRecord,
    attribute_costs,
    idle_cost,
    idle_cost_split,
)
from esg_prefect.model.config import Config
from esg_prefect.model.pricing import PriceSheet

# A vCPU-second costs 0.5, a whole T4-second 4.0: a worker with 1 vCPU and half a T4 costs 2.5 per s
# busy and 2.0 per s idle (an idle worker holds its GPU share but no vCPU).
PRICES = PriceSheet(0.5, {"T4": 4.0})
CFG = Config(2, 1, 0.5)
SPLITS: tuple[CostSplit, ...] = ("equal", "input_size")
BILLINGS: tuple[IdleBilling, ...] = ("attribute", "separate")


def batch(batch_id: str, worker: str, items: Sequence[BatchItem], start_ms: float, end_ms: float) -> BatchRecord:
    """A batch on a 1-vCPU, half-T4 worker."""
    return BatchRecord(batch_id, worker, tuple(items), CFG.with_batch(len(items)), "T4", start_ms, end_ms)


def idle(worker: str, start_ms: float, end_ms: float) -> IdleRecord:
    """Idle time of a 1-vCPU, half-T4 worker: 0.5 * 4.0 = 2.0 per s (its share only)."""
    return IdleRecord(worker, 1, 0.5, "T4", start_ms, end_ms)


def two_runs() -> BatchRecord:
    """r1 (run A, size 1) and r2 (run B, size 3) run for 1 s on w1: 2.5 * 1 = 2.5."""
    return batch("b1", "w1", [BatchItem("r1", "A", 1.0), BatchItem("r2", "B", 3.0)], 0.0, 1000.0)


# ---- worked examples ----------------------------------------------------------


def test_equal_split() -> None:
    rep = attribute_costs([two_runs()], [], PRICES)
    # 2.5 split in two halves
    assert rep.per_request == {"r1": 1.25, "r2": 1.25}
    assert rep.per_run == {"A": 1.25, "B": 1.25}
    assert (rep.busy_total, rep.idle_total, rep.idle_unattributed, rep.total) == (2.5, 0.0, 0.0, 2.5)


def test_input_size_split() -> None:
    rep = attribute_costs([two_runs()], [], PRICES, split="input_size")
    # sizes 1 and 3 of 4: 2.5 * 1/4 and 2.5 * 3/4
    assert rep.per_request == {"r1": 0.625, "r2": 1.875}
    assert rep.per_run == {"A": 0.625, "B": 1.875}


def test_idle_after_a_batch_is_attributed_to_its_runs() -> None:
    rep = attribute_costs([two_runs()], [idle("w1", 1000.0, 1400.0)], PRICES)
    # idle 0.4 s * 2.0 = 0.8, split like b1: 0.4 each on top of 1.25
    assert rep.per_run == {"A": 1.65, "B": 1.65}
    assert (rep.busy_total, rep.idle_total, rep.idle_unattributed, rep.total) == (2.5, 0.8, 0.0, 3.3)


def test_attributed_idle_follows_the_input_size_split() -> None:
    rep = attribute_costs([two_runs()], [idle("w1", 1000.0, 1400.0)], PRICES, split="input_size")
    # idle 0.8 split 1/4 and 3/4: A = 0.625 + 0.2, B = 1.875 + 0.6
    assert rep.per_run == {"A": 0.825, "B": 2.475}


def test_separate_idle_goes_to_the_idle_line() -> None:
    rep = attribute_costs([two_runs()], [idle("w1", 1000.0, 1400.0)], PRICES, idle_billing="separate")
    assert rep.per_run == {"A": 1.25, "B": 1.25}
    assert (rep.idle_total, rep.idle_unattributed) == (0.8, 0.8)


def test_idle_goes_to_the_batch_that_ended_last_before_it() -> None:
    b2 = batch("b2", "w1", [BatchItem("r3", "C")], 2000.0, 2400.0)  # 0.4 s * 2.5 = 1.0, all to r3
    idles = [idle("w1", 1000.0, 2000.0), idle("w1", 2400.0, 2800.0)]  # 1 s * 2.0 after b1, 0.4 s * 2.0 after b2
    rep = attribute_costs([b2, two_runs()], idles, PRICES)  # batches given out of order on purpose
    # A, B: 1.25 + 2.0 / 2; C: 1.0 + 0.8
    assert rep.per_run == {"A": 2.25, "B": 2.25, "C": 1.8}
    assert rep.idle_unattributed == 0.0


def test_idle_before_a_workers_first_batch_goes_to_that_batch() -> None:
    b1 = batch("b1", "w1", [BatchItem("r1", "A", 1.0), BatchItem("r2", "B", 3.0)], 200.0, 1200.0)  # 2.5
    idles = [
        idle("w1", 0.0, 200.0),  # w1 started (pre-warmed) at 0, idle until b1: 0.2 s * 2.0 = 0.4, to b1
        idle("w2", 0.0, 800.0),  # w2 never ran a batch: 0.8 s * 2.0 = 1.6, the idle line
    ]
    rep = attribute_costs([b1], idles, PRICES, idle_billing="attribute")
    assert rep.per_run == {"A": 1.45, "B": 1.45}
    assert (rep.per_run_busy, rep.per_run_idle) == ({"A": 1.25, "B": 1.25}, {"A": 0.2, "B": 0.2})
    assert (rep.idle_total, rep.idle_unattributed) == (2.0, 1.6)


def test_an_idle_worker_pays_for_its_gpu_share_only() -> None:
    cpu = IdleRecord("w1", 4, 0.0, "cpu", 0.0, 1000.0)  # its vCPUs go to busy workers: nothing held
    t4 = IdleRecord("w2", 4, 0.5, "T4", 0.0, 1000.0)  # half a T4 for 1 s: 0.5 * 4.0 * 1.0 = 2.0, no vCPU
    assert idle_cost(cpu, PRICES) == 0.0
    assert idle_cost(t4, PRICES) == 0.5 * 4.0 * 1.0
    rep = attribute_costs([], [cpu, t4], PRICES)
    assert (rep.idle_total, rep.idle_unattributed) == (2.0, 2.0)


def test_a_prewarm_load_in_an_idle_interval_bills_its_vcpus() -> None:
    rec = IdleRecord("w1", 1, 0.5, "T4", 0.0, 1000.0, loading_ms=200.0)
    # half a T4 for the whole 1 s, plus its 1 vCPU for the 0.2 s load: 0.5 * 4.0 * 1.0 + 1 * 0.5 * 0.2 = 2.1
    assert idle_cost(rec, PRICES) == pytest.approx(2.1, rel=1e-12)
    # in two parts: the load at the worker's whole rate (2.0 + 0.5 per s, 0.2 s), the rest at its share's (0.8 s)
    assert idle_cost_split(rec, PRICES) == (pytest.approx(0.5, rel=1e-12), pytest.approx(1.6, rel=1e-12))
    # lead idle time, load included, goes to the worker's first batch (1 s * 2.5 busy)
    rep = attribute_costs([batch("b1", "w1", [BatchItem("r1", "A")], 1000.0, 2000.0)], [rec], PRICES)
    assert (rep.per_run_busy, rep.per_run_idle) == ({"A": 2.5}, {"A": pytest.approx(2.1, rel=1e-12)})
    assert rep.idle_unattributed == 0.0
    for bad in (-1.0, 1000.5, math.nan, math.inf):
        with pytest.raises(InvalidInputError, match=re.escape(f"loading_ms must be within the interval, got {bad!r}")):
            IdleRecord("w1", 1, 0.5, "T4", 0.0, 1000.0, loading_ms=bad)


def test_a_request_in_several_batches_sums_its_shares() -> None:
    b2 = batch("b2", "w1", [BatchItem("r1", "A")], 1000.0, 1200.0)  # 0.2 s * 2.5 = 0.5 to r1
    rep = attribute_costs([two_runs(), b2], [], PRICES)
    assert rep.per_request == {"r1": 1.75, "r2": 1.25}
    assert rep.per_run == {"A": 1.75, "B": 1.25}


def test_no_input_gives_an_empty_report() -> None:
    rep = attribute_costs([], [], PRICES)
    assert (rep.per_request, rep.per_run, rep.total, rep.idle_unattributed) == ({}, {}, 0.0, 0.0)


# ---- the invariant on random instances ----------------------------------------


@dataclass(frozen=True)
class RandomWorker:
    """A worker's resources and hand-computed price rates: busy (vCPUs and share), idle (share only)."""

    worker_id: str
    vcpus: int
    gpu_share: float
    hardware: str
    rate_per_s: float
    idle_rate_per_s: float


def random_instance(rng: random.Random) -> tuple[list[BatchRecord], list[IdleRecord], PriceSheet, float]:
    """Random workers with alternating busy and idle intervals (some starting with a load); returns the expected
    total bill: busy time at the whole rate, idle time at the GPU share's rate, loads at the vCPUs' rate on top."""
    vcpu_price = rng.uniform(0.001, 0.01)
    gpu_prices = {"T4": rng.uniform(0.0, 0.2), "A100": rng.uniform(0.0, 1.0)}
    workers: list[RandomWorker] = []
    for i in range(rng.randint(1, 5)):
        hw = rng.choice(["cpu", "T4", "A100"])
        share = 0.0 if hw == "cpu" else rng.randint(1, 10) / 10
        vcpus = rng.choice([1, 2, 4])
        gpu_rate = share * gpu_prices[hw] if hw != "cpu" else 0.0
        workers.append(RandomWorker(f"w{i}", vcpus, share, hw, vcpus * vcpu_price + gpu_rate, gpu_rate))
    batches: list[BatchRecord] = []
    idles: list[IdleRecord] = []
    expected = 0.0
    for w in workers:
        t = 0.0
        busy_ms = idle_ms = loading_ms = 0.0
        for k in range(rng.randint(1, 8)):
            length = rng.uniform(0.0, 500.0)
            if rng.random() < 0.6:
                reqs = rng.sample(range(40), rng.randint(1, 4))
                items = tuple(BatchItem(f"r{r}", f"run{r % 3}", rng.uniform(0.5, 10.0)) for r in reqs)
                cfg = Config(len(items), w.vcpus, w.gpu_share)
                batches.append(BatchRecord(f"{w.worker_id}b{k}", w.worker_id, items, cfg, w.hardware, t, t + length))
                busy_ms += length
            else:
                span = (t + length) - t  # the interval's length as the record sees it
                loading = rng.choice([0.0, rng.uniform(0.0, span), span])  # none, part, or all of it loading
                idles.append(IdleRecord(w.worker_id, w.vcpus, w.gpu_share, w.hardware, t, t + length, loading))
                idle_ms += length
                loading_ms += loading
            t += length
        expected += (busy_ms * w.rate_per_s + idle_ms * w.idle_rate_per_s + loading_ms * w.vcpus * vcpu_price) / 1000.0
    rng.shuffle(batches)
    rng.shuffle(idles)
    return batches, idles, PriceSheet(vcpu_price, gpu_prices), expected


@pytest.mark.parametrize("seed", range(240))
def test_billing_invariant_on_random_instances(seed: int) -> None:
    rng = random.Random(seed)
    batches, idles, prices, expected = random_instance(rng)
    split: CostSplit = rng.choice(SPLITS)
    billing: IdleBilling = rng.choice(BILLINGS)
    rep = attribute_costs(batches, idles, prices, split=split, idle_billing=billing)
    assert math.isclose(sum(rep.per_run.values()) + rep.idle_unattributed, expected, rel_tol=1e-9)
    assert math.isclose(rep.total, expected, rel_tol=1e-9)
    assert math.isclose(sum(rep.per_request.values()), sum(rep.per_run.values()), rel_tol=1e-9)
    if billing == "separate":
        assert math.isclose(rep.idle_unattributed, rep.idle_total, rel_tol=1e-9)


# ---- bad input ----------------------------------------------------------------


@pytest.mark.parametrize(("req", "run"), [("", "A"), ("r1", "")])
def test_batch_item_needs_ids(req: str, run: str) -> None:
    with pytest.raises(InvalidInputError, match=f"must be non-empty, got '{req}', '{run}'"):
        BatchItem(req, run)


@pytest.mark.parametrize(("size", "shown"), [(0.0, "0.0"), (-2.0, "-2.0"), (float("nan"), "nan")])
def test_batch_item_input_size_must_be_positive(size: float, shown: str) -> None:
    with pytest.raises(InvalidInputError, match=f"input_size must be > 0, got {shown}"):
        BatchItem("r1", "A", size)


def test_batch_record_needs_items() -> None:
    with pytest.raises(InvalidInputError, match="batch record b9 has no items"):
        BatchRecord("b9", "w1", (), CFG, "T4", 0.0, 1.0)


@pytest.mark.parametrize(("start", "end"), [(5.0, 3.0), (0.0, float("nan")), (float("-inf"), 1.0)])
def test_batch_record_needs_ordered_finite_times(start: float, end: float) -> None:
    with pytest.raises(InvalidInputError, match=f"b9: need start_ms <= end_ms, got {start}, {end}"):
        BatchRecord("b9", "w1", (BatchItem("r", "A"),), CFG, "T4", start, end)


def test_idle_record_needs_ordered_times() -> None:
    with pytest.raises(InvalidInputError, match=re.escape("idle record of w7: need start_ms <= end_ms, got 9.0, 2.0")):
        IdleRecord("w7", 1, 0.5, "T4", 9.0, 2.0)


def test_unknown_idle_billing_is_named() -> None:
    with pytest.raises(InvalidInputError, match="idle_billing must be 'attribute' or 'separate', got 'bill'"):
        attribute_costs([two_runs()], [], PRICES, idle_billing="bill")  # type: ignore[arg-type]


def test_unknown_split_is_named() -> None:
    with pytest.raises(InvalidInputError, match="cost split must be 'equal' or 'input_size', got 'size'"):
        attribute_costs([two_runs()], [], PRICES, split="size")  # type: ignore[arg-type]


def test_unpriced_gpu_is_named() -> None:
    b = BatchRecord("b1", "w1", (BatchItem("r", "A"),), Config(1, 1, 0.5), "A100", 0.0, 1.0)
    with pytest.raises(PriceError, match="no price for GPU type 'A100'"):
        attribute_costs([b], [], PRICES)
