"""Online correction of the latency profile: the estimator, the rescaled profile, and the pool following a slowdown."""

from __future__ import annotations

import math

import pytest

import esg_prefect.runtime.clock as clock_module
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


def test_pool_predictions_follow_an_injected_2x_slowdown(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stage runs at its profiled speed, then 2x slower: the pool's predictions follow it.

    Batches take their time on a controllable clock (the stage advances it instead of sleeping),
    so what the pool measures does not depend on the machine's load.
    """
    clock = FakeClock()
    monkeypatch.setattr(clock_module, "wall_ms", clock.now)
    monkeypatch.setitem(LAG, "factor", 1.0)
    monkeypatch.setitem(LAG, "clock", clock)
    settings = ESGSettings(wait_for_batch=False, reserve_overhead=False)
    pool = Pool(lagging_profile(), PriceSheet(1e-5, {}), settings=settings, backend=InlineBackend(vcpus=2))
    pool.planner.replan_every_ms = 0.0
    try:
        before = [pool.submit(_call(i)).result(30) for i in range(6)]  # one at a time: batches of 1
        LAG["factor"] = 2.0
        after = [pool.submit(_call(100 + i)).result(30) for i in range(14)]
        snap = pool.snapshot()
    finally:
        pool.close()
    # Every call ran alone; its plan used the p95 of the profile on the worker's vCPUs (p95 = mean here).
    assert {r.batch_size for r in before + after} == {1}
    base = lagging_ms(1)
    # At profiled speed the factor stays near 1 (sleeps overshoot a little, the pool adds its hop).
    assert before[-1].predicted_ms == pytest.approx(base, rel=0.35)
    # After the 2x step the factor and the predictions converge to about 2x the profile.
    (row,) = [c for c in snap.corrections if c.stage == "lagging"]
    assert row.batches == 20
    assert 1.7 <= row.factor <= 2.6
    assert 1.7 * base <= after[-1].predicted_ms <= 2.6 * base
    assert after[-1].predicted_ms > 1.5 * after[0].predicted_ms
    # The prediction now matches what the batches take.
    assert after[-1].actual_ms == pytest.approx(after[-1].predicted_ms, rel=0.35)


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
