"""PriceSheet: validation, the cost model of one batch, the default sheet, value semantics.

Prices are chosen as binary fractions (0.25, 2.0, ...) so that costs are exact.
"""

from __future__ import annotations

import logging
import pickle
import re

import pytest

from esg_prefect.exceptions import InvalidInputError, PriceError
from esg_prefect.model.config import Config
from esg_prefect.model.pricing import PriceSheet, price_mismatches
from esg_prefect.model.profile import LatencyProfile, ProfilePoint
from esg_prefect.runtime.pool import Pool
from esg_prefect.runtime.workers import InlineBackend
from esg_prefect.simulator.run import simulate
from esg_prefect.simulator.standard import tiny_case


def sheet() -> PriceSheet:
    """A vCPU-second costs 0.25, a whole T4-second 2.0, a whole A100-second 8.0."""
    return PriceSheet(0.25, {"T4": 2.0, "A100": 8.0})


# ---- validation ---------------------------------------------------------------


@pytest.mark.parametrize(("value", "shown"), [(-0.5, "-0.5"), (float("nan"), "nan"), (float("inf"), "inf")])
def test_bad_vcpu_price_is_named(value: float, shown: str) -> None:
    with pytest.raises(PriceError, match=f"price_per_vcpu_s must be a finite price >= 0, got {shown}"):
        PriceSheet(value)


@pytest.mark.parametrize("value", [True, "0.1", None])
def test_non_number_vcpu_price_is_named(value: object) -> None:
    with pytest.raises(PriceError, match=re.escape(f"price_per_vcpu_s must be a number, got {value!r}")):
        PriceSheet(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(("value", "shown"), [(-1.0, "-1.0"), (float("nan"), "nan"), (False, "False")])
def test_bad_gpu_price_names_type_and_value(value: float, shown: str) -> None:
    with pytest.raises(PriceError, match=re.escape("price_per_gpu_s['T4']") + f" must be .*got {shown}"):
        PriceSheet(0.1, {"T4": value})


@pytest.mark.parametrize("hw", ["cpu", ""])
def test_cpu_or_empty_is_not_a_gpu_type(hw: str) -> None:
    with pytest.raises(PriceError, match=re.escape(f"other than 'cpu', got {hw!r}")):
        PriceSheet(0.1, {hw: 1.0})


def test_price_error_is_an_invalid_input() -> None:
    with pytest.raises(InvalidInputError, match="-1"):
        PriceSheet(-1)


def test_zero_prices_are_allowed_and_ints_become_floats() -> None:
    s = PriceSheet(0, {"T4": 3})
    assert s.price_per_vcpu_s == 0.0
    assert isinstance(s.price_per_gpu_s["T4"], float)


def test_gpu_prices_are_copied_and_read_only() -> None:
    given = {"T4": 2.0}
    s = PriceSheet(0.25, given)
    given["T4"] = 99.0
    assert s.price_per_gpu_s["T4"] == 2.0
    with pytest.raises(TypeError):
        s.price_per_gpu_s["T4"] = 1.0  # type: ignore[index]


# ---- from_hourly and default --------------------------------------------------


def test_from_hourly_divides_by_3600() -> None:
    s = PriceSheet.from_hourly(vcpu_per_hour=900.0, gpu_per_hour={"T4": 7200.0})
    # 900 / 3600 = 0.25 and 7200 / 3600 = 2
    assert s == PriceSheet(0.25, {"T4": 2.0})


@pytest.mark.parametrize(
    ("vcpu", "gpus", "match"),
    [
        (-1.0, {}, "vcpu_per_hour must be a finite price >= 0, got -1.0"),
        (1.0, {"T4": -2.0}, re.escape("gpu_per_hour['T4'] must be a finite price >= 0, got -2.0")),
        (1.0, {"cpu": 2.0}, "other than 'cpu', got 'cpu'"),
    ],
)
def test_from_hourly_validates(vcpu: float, gpus: dict[str, float], match: str) -> None:
    with pytest.raises(PriceError, match=match):
        PriceSheet.from_hourly(vcpu, gpus)


def test_default_sheet_holds_the_documented_list_prices() -> None:
    s = PriceSheet.default()
    assert s.price_per_vcpu_s == 0.04 / 3600
    hourly = {"T4": 0.35, "V100": 2.48, "A10": 1.00, "A100": 3.67, "H100": 6.98, "H200": 10.60}
    assert dict(s.price_per_gpu_s) == {hw: p / 3600 for hw, p in hourly.items()}
    assert PriceSheet.default() == s


# ---- cost model ---------------------------------------------------------------


def test_gpu_price_of_cpu_is_zero() -> None:
    assert sheet().gpu_price_s("cpu") == 0.0
    assert sheet().gpu_price_s("A100") == 8.0


def test_rate_per_s() -> None:
    # 2 vCPUs * 0.25 + 0.5 T4 * 2.0 = 1.5
    assert sheet().rate_per_s(2, 0.5, "T4") == 1.5


def test_batch_cost_and_cost_per_request_on_a_gpu_share() -> None:
    cfg = Config(4, 2, 0.5)
    # rate 2 * 0.25 + 0.5 * 2.0 = 1.5 per s, for 250 ms: 0.375
    assert sheet().batch_cost(cfg, "T4", 250.0) == 0.375
    # 0.375 over a batch of 4
    assert sheet().cost_per_request(cfg, "T4", 250.0) == 0.09375


def test_batch_cost_on_cpu_pays_only_vcpus() -> None:
    # 4 vCPUs * 0.25 = 1.0 per s, for 1.5 s: 1.5; per request of a batch of 8: 0.1875
    assert sheet().batch_cost(Config(8, 4, 0.0), "cpu", 1500.0) == 1.5
    assert sheet().cost_per_request(Config(8, 4, 0.0), "cpu", 1500.0) == 0.1875


def test_whole_gpu_pays_the_full_gpu_price() -> None:
    # 1 vCPU * 0.25 + 1.0 * 8.0 = 8.25 per s, for 2 s: 16.5
    assert sheet().batch_cost(Config(1, 1, 1.0), "A100", 2000.0) == 16.5


def test_zero_latency_costs_nothing() -> None:
    assert sheet().batch_cost(Config(1, 1, 0.5), "T4", 0.0) == 0.0


@pytest.mark.parametrize(("latency", "shown"), [(-1.0, "-1.0"), (float("nan"), "nan"), (float("inf"), "inf")])
def test_bad_latency_is_named(latency: float, shown: str) -> None:
    with pytest.raises(PriceError, match=f"latency_ms must be a finite number >= 0, got {shown}"):
        sheet().batch_cost(Config(1, 1, 0.5), "T4", latency)


def test_missing_gpu_price_names_the_type_and_the_priced_ones() -> None:
    with pytest.raises(PriceError, match=re.escape("no price for GPU type 'H100'; the sheet prices ['A100', 'T4']")):
        sheet().batch_cost(Config(1, 1, 0.5), "H100", 10.0)


# ---- equality, hash, pickle ---------------------------------------------------


def test_equal_sheets_are_equal_and_hash_alike() -> None:
    a = PriceSheet(0.25, {"T4": 2.0, "A100": 8.0})
    b = PriceSheet(0.25, {"A100": 8, "T4": 2})
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b}) == 1


@pytest.mark.parametrize(
    "other", [PriceSheet(0.5, {"T4": 2.0, "A100": 8.0}), PriceSheet(0.25, {"T4": 2.0}), PriceSheet(0.25)]
)
def test_different_sheets_differ(other: PriceSheet) -> None:
    assert sheet() != other


def test_not_equal_to_other_types() -> None:
    assert sheet() != (0.25, {"T4": 2.0, "A100": 8.0})


def test_pickle_round_trip() -> None:
    back: PriceSheet = pickle.loads(pickle.dumps(sheet()))
    assert back == sheet()
    assert hash(back) == hash(sheet())
    assert back.batch_cost(Config(4, 2, 0.5), "T4", 250.0) == 0.375
    with pytest.raises(TypeError):
        back.price_per_gpu_s["T4"] = 0.0  # type: ignore[index]


def test_keep_alive_scales_follow_the_cheapest_gpu_type_present() -> None:
    sheet = PriceSheet.default()
    scales = sheet.keep_alive_scales(["cpu", "T4", "V100", "A100"])
    assert scales == {
        "cpu": 1.0,
        "T4": 1.0,
        "V100": pytest.approx(0.35 / 2.48),
        "A100": pytest.approx(0.35 / 3.67),
    }
    # Without a T4 the A10 is the cheapest type present.
    assert sheet.keep_alive_scales(["A10", "H100"]) == {"cpu": 1.0, "A10": 1.0, "H100": pytest.approx(1.0 / 6.98)}
    assert sheet.keep_alive_scales(["cpu"]) == {"cpu": 1.0}
    # A type without a price (say, an unprofiled GPU of the machine) keeps the whole time, and is not
    # taken as the cheapest.
    assert sheet.keep_alive_scales(["T4", "V100", "B200"]) == {
        "cpu": 1.0,
        "T4": 1.0,
        "V100": pytest.approx(0.35 / 2.48),
        "B200": 1.0,
    }


def test_keep_alive_scales_leave_a_free_gpu_type_out_of_the_cheapest() -> None:
    """A type priced 0 keeps the whole keep-alive (its idle costs nothing) and is not the cheapest: taken as such,
    every dearer type's scale was 0 / its price = 0, each idle worker on it stopped at once."""
    sheet = PriceSheet(0.01, {"free": 0.0, "T4": 0.5, "A100": 5.0})
    assert sheet.keep_alive_scales(["cpu", "free", "T4", "A100"]) == {
        "cpu": 1.0,
        "free": 1.0,
        "T4": 1.0,
        "A100": pytest.approx(0.1),
    }
    # Every type free: all keep the whole time.
    assert PriceSheet(0.01, {"T4": 0.0, "V100": 0.0}).keep_alive_scales(["T4", "V100"]) == {
        "cpu": 1.0,
        "T4": 1.0,
        "V100": 1.0,
    }


# ---- prices against a profile's hardware ---------------------------------------------------


def test_a_price_for_a_misspelt_gpu_is_named_beside_the_profiled_one_it_misses() -> None:
    prices = PriceSheet(0.25, {"T4": 2.0, "a100": 8.0})
    assert price_mismatches(prices, {"A100", "T4", "cpu"}) == [
        "price for 'a100' matches no hardware in the profile (A100, T4, cpu); did you mean 'A100'?"
    ]
    for typo in ("A-100", "a_100 "):
        (message,) = price_mismatches(PriceSheet(0.25, {"T4": 2.0, typo: 8.0}), {"A100", "T4", "cpu"})
        assert message.endswith("did you mean 'A100'?"), typo


def test_prices_for_hardware_no_profile_has_are_fine_while_every_profiled_gpu_has_its_own() -> None:
    """Hardware names are open-ended: the default sheet prices GPUs a user's profile does not cover."""
    assert price_mismatches(PriceSheet.default(), {"T4", "cpu"}) == []
    assert price_mismatches(PriceSheet(0.25, {"my-gpu": 1.0}), {"cpu"}) == []
    assert price_mismatches(PriceSheet(0.25), {"L4", "cpu"}) == []  # unpriced, but no price went astray


def test_an_unpriced_gpu_and_unmatched_prices_of_other_names_are_named_together() -> None:
    (message,) = price_mismatches(PriceSheet(0.25, {"T4": 2.0, "H100": 8.0, "L40": 1.0}), {"L4", "T4", "cpu"})
    assert message == (
        "no price for the profile's L4, and the prices for H100, L40 match no hardware in the profile "
        "(L4, T4, cpu): is one of them misnamed?"
    )
    (message,) = price_mismatches(PriceSheet(0.25, {"T4": 2.0, "A10": 8.0}), {"A100", "T4", "cpu"})
    assert message.startswith("no price for the profile's A100, and the prices for A10 ")  # another GPU: no guess


def test_a_pool_and_a_simulation_warn_of_a_misspelt_gpu_price_where_profile_and_prices_meet(
    caplog: pytest.LogCaptureFixture,
) -> None:
    profile = LatencyProfile([ProfilePoint("enc", hw, 1, 1, 1.0, 10.0) for hw in ("T4", "A10G")])
    caplog.set_level(logging.WARNING, logger="esg_prefect.model.pricing")
    pool = Pool(profile, PriceSheet(0.25, {"T4": 2.0, "a10g": 1.0}), backend=InlineBackend())
    pool.close()
    assert "price for 'a10g' matches no hardware in the profile (A10G, T4); did you mean 'A10G'?" in caplog.messages
    case = tiny_case()  # the shipped GPU profile: A100, T4 and V100
    simulate(case.with_(prices=PriceSheet(0.25, {"T4": 2.0, "A100": 8.0, "v-100": 4.0}), duration_s=0.5))
    assert (
        "price for 'v-100' matches no hardware in the profile (A100, T4, V100); did you mean 'V100'?" in caplog.messages
    )
