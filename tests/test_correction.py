"""Online correction of the latency profile: the estimator, the rescaled profile, and the pool following a slowdown."""

from __future__ import annotations

import math

import pytest

from esg_prefect.control.calls import StageCall, WorkflowDecl
from esg_prefect.exceptions import ConfigError, ProfileError
from esg_prefect.model import Config, LatencyProfile, PriceSheet, ProfilePoint
from esg_prefect.model.correction import MAX_FACTOR, LatencyCorrection
from esg_prefect.runtime.pool import Pool
from esg_prefect.runtime.workers import InlineBackend
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
