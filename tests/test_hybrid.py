"""PALDIA's hybrid spatio-temporal sharing (esg_prefect/scheduling/hybrid.py) and the co-run model."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

import esg_prefect.profiler.interference as profiler_interference
from esg_prefect.exceptions import ConfigError, ProfileError
from esg_prefect.model import (
    ClusterSnapshot,
    Config,
    ConfigSpace,
    Device,
    LatencyProfile,
    Node,
    PriceSheet,
    ProfilePoint,
    Worker,
)
from esg_prefect.model.interference import (
    DEFAULT_CORUN_TABLE,
    GPU_SLOWDOWN_PER_CORUNNER,
    CoRunModel,
    CoRunRow,
    InterferenceTable,
)
from esg_prefect.scheduling.base import Placement
from esg_prefect.scheduling.dispatch import ClusterView
from esg_prefect.scheduling.esg import ESGScheduler
from esg_prefect.scheduling.hybrid import WAIT_MARGIN, HybridSharing, RunOption, choose
from esg_prefect.scheduling.paldia import paldia_features
from esg_prefect.scheduling.settings import ESGSettings
from esg_prefect.scheduling.tables import CandidateTables, Choice

PRICES = PriceSheet.from_hourly(0.04, {"T4": 0.35})


# ---- the co-run model ------------------------------------------------------------------


def test_profiler_module_keeps_its_api() -> None:
    assert profiler_interference.InterferenceTable is InterferenceTable
    assert profiler_interference.CoRunRow is CoRunRow
    t = InterferenceTable.from_csv(DEFAULT_CORUN_TABLE)
    assert "detect" in t.stages() and t.has("detect", "cpu") and not t.has("detect", "T4")


def test_model_measured_rows_first_then_hardware_slope_then_gpu_default() -> None:
    t = InterferenceTable(
        [CoRunRow("a", "cpu", 4, 1, 0.0, 1, 10.0, 14.0), CoRunRow("b", "cpu", 4, 1, 0.0, 1, 10.0, 18.0)]
    )
    m = CoRunModel(t)
    assert m.slowdown("a", "cpu", 0) == 1.0
    assert m.slowdown("a", "cpu", 1) == pytest.approx(1.4)  # measured
    assert m.slowdown("c", "cpu", 2) == pytest.approx(1.0 + 0.6 * 2)  # mean slope of the cpu rows (0.4, 0.8)
    assert m.slowdown("a", "T4", 3) == pytest.approx(1.0 + GPU_SLOWDOWN_PER_CORUNNER * 3)  # GPU default
    with pytest.raises(ProfileError, match="co_runners must be >= 0, got -1"):
        m.slowdown("a", "T4", -1)


def test_shipped_table_loads_as_default() -> None:
    m = CoRunModel.load("default")
    assert m.slowdown("detect", "cpu", 1) == pytest.approx(53.117 / 31.055, rel=1e-3)
    assert m.slowdown("resnet50", "A100", 2) == pytest.approx(1.3)
    with pytest.raises(ProfileError, match=r"'/nope\.csv' not found"):
        CoRunModel.load("/nope.csv")


# ---- the choice ------------------------------------------------------------------------


def test_co_runs_when_waiting_would_miss_the_deadline() -> None:
    run = RunOption("run", 0.0, 29.0, 29.0)
    wait = RunOption("wait", 8.0, 26.0, 34.0)
    assert choose([run, wait], deadline_ms=30.0) is run


def test_waits_when_the_wait_is_short_and_cheaper() -> None:
    run = RunOption("run", 0.0, 29.0, 29.0)
    wait = RunOption("wait", 2.0, 26.0, 28.0)
    assert choose([run, wait], deadline_ms=40.0) is wait


def test_a_wait_needs_its_margin_a_co_run_does_not() -> None:
    """A wait rests on predicted ends of other batches: it must end in time with WAIT_MARGIN to spare."""
    run = RunOption("run", 0.0, 35.0, 35.0)
    wait = RunOption("wait", 4.0, 26.0, 30.0)
    assert choose([run, wait], deadline_ms=35.0) is wait  # no margin asked: the cheaper wait
    assert choose([run, wait], deadline_ms=35.0, wait_margin=WAIT_MARGIN) is run  # 30 x 1.2 = 36 > 35
    assert choose([run, wait], deadline_ms=36.0, wait_margin=WAIT_MARGIN) is wait
    assert choose([run], deadline_ms=35.0, wait_margin=WAIT_MARGIN) is run  # a co-run ends by 35: in time


def test_neither_meets_the_deadline_earliest_finish_wins() -> None:
    run = RunOption("run", 0.0, 29.0, 29.0)
    wait = RunOption("wait", 8.0, 26.0, 34.0)
    assert choose([run, wait], deadline_ms=10.0) is run
    with pytest.raises(ValueError, match="at least one option"):
        choose([], 1.0)


# ---- the review on a cluster -----------------------------------------------------------


def setting(devices: int) -> tuple[HybridSharing, ClusterSnapshot, CandidateTables]:
    pts = [ProfilePoint("m", "T4", b, 1, 0.2, 10.0 * b) for b in (1, 2)]
    space = ConfigSpace((1, 2), (1,), (0.2,))
    tables = CandidateTables(LatencyProfile(pts), PRICES, ESGSettings(config_space=space))
    devs = [Device(f"n/gpu{i}", "n", "T4") for i in range(devices)]
    busy = [Worker(f"w{i}", "n", "n/gpu0", "T4", 1, 0.2, "other", busy=True) for i in range(2)]
    return HybridSharing(tables, CoRunModel()), ClusterSnapshot([Node("n", 8)], devs, busy), tables


def review(devices: int, due_ms: float) -> tuple[bool, str | None, float]:
    hs, cluster, _ = setting(devices)
    here = Placement("n", "n/gpu0", None, 4)
    hs.committed(here, 0.0, 5.0)  # the two tenants' batches, as dispatched earlier: end at 5 and 50 ms
    hs.committed(here, 0.0, 50.0)
    hs.begin_round(cluster, now_ms=1.0)
    c = Choice("m", Config(1, 1, 0.2), "T4", 10.0)
    v = hs.review(c, here, ClusterView(cluster), now_ms=1.0, due_ms=due_ms)
    return v.wait, v.placement.device_id, v.latency_ms


def test_review_waits_for_a_tenant_when_that_is_cheaper_and_in_time() -> None:
    # co-run now beside 2: 10 x 1.30 = 13 ms, ends at 14; wait 4 ms for one tenant, then 10 x 1.15 = 11.5, ends at 16.5
    assert review(1, due_ms=20.0) == (True, "n/gpu0", pytest.approx(11.5))


def test_review_co_runs_when_the_wait_would_miss() -> None:
    assert review(1, due_ms=15.0) == (False, "n/gpu0", pytest.approx(13.0))


def test_review_moves_to_a_free_device_of_the_type() -> None:
    assert review(2, due_ms=20.0) == (False, "n/gpu1", pytest.approx(10.0))


def test_tenants_with_no_recorded_dispatch_end_late() -> None:
    """A busy worker this object did not dispatch ends, at the latest, after the space's largest batch."""
    hs, cluster, _ = setting(1)  # tenants of a stage with no profile: their end is unknown
    hs.begin_round(cluster, now_ms=0.0)
    c = Choice("m", Config(1, 1, 0.2), "T4", 10.0)
    here = Placement("n", "n/gpu0", None, 4)
    v = hs.review(c, here, ClusterView(cluster), 0.0, due_ms=1000.0)
    assert (v.wait, v.latency_ms) == (False, pytest.approx(13.0))  # never waits for an unknown end
    known = ClusterSnapshot(cluster.nodes, cluster.devices, [replace(w, stage="m") for w in cluster.workers])
    hs = HybridSharing(hs.tables, hs.model)  # a fresh one (an estimate, once made, is kept: it does not slide)
    hs.begin_round(known, now_ms=0.0)  # now both end by m's batch 2 (20 ms); then alone: 20 + 10 = 30 ms
    v = hs.review(c, here, ClusterView(known), 0.0, due_ms=40.0)
    assert (v.wait, v.latency_ms, v.co_runners) == (True, pytest.approx(10.0), 0)
    v = hs.review(c, here, ClusterView(known), 0.0, due_ms=29.0)
    assert (v.wait, v.latency_ms) == (False, pytest.approx(13.0))


def test_cpu_dispatches_are_not_reviewed() -> None:
    hs, cluster, _ = setting(1)
    hs.begin_round(cluster, 0.0)
    c = Choice("m", Config(1, 1, 0.0), "cpu", 10.0)
    v = hs.review(c, Placement("n", None, None, 4), ClusterView(cluster), 0.0, 5.0)
    assert (v.wait, v.latency_ms) == (False, 10.0)


# ---- knobs -----------------------------------------------------------------------------


def test_knobs_off_build_no_feature() -> None:
    t = setting(1)[2]
    assert paldia_features(t) == (None, None)
    on = CandidateTables(t.profile, PRICES, replace(t.settings, hybrid_sharing=True, hardware_selection=True))
    hw, hy = paldia_features(on)
    assert hw is not None and hy is not None


def test_bad_hybrid_knobs_name_the_value(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="hybrid_sharing must be a bool, got 1"):
        ESGSettings(hybrid_sharing=1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="corun_table must be 'default' or a CSV path, got ''"):
        ESGSettings(corun_table="")
    missing = str(tmp_path / "none.csv")
    with pytest.raises(ConfigError, match=r"none\.csv"):
        ESGScheduler(
            LatencyProfile([ProfilePoint("m", "cpu", 1, 1, 0.0, 1.0)]),
            PRICES,
            ESGSettings(hybrid_sharing=True, corun_table=missing),
        )


def test_settings_round_trip_with_the_new_knobs() -> None:
    s = ESGSettings(hardware_selection=True, hardware_utilization=0.5, hybrid_sharing=True)
    assert ESGSettings.from_dict(s.to_dict()) == s


@pytest.mark.parametrize(
    ("column", "value", "says"), [("co_runners", "two", "an integer"), ("corun_ms", "?", "a number")]
)
def test_a_bad_number_in_a_corun_table_names_its_column(column: str, value: str, says: str, tmp_path: Path) -> None:
    """It said only Python's "invalid literal for int() with base 10", naming no column."""
    row = dict.fromkeys(["stage", "hardware"], "a") | {"batch": "4", "vcpus": "1", "gpu_share": "0"}
    row |= {"co_runners": "1", "alone_ms": "10", "corun_ms": "14", "slowdown": "1.4", column: value}
    path = tmp_path / "corun.csv"
    path.write_text(",".join(row) + "\n" + ",".join(row.values()) + "\n")
    with pytest.raises(ProfileError, match=rf"line 2: {column} must be {says}, got '{re.escape(value)}'"):
        InterferenceTable.from_csv(path)
