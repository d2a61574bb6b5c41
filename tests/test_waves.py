"""The wave detector, and the keep-alive percentile it selects (``keep_alive_percentile_waves``)."""

from __future__ import annotations

import pytest

from esg_prefect.control.keepalive import AdaptiveKeepAlive, GapPolicy
from esg_prefect.exceptions import ConfigError
from esg_prefect.scheduling.waves import LULL_MS, Waves


def fed(times: list[float], stage: str = "m") -> Waves:
    w = Waves()
    for t in times:
        w.observe(stage, t)
    return w


def test_lulls_filling_a_tenth_of_the_history_are_waves() -> None:
    # A call every 100 ms for 10 s: no lull.
    assert not fed([100.0 * i for i in range(101)]).in_waves("m")
    # Bursts of 10 calls (10 ms apart) every second: lulls of 910 ms fill 91 % of the time.
    bursts = [1000.0 * k + 10.0 * i for k in range(10) for i in range(10)]
    assert fed(bursts).in_waves("m") and not fed(bursts).in_waves("other")
    # One lull of 1 s in 10 s of calls 100 ms apart is a tenth: waves; a gap just under LULL_MS is not a lull.
    one = [100.0 * i for i in range(51)] + [6000.0 + 100.0 * i for i in range(41)]
    assert fed(one).in_waves("m")
    near = [100.0 * i for i in range(51)] + [5000.0 + LULL_MS - 1 + 100.0 * i for i in range(46)]
    assert not fed(near).in_waves("m")


def test_waves_need_two_seconds_of_history_and_forget_after_thirty() -> None:
    assert not fed([0.0, 500.0, 1000.0, 1500.0]).in_waves("m")  # lulls, but 1.5 s of history
    assert fed([0.0, 500.0, 1000.0, 1500.0, 2000.0]).in_waves("m")
    # Bursty for 5 s, then steady for 40 s: the old lulls roll out of the 30 s window.
    calls = [0.0, 1000.0, 2000.0, 3000.0, 4000.0] + [4000.0 + 50.0 * i for i in range(1, 801)]
    w = fed(calls[:10])
    assert w.in_waves("m")
    for t in calls[10:]:
        w.observe("m", t)
    assert not w.in_waves("m")


def test_a_call_out_of_order_counts_with_the_latest() -> None:
    w = fed([0.0, 1000.0, 2000.0])
    w.observe("m", 1500.0)  # earlier than the latest: no lull of its own, no negative gap
    assert w.in_waves("m")
    w.observe("m", 2100.0)  # 100 ms after the latest (2000), not after 1500
    assert w.in_waves("m")


def test_a_wavy_stage_keeps_its_idle_workers_for_the_lower_percentile() -> None:
    ka = AdaptiveKeepAlive(GapPolicy(percentile=99.0, percentile_waves=50.0, min_ms=0.0, floor_cold_starts=0.0))
    for g in [10.0] * 60 + [3000.0] * 40:  # within-wave gaps of 10 ms, lulls of 3 s
        ka.observe("m", g)
    steady = ka.keep_alive_ms("m", 60_000.0)
    assert 3000.0 * 1.1 <= steady < 60_000.0  # the 99th percentile: through the lulls
    for t in [0.0, 1000.0, 2000.0, 3000.0]:  # the core feeds the stage's calls
        ka.waves.observe("m", t)
    assert ka.waves.in_waves("m")
    assert ka.keep_alive_ms("m", 60_000.0) < 20.0 * 1.1  # the median: a lull lets them go
    with pytest.raises(ConfigError, match="percentile in waves"):
        GapPolicy(percentile_waves=0.0)
