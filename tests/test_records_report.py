"""Run records and the one summarize function: a hand-worked report, windows, conformance checks."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from esg_prefect.control.records import PoolSnapshot
from esg_prefect.exceptions import InvalidInputError
from esg_prefect.model.attribution import BatchItem, BatchRecord, IdleRecord, attribute_costs, split_weights
from esg_prefect.model.config import Config
from esg_prefect.model.jobs import QueueKey
from esg_prefect.model.pricing import PriceSheet
from esg_prefect.model.records import RequestRecord, StageRecord
from esg_prefect.model.report import _attribute, percentile, summarize
from esg_prefect.model.window import after_warmup
from esg_prefect.scheduling.base import DecisionStats

# A vCPU-second costs 0.001, a whole T4-second 0.01: a 1-vCPU half-T4 worker costs 0.006/s busy and
# 0.005/s idle, a 2-vCPU worker with a fifth of a T4 0.004/s busy and 0.002/s idle (idle: the GPU share only).
PRICES = PriceSheet(0.001, {"T4": 0.01})
approx = lambda v: pytest.approx(v, rel=1e-12, abs=1e-15)  # noqa: E731


def stage(
    job: str, req: str, wf: str, st: str, batch: str, size: int, ready: float, start: float, end: float, **kw: float
) -> StageRecord:
    hw, share, vcpus = ("T4", 0.5, 1) if batch == "b1" else ("T4", 0.2, 2)
    return StageRecord(
        job, req, wf, st, batch, size, "w1" if batch == "b1" else "w2", hw, share, vcpus, ready, start, end, 90.0, **kw
    )


def worked_example() -> tuple[
    list[RequestRecord], list[StageRecord], list[BatchRecord], list[IdleRecord], list[object]
]:
    requests = [
        RequestRecord("r1", "A", "x", 0.0, 120.0, 150.0),  # 120 ms: met
        RequestRecord("r2", "B", "x", 10.0, 200.0, 150.0),  # 190 ms: missed
        RequestRecord("r3", "C", "y", 40.0, 260.0, 300.0, at_risk=True),  # 220 ms: met
        RequestRecord("r4", "D", "y", 50.0, None, 300.0),  # failed
    ]
    stages = [
        stage("r1:s1", "r1", "x", "s1", "b1", 2, 0.0, 20.0, 120.0, cold_start_ms=5.0),
        stage("r2:s1", "r2", "x", "s1", "b1", 2, 10.0, 20.0, 120.0),
        stage("r3:t", "r3", "y", "t", "b2", 1, 40.0, 50.0, 250.0),
    ]
    batches = [
        # w1 (1 vCPU, half T4) runs r1 and r2 for 100 ms: 0.006 * 0.1 = 0.0006, 0.0003 each.
        BatchRecord("b1", "w1", (BatchItem("r1", "A"), BatchItem("r2", "B")), Config(2, 1, 0.5), "T4", 20.0, 120.0),
        # w2 (2 vCPUs, a fifth of a T4) runs r3 for 200 ms: 0.004 * 0.2 = 0.0008.
        BatchRecord("b2", "w2", (BatchItem("r3", "C"),), Config(1, 2, 0.2), "T4", 50.0, 250.0),
    ]
    idles = [
        IdleRecord("w1", 1, 0.5, "T4", 120.0, 620.0),  # 0.005 * 0.5 = 0.0025, to r1 and r2 (after b1)
        IdleRecord("w2", 2, 0.2, "T4", 0.0, 50.0),  # 0.002 * 0.05 = 0.0001, w2 warm before its first batch: to b2
    ]
    decisions: list[object] = [
        DecisionStats(QueueKey("x", "s1"), expansions=4, decision_ms=1.0),
        {"queue": "y/t", "decision_ms": 3.0, "expansions": 2},
        {"queue": QueueKey("x", "s1"), "decision_ms": None, "expansions": 0},
    ]
    return requests, stages, batches, idles, decisions


# ---- records -----------------------------------------------------------------------------


def test_request_record_latency_and_slo() -> None:
    r = RequestRecord("r", "run", "w", 10.0, 60.0, 50.0)
    assert (r.latency_ms, r.slo_met, r.completed) == (50.0, True, True)
    assert RequestRecord("r", "run", "w", 10.0, 60.5, 50.0).slo_met is False
    failed = RequestRecord("r", "run", "w", 10.0, None, 50.0)
    assert (failed.latency_ms, failed.slo_met, failed.completed) == (None, False, False)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"finish_ms": 5.0}, "before arrival_ms"),
        ({"slo_ms": 0.0}, "slo_ms must be > 0"),
        ({"request_id": ""}, "non-empty"),
        ({"arrival_ms": math.nan}, "arrival_ms must be a finite number"),
    ],
)
def test_request_record_names_the_bad_value(kwargs: dict[str, object], match: str) -> None:
    base: dict[str, object] = {
        "request_id": "r",
        "run_id": "run",
        "workflow": "w",
        "arrival_ms": 10.0,
        "finish_ms": 20.0,
        "slo_ms": 50.0,
    }
    with pytest.raises(InvalidInputError, match=match):
        RequestRecord(**{**base, **kwargs})  # type: ignore[arg-type]


def test_stage_record_parts_and_checks() -> None:
    s = stage("j", "r", "w", "s", "b1", 2, 0.0, 20.0, 120.0, cold_start_ms=5.0, transfer_ms=3.0)
    assert (s.queue_ms, s.service_ms, s.exec_ms) == (20.0, 100.0, 92.0)
    with pytest.raises(InvalidInputError, match="ready_ms <= start_ms <= end_ms"):
        stage("j", "r", "w", "s", "b1", 2, 30.0, 20.0, 120.0)
    with pytest.raises(InvalidInputError, match="does not fit gpu_share"):
        replace(s, hardware="cpu")
    with pytest.raises(InvalidInputError, match="batch_size must be an int >= 1"):
        replace(s, batch_size=0)


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([], 50) is None
    assert percentile([7.0], 99) == 7.0
    assert percentile([120.0, 190.0, 220.0], 50) == 190.0
    assert percentile([120.0, 190.0, 220.0], 95) == approx(217.0)
    assert percentile([40.0, 10.0, 30.0, 20.0], 50) == 25.0
    with pytest.raises(InvalidInputError, match="q must be in"):
        percentile([1.0], 101)


# ---- summarize: the worked example -----------------------------------------------------------


def test_summarize_worked_example_overall() -> None:
    rep = summarize(*worked_example()[:4], PRICES, worked_example()[4])
    o = rep.overall
    assert (o.name, o.count, o.completed, o.failed, o.slo_met, o.at_risk) == ("all", 4, 3, 1, 2, 1)
    assert o.slo_hit_rate == 0.5
    assert (o.latency_p50_ms, o.latency_p95_ms, o.latency_p99_ms) == (190.0, approx(217.0), approx(219.4))
    # busy 0.0006 + 0.0008; idle 0.0025 + 0.0001, all of it caused by a batch (w2's lead idle time by b2)
    assert (rep.busy_cost, rep.idle_cost, rep.idle_unattributed) == (approx(0.0014), approx(0.0026), 0.0)
    assert (o.cost_total, o.cost_per_request) == (approx(0.004), approx(0.001))
    assert (o.batch_cost_total, o.batch_cost_per_request) == (approx(0.0014), approx(0.00035))
    assert (o.batches, o.mean_batch_size, o.batch_size_hist) == (2, 1.5, ((1, 1), (2, 1)))
    # decision times 1.0 and 3.0 (one not measured); expansions 4, 2, 0
    assert (o.decisions, o.decision_p50_ms, o.decision_p99_ms, o.mean_expansions) == (3, 2.0, approx(2.98), 2.0)


def test_summarize_worked_example_per_workflow_and_stage() -> None:
    rep = summarize(*worked_example()[:4], PRICES, worked_example()[4])
    x, y = rep.workflow("x"), rep.workflow("y")
    assert (x.count, x.completed, x.slo_met, x.latency_p50_ms) == (2, 2, 1, 155.0)
    # r1 and r2 each: 0.0003 of b1 plus 0.00125 of w1's idle time after it
    assert (x.cost_total, x.cost_per_request, x.batch_cost_per_request) == (
        approx(0.0031),
        approx(0.00155),
        approx(0.0003),
    )
    assert (x.batches, x.mean_batch_size, x.decisions, x.decision_p50_ms) == (1, 2.0, 2, 1.0)
    assert (y.count, y.failed, y.at_risk, y.slo_hit_rate) == (2, 1, 1, 0.5)
    # r3: b2's 0.0008 plus w2's 0.0001 warm before it
    assert (y.cost_total, y.batch_cost_total, y.decision_p50_ms, y.mean_expansions) == (
        approx(0.0009),
        approx(0.0008),
        3.0,
        2.0,
    )
    s1 = rep.stages[0]
    assert (s1.workflow, s1.stage, s1.jobs) == ("x", "s1", 2)
    assert (s1.queue_ms, s1.cold_start_ms, s1.transfer_ms, s1.exec_ms, s1.mean_batch_size) == (
        15.0,
        2.5,
        0.0,
        97.5,
        2.0,
    )
    with pytest.raises(InvalidInputError, match="no workflow 'z'"):
        rep.workflow("z")
    # per flow run, the one cost figure with its busy/idle split
    assert {run: (c.busy, c.idle, c.unit) for run, c in rep.per_run.items()} == {
        "A": (approx(0.0003), approx(0.00125), "$"),
        "B": (approx(0.0003), approx(0.00125), "$"),
        "C": (approx(0.0008), approx(0.0001), "$"),
    }
    assert sum(c.total for c in rep.per_run.values()) == approx(rep.overall.cost_total)  # every worker ran a batch


def test_separate_idle_billing_keeps_workflow_costs_to_batches() -> None:
    rep = summarize(*worked_example()[:4], PRICES, [], idle_billing="separate")
    assert rep.workflow("x").cost_total == approx(0.0006)
    assert rep.idle_unattributed == approx(0.0026)
    assert rep.overall.cost_total == approx(0.004)  # the whole bill either way


def test_to_dict_and_rows() -> None:
    rep = summarize(*worked_example()[:4], PRICES, worked_example()[4])
    d = rep.to_dict()
    assert d["overall"]["batch_size_hist"] == {"1": 1, "2": 1}
    assert set(d["workflows"]) == {"x", "y"}
    rows = rep.rows()
    assert [r["workflow"] for r in rows] == ["all", "x", "y"]
    assert rows[0]["slo_hit_rate"] == 0.5 and rows[1]["cost_per_request"] == approx(0.00155)


def test_duplicate_request_ids_are_refused() -> None:
    r = RequestRecord("r1", "A", "x", 0.0, 1.0, 10.0)
    with pytest.raises(InvalidInputError, match="duplicate request ids"):
        summarize([r, r], [], [], [], PRICES, [])


def test_grouped_attribution_equals_attribute_costs() -> None:
    # Many batches per worker (more than one attribution group), idle gaps between them; lead idle time
    # (w2's, before its first batch) and a never-used worker (w9), under the one-cost rules.
    rng = random.Random(3)
    batches, idles = [], []
    for w in range(3):
        t = 0.0
        if w == 2:
            idles.append(IdleRecord(f"w{w}", 1, 0.5, "T4", 0.0, 7.0))  # before any batch
            t = 7.0
        for b in range(150):
            n = rng.randint(1, 3)
            items = tuple(BatchItem(f"r{w}-{b}-{i}", f"run{rng.randint(0, 9)}", rng.uniform(0.5, 2)) for i in range(n))
            end = t + rng.uniform(1, 20)
            batches.append(BatchRecord(f"b{w}-{b}", f"w{w}", items, Config(n, 1, 0.5), "T4", t, end))
            t = end
            if rng.random() < 0.7:
                gap = rng.uniform(0.1, 30)
                idles.append(IdleRecord(f"w{w}", 1, 0.5, "T4", t, t + gap))
                t += gap
    idles.append(IdleRecord("w9", 1, 0.5, "T4", 0.0, 40.0))  # a worker that never ran a batch
    rng.shuffle(batches)
    never_used = 0.005 * 0.04  # 40 ms idle at half a T4's 0.01/s, no vCPU
    for split in ("equal", "input_size"):
        for billing in ("attribute", "separate"):
            ref = attribute_costs(batches, idles, PRICES, split, billing)  # type: ignore[arg-type]
            if billing == "attribute":  # w2's idle before its first batch went to that batch; w9's to the line
                assert ref.idle_unattributed == approx(never_used)
                first = min((b for b in batches if b.worker_id == "w2"), key=lambda b: b.start_ms)
                lead = 0.005 * 0.007 * split_weights(first.items, split)[0]  # type: ignore[arg-type]
                busy_only = attribute_costs(batches, [], PRICES, split, "separate")  # type: ignore[arg-type]
                item = first.items[0].request_id
                assert ref.per_request[item] - busy_only.per_request[item] >= lead * (1 - 1e-9)
            got = _attribute(batches, idles, PRICES, split, billing)  # type: ignore[arg-type]
            assert got.per_request.keys() == ref.per_request.keys()
            for k, v in ref.per_request.items():
                assert got.per_request[k] == pytest.approx(v, rel=1e-9)
            for k, v in ref.per_run.items():
                assert got.per_run[k] == pytest.approx(v, rel=1e-9)
            assert (got.busy_total, got.idle_total, got.idle_unattributed) == (
                pytest.approx(ref.busy_total, rel=1e-12),
                pytest.approx(ref.idle_total, rel=1e-12),
                pytest.approx(ref.idle_unattributed, rel=1e-12),
            )


# ---- windows and conformance ------------------------------------------------------------------


def test_after_warmup_keeps_the_window() -> None:
    requests, stages, batches, idles, _ = worked_example()
    w = after_warmup(requests, stages, batches, idles, 30.0)
    assert [r.request_id for r in w.requests] == ["r3", "r4"]
    assert [s.job_id for s in w.stages] == ["r3:t"]
    assert [b.batch_id for b in w.batches] == ["b2"]  # b1 was dispatched at 20 ms
    # w1's idle from 120 ms stays; w2's idle 0-50 ms is cut to 30-50 ms
    assert [(i.worker_id, i.start_ms, i.end_ms) for i in w.idles] == [("w1", 120.0, 620.0), ("w2", 30.0, 50.0)]


def test_a_snapshots_queue_depths_are_its_non_empty_queues_by_name() -> None:
    snap = PoolSnapshot((), (), (), (), {}, (), queues={QueueKey("w", "a"): 3, QueueKey("w", "b"): 0})
    assert snap.queue_depths == {"w/a": 3}
    assert PoolSnapshot((), (), (), (), {}, ()).queue_depths == {}
