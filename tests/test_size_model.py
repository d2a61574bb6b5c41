"""The Cypress input-size model: exact recovery of known lines, fallbacks, errors, held-out comparison."""

from __future__ import annotations

import random

import pytest

from esg_prefect.exceptions import MissingProfileError, ProfileError
from esg_prefect.model.size_model import MIN_LATENCY_MS, SizeModel, SizeSample, fit_one, holdout_errors


def line(a: float, b: float, c: float, rng: random.Random, n: int = 40, noise: float = 0.0) -> list[SizeSample]:
    """Samples of ``a + b * batch + c * total_size`` (times 1 + noise) with varied item sizes."""
    out = []
    for _ in range(n):
        batch = rng.choice((1, 2, 4, 8))
        total = sum(rng.randint(5, 120) for _ in range(batch))
        ms = (a + b * batch + c * total) * (1 + rng.uniform(-noise, noise))
        out.append(SizeSample("enc", "cpu", batch, 1, 0.0, total, ms))
    return out


def test_recovers_an_exact_line() -> None:
    fit = fit_one(line(2.0, 0.5, 0.1, random.Random(0)))
    assert fit.uses_size
    assert dict(fit.intercepts_ms) == pytest.approx({b: 2.0 + 0.5 * b for b in (1, 2, 4, 8)}, rel=1e-9)
    assert fit.per_size_ms == pytest.approx(0.1, rel=1e-9)
    assert fit.intercept_ms(3) == pytest.approx(3.5)  # between measured sizes: linear
    assert fit.intercept_ms(16) == pytest.approx(10.0)  # beyond: the last two sizes' line
    assert fit.r2 == pytest.approx(1.0)
    assert fit.samples == 40
    assert fit.predict(3, 100.0) == pytest.approx(2.0 + 1.5 + 10.0)


def test_constant_item_size_falls_back_to_the_count_model() -> None:
    # every item the same size: total_size = 50 * batch carries nothing of its own
    samples = [SizeSample("det", "cpu", b, 1, 0.0, 50.0 * b, 3.0 + 7.0 * b) for b in (1, 2, 4, 8) for _ in range(3)]
    fit = fit_one(samples)
    assert not fit.uses_size and fit.per_size_ms == 0.0
    assert dict(fit.intercepts_ms) == pytest.approx({1: 10.0, 2: 17.0, 4: 31.0, 8: 59.0})


def test_one_batch_size_fits_size_only() -> None:
    samples = [SizeSample("enc", "cpu", 4, 2, 0.0, z, 1.0 + 0.2 * z) for z in (40, 80, 120, 200)]
    fit = fit_one(samples)
    assert fit.uses_size and len(fit.intercepts_ms) == 1
    assert fit.intercepts_ms[0] == pytest.approx((4, 1.0))
    assert fit.per_size_ms == pytest.approx(0.2)


def test_identical_samples_give_their_mean() -> None:
    fit = fit_one([SizeSample("x", "cpu", 2, 1, 0.0, 10.0, 5.0)] * 3)
    assert fit.predict(2, 10.0) == pytest.approx(5.0)
    assert fit.r2 == 1.0


def test_model_groups_by_configuration_and_predicts_from_item_sizes() -> None:
    rng = random.Random(1)
    one = line(2.0, 0.5, 0.1, rng)
    two = [SizeSample(s.stage, s.hardware, s.batch, 2, 0.0, s.total_size, s.latency_ms / 2) for s in one]
    model = SizeModel.fit(one + two)
    assert len(model.fits) == 2
    assert model.latency_ms("enc", [10.0, 30.0], vcpus=1) == pytest.approx(2.0 + 1.0 + 4.0)
    assert model.latency_ms("enc", [10.0, 30.0], vcpus=2) == pytest.approx((2.0 + 1.0 + 4.0) / 2)
    assert model.size_sensitive("enc")
    with pytest.raises(MissingProfileError, match="no size fit for stage 'enc' on 'cpu' with vcpus=4"):
        model.latency_ms("enc", [1.0], vcpus=4)
    with pytest.raises(ProfileError, match="at least one item"):
        model.latency_ms("enc", [], vcpus=1)


def test_predictions_never_go_below_the_floor() -> None:
    fit = fit_one([SizeSample("x", "cpu", 1, 1, 0.0, z, 10.0 - z) for z in (1.0, 2.0, 3.0)])
    assert fit.predict(1, 100.0) == MIN_LATENCY_MS


def test_bad_values_are_named() -> None:
    with pytest.raises(ProfileError, match=r"latency_ms must be a finite number > 0, got -1\.0"):
        SizeSample("x", "cpu", 1, 1, 0.0, 1.0, -1.0)
    with pytest.raises(ProfileError, match="batch must be >= 1, got 0"):
        SizeSample("x", "cpu", 0, 1, 0.0, 1.0, 1.0)
    with pytest.raises(ProfileError, match="at least 2 samples, got 1"):
        fit_one([SizeSample("x", "cpu", 1, 1, 0.0, 1.0, 1.0)])
    mixed = [SizeSample("x", "cpu", 1, 1, 0.0, 1.0, 1.0), SizeSample("y", "cpu", 1, 1, 0.0, 1.0, 1.0)]
    with pytest.raises(ProfileError, match="one \\(stage, hardware, vcpus, gpu_share\\)"):
        fit_one(mixed)


def test_count_model_is_the_fit_when_size_is_noise() -> None:
    rng = random.Random(5)
    # latency bends with the batch (not a line) and ignores the size: intercepts follow the bend
    samples = [SizeSample("cnn", "cpu", b, 1, 0.0, rng.uniform(1, 50) * b, 2.0 * b**1.5) for b in (1, 2, 4, 8) * 5]
    fit = fit_one(samples)
    assert fit.per_size_ms == pytest.approx(0.0, abs=1e-9)
    assert fit.predict(8, 10.0) == pytest.approx(2.0 * 8**1.5)


def test_size_model_beats_the_count_model_on_held_out_calls_when_size_matters() -> None:
    rng = random.Random(2)
    sized = line(1.0, 0.2, 0.3, rng, n=200, noise=0.02)  # cost dominated by the size
    flat = [SizeSample("flat", "cpu", s.batch, 1, 0.0, s.total_size, 4.0 * s.batch) for s in sized]
    errs = {e.stage: e for e in holdout_errors(sized + flat)}
    assert errs["enc"].uses_size and errs["enc"].size_mape < 0.5 * errs["enc"].count_mape
    assert errs["enc"].size_mape < 0.03  # within the 2 % noise, about
    assert errs["flat"].size_mape == pytest.approx(0.0, abs=1e-9)
    assert errs["flat"].count_mape == pytest.approx(0.0, abs=1e-9)
    assert errs["enc"].calls == 100


def test_size_factor_rescales_a_profile_value() -> None:
    model = SizeModel.fit(line(2.0, 0.5, 0.1, random.Random(3)))
    # typical items of 50: a batch of two 100-unit items costs (2 + 1 + 20) / (2 + 1 + 10)
    assert model.size_factor("enc", [100.0, 100.0], 50.0, vcpus=1) == pytest.approx(23.0 / 13.0)
    assert model.size_factor("enc", [50.0, 50.0], 50.0, vcpus=1) == pytest.approx(1.0)
    flat = SizeModel.fit([SizeSample("det", "cpu", b, 1, 0.0, 9.0 * b, 1.0 + b) for b in (1, 2, 4)])
    assert flat.size_factor("det", [1.0, 500.0], 9.0, vcpus=1) == 1.0  # size term dropped: no rescaling
    with pytest.raises(ProfileError, match=r"typical_item_size must be > 0, got 0\.0"):
        model.size_factor("enc", [1.0], 0.0, vcpus=1)
