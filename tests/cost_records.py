"""A worked cost example as the pool would hand it to run listeners, for the store, artifact and CLI tests.

Prices: a vCPU-second costs 0.5, a whole T4-second 4.0. T0 is 2024-05-01T00:00:00Z.
A busy worker pays for its vCPUs and GPU share; an idle one for its GPU share only
(it holds no vCPU), plus its vCPUs during a pre-warm load at the interval's start.

=====  ========  ==========  ==========================================  ===========================
batch  worker    resources   items (run)                                 time, cost
=====  ========  ==========  ==========================================  ===========================
b1     w1        1 vCPU,     A (size 1), B (size 3)                      T0+100..500 ms: 2.5/s x 0.4 s = 1.0
                 0.5 T4
b2     w2        2 vCPU,     A                                           T0+500..700: 2.0/s x 0.2 = 0.4
                 0.25 T4
b3     w3        1 vCPU cpu  C                                           T0+1d+10..110: 0.5/s x 0.1 = 0.05
=====  ========  ==========  ==========================================  ===========================

Idle, at the GPU share's price: w1 T0+500..1750 (0.5 T4: 2.0/s x 1.25 s = 2.5), w2 T0+700..900
(0.25 T4: 1.0/s x 0.2 s = 0.2), w4 (1 vCPU, 0.25 T4) T0+1d..+1000, pre-warmed and never ran a
batch: its first 200 ms were its load, which held its vCPU too (1.0/s x 1 s + 0.5/s x 0.2 s = 1.1).

Equal split, idle attributed: A = 0.5 + 0.4 + 1.25 + 0.2 = 2.35; B = 0.5 + 1.25 = 1.75;
C = 0.05; idle line 1.1 (w4 never ran a batch); total 5.25 = busy 1.45 + idle 3.8, every
worker second at its price.

Run A (workflow img, deployment nightly) arrives at T0, ends at T0+700: SLO 1000 met.
Run B (img, no deployment) arrives at T0+50, ends at T0+500: SLO 300 missed by 150.
Run C (txt, nightly) arrives at T0+1d: one call fails, so it never finishes.
"""

from __future__ import annotations

from esg_prefect.control.calls import StageResult
from esg_prefect.control.records import CallRecord, RunRecords
from esg_prefect.model import LatencyProfile, ProfilePoint
from esg_prefect.model.attribution import BatchItem, BatchRecord, IdleRecord
from esg_prefect.model.cluster import Device
from esg_prefect.model.config import Config
from esg_prefect.model.pricing import PriceSheet
from esg_prefect.runtime.workers import InlineBackend
from tests.toy_stages import toy_profile

PRICES = PriceSheet(0.5, {"T4": 4.0})
T0 = 1714521600000.0  # 2024-05-01T00:00:00Z
DAY = 86_400_000.0
RUN_A = "9b6f0c1e-4a1d-4f7e-9a51-0c1d2e3f4a5b"
RUN_B = "1f2e3d4c-5b6a-4798-8a7b-6c5d4e3f2a1b"
RUN_C = "c0ffee00-1234-4abc-8def-0123456789ab"
DEPLOYMENTS = {RUN_A: "nightly", RUN_B: None, RUN_C: "nightly"}
REASON_WARM = "cheapest plan within the slack over 2 stage(s) (warm worker)"
REASON_COLD = "cheapest plan within the slack over 1 stage(s) (cold start, best fit)"

B1 = BatchRecord(
    "b1",
    "w1",
    (BatchItem(RUN_A, RUN_A, 1.0), BatchItem(RUN_B, RUN_B, 3.0)),
    Config(2, 1, 0.5),
    "T4",
    T0 + 100,
    T0 + 500,
)
B2 = BatchRecord("b2", "w2", (BatchItem(RUN_A, RUN_A, 1.0),), Config(1, 2, 0.25), "T4", T0 + 500, T0 + 700)
B3 = BatchRecord("b3", "w3", (BatchItem(RUN_C, RUN_C, 1.0),), Config(1, 1, 0.0), "cpu", T0 + DAY + 10, T0 + DAY + 110)
IDLE_W1 = IdleRecord("w1", 1, 0.5, "T4", T0 + 500, T0 + 1750)
IDLE_W2 = IdleRecord("w2", 2, 0.25, "T4", T0 + 700, T0 + 900)
IDLE_W4 = IdleRecord("w4", 1, 0.25, "T4", T0 + DAY, T0 + DAY + 1000, loading_ms=200.0)


def result(call_id: str, b: BatchRecord, wait: float, predicted: float, cold: bool, reason: str) -> StageResult:
    """The StageResult the pool gives a call that ran in batch ``b``."""
    return StageResult(
        call_id,
        None,
        b.batch_id,
        len(b.items),
        b.worker_id,
        b.hardware,
        b.config.vcpus,
        b.config.gpu_share,
        wait,
        predicted,
        b.end_ms - b.start_ms,
        cold,
        False,
        reason,
        len({i.run_id for i in b.items}),
    )


def call(
    call_id: str, run: str, workflow: str, stage: str, b: BatchRecord | None, res: StageResult | None
) -> CallRecord:
    """A finished call; a failed one (no batch) gets an error."""
    if b is None:
        return CallRecord(call_id, run, run, workflow, stage, T0 + DAY, T0 + DAY, T0 + DAY + 5, False, None, "boom")
    ready = b.start_ms - (res.queue_wait_ms if res else 0.0)
    return CallRecord(call_id, run, run, workflow, stage, ready, b.start_ms, b.end_ms, True, res)


def records_a() -> RunRecords:
    """Run A: detect in b1 (shared with B), classify in b2; SLO met."""
    calls = (
        call("a-detect", RUN_A, "img", "detect", B1, result("a-detect", B1, 100.0, 380.0, False, REASON_WARM)),
        call("a-classify", RUN_A, "img", "classify", B2, result("a-classify", B2, 0.0, 190.0, True, REASON_COLD)),
    )
    return RunRecords(RUN_A, "img", calls, (B1, B2), T0, T0 + 700, 1000.0, PRICES, "equal", ())


def records_b() -> RunRecords:
    """Run B: detect in b1; SLO missed by 150 ms; hands over the idle time of w1 and w2."""
    calls = (call("b-detect", RUN_B, "img", "detect", B1, result("b-detect", B1, 50.0, 380.0, False, REASON_WARM)),)
    return RunRecords(RUN_B, "img", calls, (B1,), T0 + 50, T0 + 500, 300.0, PRICES, "equal", (IDLE_W1, IDLE_W2))


def records_c() -> RunRecords:
    """Run C: embed in b3, and a failed embed call; never finishes; hands over w4's idle time."""
    calls = (
        call("c-embed", RUN_C, "txt", "embed", B3, result("c-embed", B3, 0.0, 90.0, True, REASON_COLD)),
        call("c-embed-2", RUN_C, "txt", "embed", None, None),
    )
    return RunRecords(RUN_C, "txt", calls, (B3,), T0 + DAY, None, 500.0, PRICES, "equal", (IDLE_W4,))


def settled(rec: RunRecords) -> RunRecords:
    """A run's records as the publisher posts them once its cost is final: with the idle time its batches caused."""
    import dataclasses

    ids = {b.batch_id for b in rec.batches}
    caused = tuple(i for b, i in ((B1, IDLE_W1), (B2, IDLE_W2)) if b.batch_id in ids)
    return dataclasses.replace(rec, caused_idles=caused, settled=True)


def all_records() -> list[RunRecords]:
    """A, B, C in the order their runs end."""
    return [records_a(), records_b(), records_c()]


EXPECTED_PER_RUN = {RUN_A: 2.35, RUN_B: 1.75, RUN_C: 0.05}
EXPECTED_IDLE_LINE = 1.1
EXPECTED_TOTAL = 5.25


def renamed(rec: RunRecords, run_id: str) -> RunRecords:
    """The same records for another run id (a real flow run's), in its calls and batch items too."""
    import dataclasses

    def item(i: BatchItem) -> BatchItem:
        return BatchItem(run_id, run_id, i.input_size) if i.run_id == rec.run_id else i

    calls = tuple(dataclasses.replace(c, run_id=run_id, request_id=run_id) for c in rec.calls)
    batches = tuple(dataclasses.replace(b, items=tuple(item(i) for i in b.items)) for b in rec.batches)
    return dataclasses.replace(rec, run_id=run_id, calls=calls, batches=batches)


# ---- a real pool whose idle workers cost something ---------------------------------------------

T4_PRICES = PriceSheet(1e-5, {"T4": 1e-4})
"""Prices for :class:`T4InlineBackend` pools: an idle worker pays for its share of the T4 (it holds no vCPU)."""


class T4InlineBackend(InlineBackend):
    """Inline workers on a node that reports one T4 (the stages still run on the CPU, as the toy stages do).

    With :func:`t4_toy_profile` the pool places the toy stages on shares of the T4,
    so their warm idle time has a price: a CPU-only worker's idle time costs nothing.
    """

    def devices(self) -> tuple[Device, ...]:
        node = self.nodes()[0].name
        return (Device(f"{node}/gpu0", node, "T4"),)


def t4_toy_profile() -> LatencyProfile:
    """The toy stages' latencies (``tests.toy_stages.toy_profile``) on a quarter or half of a T4; no CPU-only point."""
    toy = toy_profile()
    points = [
        ProfilePoint(p.stage, "T4", p.batch, p.vcpus, share, p.mean_ms, p.p95_ms)
        for p in toy.points
        for share in (0.25, 0.5)
    ]
    return LatencyProfile(points, {(s, "T4"): toy.cold_start_ms(s, "cpu") for s in toy.stages()})
