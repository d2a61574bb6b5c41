"""Online correction of the latency profile: the estimator, the rescaled profile, and the pool following a slowdown.

And the per-batch overhead learned beside the factor: from synthetic (predicted, own, round trip) times, so
that nothing here depends on the machine's speed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
from typing import Any

import pytest

from esg_prefect.control.calls import StageCall, WorkflowDecl
from esg_prefect.exceptions import ConfigError, ProfileError
from esg_prefect.model import Config, LatencyProfile, PriceSheet, ProfilePoint
from esg_prefect.model.correction import MAX_FACTOR, MAX_OVERHEAD_MS, LatencyCorrection
from esg_prefect.model.jobs import Job, QueueKey
from esg_prefect.model.size_model import SizeModel, SizeSample
from esg_prefect.runtime.execution import Pending, execute
from esg_prefect.runtime.planner import Planner
from esg_prefect.runtime.pool import Pool
from esg_prefect.runtime.workers import BatchOutcome, InlineBackend, WorkerSpec
from esg_prefect.scheduling import ESGSettings
from tests.toy_stages import LAG, FakeClock, lagging_ms, lagging_profile

DRIFT = WorkflowDecl("drift", 5_000, ())


def test_a_2x_step_is_tracked_within_10_percent_after_7_batches() -> None:
    corr = LatencyCorrection(alpha=0.25)
    for _ in range(20):
        corr.observe("enc", "cpu", 10.0, 10.0)
    assert corr.factor("enc", "cpu") == pytest.approx(1.0)
    factors = [corr.observe("enc", "cpu", 10.0, 20.0) for _ in range(7)]
    assert factors == sorted(factors)  # moves monotonically towards the new level
    assert factors[5] < 2.0 / 1.1 < factors[6] <= 2.0
    assert corr.observations("enc", "cpu") == 27


def test_slowdowns_and_speedups_are_symmetric_and_per_stage_and_hardware() -> None:
    corr = LatencyCorrection(alpha=0.5)
    for _ in range(30):
        corr.observe("a", "cpu", 10.0, 30.0)
        corr.observe("a", "T4", 30.0, 10.0)
    assert corr.factor("a", "cpu") == pytest.approx(3.0, rel=1e-6)
    assert corr.factor("a", "T4") == pytest.approx(1 / 3.0, rel=1e-6)
    assert corr.factor("b", "cpu") == 1.0 and corr.observations("b", "cpu") == 0


def test_factors_are_bounded_and_one_outlier_moves_little() -> None:
    corr = LatencyCorrection(alpha=1.0)
    corr.observe("a", "cpu", 1.0, 1000.0)  # one step is clamped to 8x, the factor to MAX_FACTOR
    assert corr.factor("a", "cpu") == pytest.approx(MAX_FACTOR)
    slow = LatencyCorrection(alpha=0.25)
    slow.observe("a", "cpu", 10.0, 10_000.0)  # a stalled batch: 8x at most, weighted by alpha
    assert slow.factor("a", "cpu") == pytest.approx(8.0**0.25)


@pytest.mark.parametrize("pred,actual", [(0.0, 5.0), (5.0, -1.0), (math.nan, 5.0), (5.0, math.inf)])
def test_meaningless_times_are_ignored(pred: float, actual: float) -> None:
    corr = LatencyCorrection()
    assert corr.observe("a", "cpu", pred, actual) == 1.0
    assert corr.observations("a", "cpu") == 0


@pytest.mark.parametrize("alpha", [0.0, -0.1, 1.5, "0.2"])
def test_bad_alpha_is_named(alpha: object) -> None:
    with pytest.raises(ConfigError, match="alpha"):
        LatencyCorrection(alpha)  # type: ignore[arg-type]


def test_drift_compares_learned_with_applied_factors() -> None:
    corr = LatencyCorrection(alpha=1.0)
    corr.observe("a", "cpu", 10.0, 10.5)
    assert not corr.drifted({})  # 5 % off the profile: within the 10 % tolerance
    corr.observe("a", "cpu", 10.0, 13.0)
    assert corr.drifted({}) and not corr.drifted({("a", "cpu"): 1.25})


def test_scaled_profile_multiplies_one_stage_and_keeps_cold_starts() -> None:
    prof = LatencyProfile(
        [
            ProfilePoint("a", "cpu", 1, 1, 0.0, 10.0, 12.0),
            ProfilePoint("a", "cpu", 4, 1, 0.0, 20.0, None),
            ProfilePoint("b", "cpu", 1, 1, 0.0, 5.0, 6.0),
        ],
        {("a", "cpu"): 100.0},
    )
    scaled = prof.scaled({("a", "cpu"): 2.0})
    assert scaled.latency_ms("a", Config(1, 1, 0.0), "cpu") == 24.0
    assert scaled.latency_ms("a", Config(2, 1, 0.0), "cpu", "mean") == pytest.approx(2 * 40.0 / 3)
    assert scaled.latency_ms("b", Config(1, 1, 0.0), "cpu") == 6.0
    assert scaled.cold_start_ms("a", "cpu") == 100.0
    assert prof.latency_ms("a", Config(1, 1, 0.0), "cpu") == 12.0  # the original is untouched
    with pytest.raises(ProfileError, match="-1"):
        prof.scaled({("a", "cpu"): -1.0})


def _call(i: int) -> StageCall:
    return StageCall(
        call_id=f"lag-{i}",
        stage="lagging",
        stage_path="tests.toy_stages:lagging",
        workflow=DRIFT,
        request_id=f"r{i}",
        run_id=f"r{i}",
        item=i,
    )


def expected_predictions(factors: list[float], alpha: float, cold_ms: float) -> tuple[list[float], float, float]:
    """What the pool must predict for calls run one at a time at ``factors`` x the profile, by the documented rule.

    The correction is an EWMA (weight ``alpha``) of ``ln(actual / profiled)``; the pool re-plans
    with the learned factor whenever it is more than 10 % off the one planned with
    (``Planner.replan_every_ms`` is 0 here). A call's prediction is the profile times the factor
    planned with when it was dispatched, plus the cold start for the first call (a new worker).
    Returns the predictions, the learned factor and the factor planned with at the end.
    """
    g = planned = 0.0
    preds = []
    for i, f in enumerate(factors):
        preds.append(lagging_ms(1) * math.exp(planned) + (cold_ms if i == 0 else 0.0))
        g = (1 - alpha) * g + alpha * math.log(f)
        if abs(g - planned) > math.log1p(0.1):
            planned = g
    return preds, math.exp(g), math.exp(planned)


def test_pool_predictions_follow_an_injected_2x_slowdown(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stage runs at its profiled speed, then 2x slower: the pool's predictions follow it, exactly.

    The pool runs on a :class:`~tests.toy_stages.FakeClock` that only the stage moves (by its
    injected time, instead of sleeping), so every number below is exact whatever the machine's load.
    """
    clock = FakeClock()
    monkeypatch.setitem(LAG, "factor", 1.0)
    monkeypatch.setitem(LAG, "clock", clock)
    settings = ESGSettings(wait_for_batch=False, reserve_overhead=False)
    profile = lagging_profile()
    pool = Pool(profile, PriceSheet(1e-5, {}), settings=settings, backend=InlineBackend(vcpus=2), clock=clock)
    pool.planner.replan_every_ms = 0.0
    try:
        before = [pool.submit(_call(i)).result(60) for i in range(6)]  # one at a time: batches of 1
        LAG["factor"] = 2.0
        after = [pool.submit(_call(100 + i)).result(60) for i in range(14)]
        snap = pool.snapshot()
    finally:
        pool.close()
    results = before + after
    # Every call ran alone, on the one worker the first call started (no time passes between calls,
    # so it never idles out); its plan used the profile's p95 (= mean here) times the factor in use.
    assert {r.batch_size for r in results} == {1}
    assert {r.worker_id for r in results} == {results[0].worker_id}
    assert [r.cold_start for r in results] == [True] + [False] * 19
    base = lagging_ms(1)
    assert [r.actual_ms for r in results] == [base] * 6 + [2 * base] * 14
    cold = profile.cold_start_ms("lagging", "cpu")
    preds, learned, planned = expected_predictions([1.0] * 6 + [2.0] * 14, settings.correction_alpha, cold)
    assert [r.predicted_ms for r in results] == pytest.approx(preds, rel=1e-9)
    # At profiled speed the prediction is the profile's; after the 2x step it climbs towards 2x.
    assert before[-1].predicted_ms == pytest.approx(base, rel=1e-9)
    assert 1.85 * base < after[-1].predicted_ms < 2 * base
    (row,) = [c for c in snap.corrections if c.stage == "lagging"]
    assert row.batches == 20
    assert row.factor == pytest.approx(learned, abs=1e-4) and 1.95 < row.factor < 2.0
    assert row.applied == pytest.approx(planned, abs=1e-4)


def test_correction_can_be_turned_off() -> None:
    off = ESGSettings(correction_alpha=0.0)
    pool = Pool(lagging_profile(), PriceSheet(1e-5, {}), settings=off, backend=InlineBackend())
    try:
        assert pool.correction is None
        pool.submit(_call(1)).result(30)
        assert pool.snapshot().corrections == ()
    finally:
        pool.close()
    with pytest.raises(ConfigError, match="correction_alpha"):
        ESGSettings(correction_alpha=1.5)


# ---- the per-batch overhead ------------------------------------------------------------------------


def _tiny_profile() -> LatencyProfile:
    """A sub-millisecond stage (0.5 ms a batch of 1) and a 10 ms one (25 ms a batch of 4)."""
    return LatencyProfile(
        [
            ProfilePoint("tiny", "cpu", 1, 1, 0.0, 0.5, 0.5),
            ProfilePoint("m", "cpu", 1, 1, 0.0, 10.0, 10.0),
            ProfilePoint("m", "cpu", 4, 1, 0.0, 25.0, 25.0),
        ],
        {("tiny", "cpu"): 5.0, ("m", "cpu"): 50.0},
    )


def _planned(corr: LatencyCorrection, stage: str, batch: int) -> float:
    scaled = _tiny_profile().scaled(corr.factors(), corr.overheads())
    return scaled.latency_ms(stage, Config(batch, 1, 0.0), "cpu", "mean")


def test_a_tiny_stage_with_an_overhead_is_predicted_where_a_factor_alone_is_capped() -> None:
    """0.5 ms of model and 5 ms of round trip beyond it: the split predicts 5.5 ms; a factor stops at 4x 0.5."""
    split, factor_only = LatencyCorrection(), LatencyCorrection()
    for _ in range(15):
        split.observe("tiny", "cpu", 0.5, 5.5, own_ms=0.5)
        factor_only.observe("tiny", "cpu", 0.5, 5.5)
    assert split.factor("tiny", "cpu") == 1.0  # the model runs at its profiled speed
    assert split.overhead_ms("tiny", "cpu") == pytest.approx(5.0, rel=0.02)
    assert _planned(split, "tiny", 1) == pytest.approx(5.5, rel=0.03)
    assert factor_only.factor("tiny", "cpu") == pytest.approx(MAX_FACTOR)
    assert _planned(factor_only, "tiny", 1) == pytest.approx(2.0)  # under-predicts every batch by 2.75x
    assert factor_only.overhead_ms("tiny", "cpu") == 0.0


def test_a_per_batch_overhead_is_right_at_every_batch_size_where_one_factor_cannot_be() -> None:
    """A model 1.2x slower than profiled, plus 5 ms a batch, observed at batches of 1 and 4."""
    split, factor_only = LatencyCorrection(), LatencyCorrection()
    for _ in range(20):
        for profiled in (10.0, 25.0):
            own = 1.2 * profiled
            split.observe("m", "cpu", profiled, own + 5.0, own_ms=own)
            factor_only.observe("m", "cpu", profiled, own + 5.0)
    assert split.factor("m", "cpu") == pytest.approx(1.2, rel=1e-4)
    for batch, truth in ((1, 17.0), (2, 1.2 * 15.0 + 5.0), (4, 35.0)):
        assert _planned(split, "m", batch) == pytest.approx(truth, rel=0.01)
    # One factor between 1.7x (batch 1) and 1.4x (batch 4): small batches look faster than they are,
    # big ones slower, which pushes the scheduler to smaller batches.
    assert _planned(factor_only, "m", 1) < 0.95 * 17.0
    assert _planned(factor_only, "m", 4) > 1.05 * 35.0


def test_scaled_profile_adds_the_overhead_to_mean_and_p95() -> None:
    prof = LatencyProfile(
        [
            ProfilePoint("a", "cpu", 1, 1, 0.0, 10.0, 12.0),
            ProfilePoint("a", "cpu", 4, 1, 0.0, 20.0, None),
            ProfilePoint("b", "cpu", 1, 1, 0.0, 5.0, 6.0),
        ],
        {("a", "cpu"): 100.0},
    )
    scaled = prof.scaled({("a", "cpu"): 2.0}, {("a", "cpu"): 3.0, ("b", "cpu"): 1.0})
    assert scaled.latency_ms("a", Config(1, 1, 0.0), "cpu") == 27.0  # p95 12 x 2 + 3
    assert scaled.latency_ms("a", Config(1, 1, 0.0), "cpu", "mean") == 23.0
    assert scaled.latency_ms("a", Config(2, 1, 0.0), "cpu", "mean") == pytest.approx(2 * 40.0 / 3 + 3.0)
    assert scaled.latency_ms("a", Config(4, 1, 0.0), "cpu") == 43.0  # no p95 measured: the mean's
    assert scaled.latency_ms("b", Config(1, 1, 0.0), "cpu") == 7.0  # an overhead without a factor
    assert scaled.cold_start_ms("a", "cpu") == 100.0
    assert prof.scaled({}, {}).points == prof.points
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ProfileError, match="overhead"):
            prof.scaled({}, {("a", "cpu"): bad})


def test_an_overhead_re_plans_when_it_moves_a_typical_batch_by_10_percent_and_half_a_millisecond() -> None:
    corr = LatencyCorrection(alpha=1.0)
    corr.observe("a", "cpu", 10.0, 10.3, own_ms=10.0)
    assert not corr.drifted({})  # 0.3 ms: under the 0.5 ms floor
    corr.observe("a", "cpu", 10.0, 11.5, own_ms=10.0)
    assert corr.drifted({})  # 1.5 ms on a 10 ms batch
    assert not corr.drifted({}, overheads={("a", "cpu"): 1.5})
    assert not corr.drifted({}, overheads={("a", "cpu"): 0.8})  # 0.7 ms off, under 10 % of 10.8 ms
    assert corr.drifted({("a", "cpu"): 1.0}, overheads={("a", "cpu"): 0.2})  # 1.3 ms off
    big = LatencyCorrection(alpha=1.0)
    big.observe("big", "cpu", 500.0, 503.0, own_ms=500.0)
    assert big.overhead_ms("big", "cpu") == 3.0 and not big.drifted({})  # 3 ms beside 500: no new plan
    tiny = LatencyCorrection(alpha=1.0)
    tiny.observe("tiny", "cpu", 0.5, 1.2, own_ms=0.5)
    assert tiny.drifted({})  # 0.7 ms beside 0.5: a new plan


@pytest.mark.parametrize("own", [0.0, -1.0, math.nan, math.inf])
def test_meaningless_own_times_are_ignored(own: float) -> None:
    corr = LatencyCorrection()
    assert corr.observe("a", "cpu", 10.0, 15.0, own_ms=own) == 1.0
    assert corr.observations("a", "cpu") == 0 and corr.overhead_ms("a", "cpu") == 0.0


def test_overheads_are_clamped_and_never_negative() -> None:
    corr = LatencyCorrection(alpha=1.0)
    corr.observe("a", "cpu", 10.0, 10_000.0, own_ms=10.0)  # a stalled round trip counts MAX_OVERHEAD_MS at most
    assert corr.overhead_ms("a", "cpu") == MAX_OVERHEAD_MS and corr.factor("a", "cpu") == 1.0
    corr.observe("a", "cpu", 10.0, 9.0, own_ms=10.0)  # clocks that disagree: no negative overhead
    assert corr.overhead_ms("a", "cpu") == 0.0 and corr.factor("a", "cpu") == 1.0
    unsplit = LatencyCorrection()
    unsplit.observe("a", "cpu", 10.0, 20.0)  # no own time: an in-process worker, the overhead stays 0
    assert unsplit.overhead_ms("a", "cpu") == 0.0 and unsplit.factor("a", "cpu") > 1.0


def test_the_planner_plans_with_the_learned_overhead_and_shows_it() -> None:
    planner = Planner(_tiny_profile(), PriceSheet(1e-5, {}), ESGSettings(), "esg", None)
    planner.replan_every_ms = 0.0
    replans = [planner.correct("tiny", "cpu", 1, 0.0, [1.0], 5.5, float(t), own_ms=0.5) for t in range(20)]
    assert replans[0] and any(replans[1:])
    (row,) = planner.corrections()
    assert (row.stage, row.factor, row.applied, row.batches) == ("tiny", 1.0, 1.0, 20)
    assert row.overhead_ms == pytest.approx(5.0, rel=0.01)
    # It plans with the overhead applied at its last re-plan: within the drift tolerance of the learned one.
    applied = planner.applied_overheads[("tiny", "cpu")]
    assert abs(applied - row.overhead_ms) <= max(0.5, 0.1 * (0.5 + applied))
    planned = planner.profile.latency_ms("tiny", Config(1, 1, 0.0), "cpu")
    assert planned == pytest.approx(0.5 + applied) and planned == pytest.approx(5.5, rel=0.1)
    assert planner.profile.cold_start_ms("tiny", "cpu") == 5.0


def test_a_batch_of_large_items_run_as_profiled_corrects_nothing_when_the_profile_has_an_overhead() -> None:
    """A profile of 12 ms per typical (100-word) item plus 6 ms a batch; truth 2 ms per item + 0.1 ms per word.

    One 300-word item runs 32/12 as long as a typical one: 12 x 32/12 + 6 = 38 ms, as the planner plans it
    (``LatencyProfile.latency_ms``: only the table scales). The former prediction scaled the overhead too,
    (12 + 6) x 32/12 = 48 ms, so batches that ran exactly as planned read as a 0.79x speed-up and re-planned.
    """
    samples = [
        SizeSample("enc", "cpu", b, 1, 0.0, b * z, 2.0 * b + 0.1 * b * z) for b in (1, 2, 4) for z in (50, 100, 150)
    ]
    prof = LatencyProfile(
        [ProfilePoint("enc", "cpu", b, 1, 0.0, 12.0 * b) for b in (1, 2, 4)],
        sizes=SizeModel.fit(samples),
        overheads={("enc", "cpu"): 6.0},
    )
    cfg = Config(1, 1, 0.0)
    size = prof.size_factor("enc", cfg, "cpu", [300.0])
    assert size == pytest.approx(32.0 / 12.0)
    planned = prof.latency_ms("enc", cfg, "cpu", "mean", size)
    assert planned == pytest.approx(38.0)
    planner = Planner(prof, PriceSheet(1e-5, {}), ESGSettings(correction_alpha=0.25), "esg", None)
    planner.replan_every_ms = 0.0
    replans = [planner.correct("enc", "cpu", 1, 0.0, [300.0], planned, float(t)) for t in range(10)]
    assert not any(replans) and planner.applied == {}
    assert planner.correction is not None and planner.correction.factor("enc", "cpu") == pytest.approx(1.0)


def test_an_in_process_pool_learns_no_overhead() -> None:
    """On the inline backend the round trip is the model's time: the fake clock's, which the stage moves.

    Its own ``elapsed_ms`` is the real (near zero) time of a stage that does not sleep: were the round
    trip split there, the overhead would be the whole batch.
    """
    clock = FakeClock()
    LAG["clock"], LAG["factor"] = clock, 1.0
    settings = ESGSettings(wait_for_batch=False, reserve_overhead=False)
    pool = Pool(lagging_profile(), PriceSheet(1e-5, {}), settings=settings, backend=InlineBackend(vcpus=2), clock=clock)
    pool.planner.replan_every_ms = 0.0
    try:
        results = [pool.submit(_call(i)).result(60) for i in range(4)]
        snap = pool.snapshot()
    finally:
        pool.close()
        LAG["clock"] = None
    assert [r.actual_ms for r in results] == [lagging_ms(1)] * 4
    (row,) = [c for c in snap.corrections if c.stage == "lagging"]
    assert row.overhead_ms == 0.0 and row.factor == pytest.approx(1.0) and row.batches == 4
    assert pool.planner.applied_overheads == {}


class _Remote:
    """A worker in another process: its batch takes 2 ms of its own time and 7 ms of the test's clock."""

    spec = WorkerSpec("w", "tests.toy_stages:inc", "local", None, "cpu", 1, 0.0)
    load_ms, enforcement, load_lines, out_of_process = 0.0, "fake", (), True

    def __init__(self, now: list[float]) -> None:
        self.now = now

    async def execute(self, items: list[Any]) -> BatchOutcome:
        self.now[0] += 7.0
        return BatchOutcome(True, [x + 1 for x in items], 2.0)

    async def stop(self) -> None:
        return None


@pytest.mark.parametrize("out_of_process", [True, False])
def test_a_batch_reports_its_workers_own_time_only_across_a_process_boundary(out_of_process: bool) -> None:
    now = [0.0]
    handle = _Remote(now)
    handle.out_of_process = out_of_process
    seen: list[tuple[list[int], float, float | None]] = []

    def measured(idx: list[int], ms: float, own: float | None) -> None:
        seen.append((idx, ms, own))

    job = Job("c", "r", "r", QueueKey("drift", "inc"), 0.0, 0.0, 1e9, 1e9)
    pendings = [Pending(_call(i), concurrent.futures.Future(), job) for i in range(3)]
    out = asyncio.run(execute(InlineBackend(), handle, handle.spec, pendings, lambda: now[0], measured))
    assert [out.results[i][0] for i in range(3)] == [1, 2, 3]
    assert seen == [([0, 1, 2], 7.0, 2.0 if out_of_process else None)]


def test_only_process_and_ray_workers_cross_a_process_boundary() -> None:
    from esg_prefect.runtime.ray_backend import _RayWorker
    from esg_prefect.runtime.workers import _InlineWorker, _LocalWorker

    assert _LocalWorker.out_of_process and _RayWorker.out_of_process and not _InlineWorker.out_of_process
