"""Keep-alive from measured idle gaps (control/keepalive.py) and its place in the core."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from esg_prefect.control.core import Core
from esg_prefect.control.events import BatchFinished, CallArrived, StartBatch, StopWorker, WakeAt
from esg_prefect.control.fleet import Fleet
from esg_prefect.control.keepalive import (
    SCALE_DOWN_WINDOW_MS,
    AdaptiveKeepAlive,
    BusyAverage,
    GapHistogram,
    GapPolicy,
    adaptive_keep_alive,
)
from esg_prefect.control.worker import FleetWorker
from esg_prefect.exceptions import ConfigError
from esg_prefect.model import LatencyProfile, PriceSheet
from esg_prefect.model.attribution import BatchItem, BatchRecord
from esg_prefect.model.cluster import Node
from esg_prefect.model.config import Config
from esg_prefect.scheduling import ESGSettings
from esg_prefect.scheduling.base import Placement, SchedulingResult, Snapshot
from esg_prefect.scheduling.tables import CandidateTables
from tests.test_control_core import CHAIN, KEEP_MS, PROFILE, SETTINGS, Simple


def test_the_percentile_is_the_upper_edge_of_its_logarithmic_bin() -> None:
    h = GapHistogram(cap=1000)
    for _ in range(99):
        h.add(10.0)
    h.add(5000.0)
    # 10 ms is bin floor(8 * log10(10)) = 8, whose upper edge is 10^(9/8) ms.
    assert h.percentile(99.0) == pytest.approx(10 ** (9 / 8))
    # The last gap: 5000 ms is bin floor(8 * log10(5000)) = 29, edge 10^(30/8).
    assert h.percentile(100.0) == pytest.approx(10 ** (30 / 8))
    assert GapHistogram(cap=10).percentile(50.0) == 0.0


def test_counts_halve_at_the_cap_so_that_new_gaps_outweigh_old_ones() -> None:
    h = GapHistogram(cap=40)
    for _ in range(39):
        h.add(2000.0)
    h.add(2000.0)  # the 40th: every count halves
    assert h.total == 20.0
    for _ in range(20):
        h.add(20.0)  # 20 new short gaps now weigh as much as the 40 old long ones
    assert h.percentile(50.0) == pytest.approx(10 ** (11 / 8))
    assert h.percentile(51.0) == pytest.approx(10 ** (27 / 8))


def test_a_stage_keeps_the_fixed_window_until_it_has_enough_gaps_then_the_clamped_percentile() -> None:
    policy = GapPolicy(percentile=99.0, margin=0.1, floor_cold_starts=2.0, min_ms=0.0, min_samples=5, cap=100)
    ka = AdaptiveKeepAlive(policy, lambda stage, hw: 50.0)  # floor: 2 cold starts of 50 ms
    for _ in range(4):
        ka.observe("a", 300.0)
    assert ka.keep_alive_ms("a", 60_000.0) == 60_000.0  # 4 gaps < min_samples
    ka.observe("a", 300.0)
    edge = 10 ** (20 / 8)  # 300 ms: bin floor(8 * log10(300)) = 19
    assert ka.keep_alive_ms("a", 60_000.0) == pytest.approx(edge * 1.1)
    assert ka.keep_alive_ms("a", 200.0) == 200.0  # never past the fixed window (keep_alive_by_price)
    assert ka.keep_alive_ms("b", 60_000.0) == 60_000.0  # another stage has no gaps yet
    for _ in range(5):
        ka.observe("c", 0.5)
    assert ka.keep_alive_ms("c", 60_000.0) == 100.0  # the floor


def test_bad_knobs_are_named() -> None:
    for kw, word in (
        ({"keep_alive_policy": "sometimes"}, "keep_alive_policy"),
        ({"keep_alive_percentile": 0.0}, "keep_alive_percentile"),
        ({"keep_alive_percentile": 101.0}, "keep_alive_percentile"),
        ({"keep_alive_cold_starts": -1.0}, "keep_alive_cold_starts"),
        ({"keep_alive_cold_starts": float("inf")}, "keep_alive_cold_starts"),
        ({"keep_alive_cold_starts": True}, "keep_alive_cold_starts"),
    ):
        with pytest.raises(ConfigError, match=word):
            ESGSettings(**kw)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="percentile"):
        GapPolicy(percentile=-1.0)
    with pytest.raises(ConfigError, match="min_samples"):
        GapPolicy(min_samples=10, cap=15)
    assert adaptive_keep_alive(ESGSettings(keep_alive_policy="fixed").platform, lambda s, h: 1.0) is None


COLD_PROFILE = LatencyProfile(PROFILE.points, {("a", "cpu"): 10.0, ("b", "cpu"): 10.0})


def _core(settings: ESGSettings, idle_vcpus: bool = True) -> Core:
    """One CPU node; its idle workers are billed (``idle_vcpus``) unless asked: free, they keep the window."""
    settings = replace(settings, idle_vcpus=idle_vcpus)
    fleet = Fleet((Node("n0", 4, max_workers=8),), (), settings.keep_alive_s * 1000.0)
    tables = CandidateTables(COLD_PROFILE, PriceSheet(1e-5, {}), settings)
    return Core(Simple(), tables, fleet, settings.platform, {"wf": CHAIN})  # type: ignore[arg-type]


def _run(core: Core, gaps: int, gap_ms: float = 50.0, spare: bool = True) -> float:
    """A worker of stage a reused ``gaps`` times after ``gap_ms`` idle each; how long it is kept at last.

    With ``spare``, another worker of the stage stays busy throughout, so that ours is not the
    stage's last one (which keeps the fixed window).
    """
    me = "w1"
    if spare:
        core.arrive(CallArrived("hold", "rh", "rh", "wf", "a", 0.0))
        assert [a for a in core.settle(0.0) if isinstance(a, StartBatch)]  # w1: busy to the end
        me = "w2"
    t = 0.0
    wakes: list[float] = []
    for i in range(gaps + 1):
        core.arrive(CallArrived(f"j{i}", f"r{i}", f"r{i}", "wf", "a", t))
        (start,) = [a for a in core.settle(t) if isinstance(a, StartBatch)]
        assert start.cold == (i == 0) and start.worker.worker_id == me
        t += 11.0
        core.finished(BatchFinished(start.batch_id, t))
        wakes += [a.t for a in core.settle(t) if isinstance(a, WakeAt)]
        t += gap_ms
    end, at = t - gap_ms, wakes[-1]  # the core asks again only for an earlier wake-up than the pending one
    for _ in range(3):
        actions = core.settle(at)
        if actions == [StopWorker(me, at)]:
            return at - end
        (wake,) = actions
        assert isinstance(wake, WakeAt)
        at = wake.t
    raise AssertionError("the worker never expired")


def test_the_core_keeps_a_worker_for_its_stages_gaps_once_it_has_seen_enough() -> None:
    # 150 cold starts of 10 ms; scale-down off, in waves too (the spare worker's load alone would make ours
    # surplus: with 2 s gaps the stage comes in waves).
    hist = replace(
        SETTINGS, keep_alive_s=60.0, keep_alive_cold_starts=150.0, scale_down_utilization=0.0, scale_down_waves=0.0
    )
    # Fewer gaps than the policy needs (20): the fixed window.
    assert _run(_core(hist), 10) == 60_000.0
    # 20 gaps of 50 ms: 50 ms is bin 13, edge 10^(14/8) = 56.2 ms, +10 %: 61.9 ms, under the 1.5 s floor.
    assert _run(_core(hist), 20) == pytest.approx(1500.0)
    # No floor from cold starts: the least keep-alive, 1 s, still holds (a profile may have no cold starts).
    bare = replace(hist, keep_alive_cold_starts=0.0)
    assert _run(_core(bare), 20) == pytest.approx(1000.0)
    # 20 gaps of 2 s: bin 26, edge 10^(27/8) = 2371 ms, +10 %.
    assert _run(_core(bare), 20, gap_ms=2000.0) == pytest.approx(10 ** (27 / 8) * 1.1)
    # The fixed policy ignores the gaps.
    assert _run(_core(replace(hist, keep_alive_policy="fixed")), 20) == 60_000.0
    # A stage's last worker keeps the fixed window: a burst after a lull finds it warm.
    assert _run(_core(bare), 20, spare=False) == 60_000.0


def test_a_stage_left_with_one_idle_worker_gives_it_the_fixed_window_again() -> None:
    policy = GapPolicy(min_samples=3, cap=100, floor_cold_starts=2.0, min_ms=0.0)
    fleet = Fleet((Node("n0", 4, max_workers=8),), (), 60_000.0, adaptive=AdaptiveKeepAlive(policy, lambda s, h: 100.0))
    cfg = Config(1, 1, 0.0)
    item = (BatchItem("r", "r"),)
    w1 = fleet.acquire(Placement("n0", None, None, 4), "a", cfg, "cpu", 0.0)
    w2 = fleet.acquire(Placement("n0", None, None, 4), "a", cfg, "cpu", 0.0)
    fleet.finish(w2, BatchRecord("b0", w2.worker_id, item, cfg, "cpu", 0.0, 10.0), 10.0)
    t = 10.0
    for i in range(3):  # w2's reuses fill the stage's histogram; w1 stays busy meanwhile
        t += 50.0
        fleet.acquire(Placement("n0", None, w2.worker_id, 1), "a", cfg, "cpu", t)
        fleet.finish(w2, BatchRecord(f"b{i + 1}", w2.worker_id, item, cfg, "cpu", t, t + 10.0), t + 10.0)
        t += 10.0
    assert fleet.next_expiry_ms() == t + 200.0  # two workers: w2 is kept the 200 ms floor
    at = fleet.finish(w1, BatchRecord("bw1", w1.worker_id, item, cfg, "cpu", 0.0, t), t)
    assert at == t + 200.0
    # Both due at t + 200: w2 goes first, which leaves w1 the stage's last worker, re-armed for the window.
    assert [w.worker_id for w in fleet.expire(t + 200.0)] == [w2.worker_id]
    assert fleet.next_expiry_ms() == t + 60_000.0 and w1.worker_id in fleet.workers


def test_idle_workers_kept_the_fixed_window_follow_the_histogram_once_it_fills() -> None:
    """w2 goes idle under the fixed window; w1's reuses fill the stage's histogram; then w2 expires early."""
    policy = GapPolicy(min_samples=3, cap=100, floor_cold_starts=2.0, min_ms=0.0)
    cold = lambda stage, hw: 100.0  # noqa: E731 - floor: 200 ms
    fleet = Fleet((Node("n0", 4, max_workers=8),), (), 60_000.0, adaptive=AdaptiveKeepAlive(policy, cold))
    cfg = Config(1, 1, 0.0)

    def batch(w: FleetWorker, start: float, end: float) -> None:
        item = (BatchItem("r", "r"),)
        assert fleet.finish(w, BatchRecord(f"b{start}", w.worker_id, item, cfg, "cpu", start, end), end) > end

    w1 = fleet.acquire(Placement("n0", None, None, 4), "a", cfg, "cpu", 0.0)
    w2 = fleet.acquire(Placement("n0", None, None, 4), "a", cfg, "cpu", 0.0)
    batch(w1, 0.0, 10.0)
    batch(w2, 0.0, 10.0)  # w2: idle from 10 ms, kept the fixed 60 s
    t = 10.0
    for i in range(3):
        t += 50.0
        fleet.acquire(Placement("n0", None, w1.worker_id, 1), "a", cfg, "cpu", t)
        assert fleet.rearmed_ms == (None if i < 2 else 210.0)  # the third gap fills it: w2 now 10 + 200 ms
        batch(w1, t, t + 10.0)
        t += 10.0
    assert fleet.next_expiry_ms() == 210.0
    assert [w.worker_id for w in fleet.expire(210.0)] == [w2.worker_id]
    assert fleet.idles[-1].start_ms == 10.0 and fleet.idles[-1].end_ms == 210.0
    # A re-armed expiry already past is now, not earlier: the driver cannot wake in the past.
    fleet2 = Fleet((Node("n0", 4, max_workers=8),), (), 60_000.0, adaptive=AdaptiveKeepAlive(policy, cold))
    fleet = fleet2
    v1 = fleet.acquire(Placement("n0", None, None, 4), "a", cfg, "cpu", 0.0)
    v2 = fleet.acquire(Placement("n0", None, None, 4), "a", cfg, "cpu", 0.0)
    batch(v1, 0.0, 10.0)
    batch(v2, 0.0, 10.0)
    t = 10.0
    for _ in range(3):
        t += 500.0
        fleet.acquire(Placement("n0", None, v1.worker_id, 1), "a", cfg, "cpu", t)
        batch(v1, t, t + 10.0)
        t += 10.0
    assert fleet.rearmed_ms == 1530.0  # the third reuse's time: 10 + floor (or the 500 ms gaps' edge) is past


def test_the_busy_average_follows_a_stage_s_busy_workers_over_its_window() -> None:
    avg = BusyAverage(1000.0)
    avg.change("a", 0.0, 1)
    avg.change("a", 0.0, 1)
    assert avg.value("a", 1000.0) == pytest.approx(2.0 * (1.0 - math.exp(-1.0)))
    avg.change("a", 1000.0, -2)
    v = 2.0 * (1.0 - math.exp(-1.0))
    assert avg.value("a", 2000.0) == pytest.approx(v * math.exp(-1.0))
    avg.change("a", 500.0, 1)  # an earlier time counts as the last change's (no going back)
    assert avg.value("a", 2000.0) == pytest.approx(v * math.exp(-1.0))
    assert avg.value("b", 10.0) == 0.0


def _burst_fleet(utilization: float, busy_ms: float) -> tuple[Fleet, list[FleetWorker], float]:
    """Three workers of stage a, busy from 0 to ``busy_ms`` and going idle 10 ms apart; floor 200 ms, window 60 s."""
    policy = GapPolicy(min_samples=3, cap=100, floor_cold_starts=2.0, min_ms=0.0)
    fleet = Fleet((Node("n0", 4, max_workers=8),), (), 60_000.0, adaptive=AdaptiveKeepAlive(policy, lambda s, h: 100.0))
    fleet.scale_down_utilization = utilization
    cfg = Config(1, 1, 0.0)
    ws = [fleet.acquire(Placement("n0", None, None, 4), "a", cfg, "cpu", 0.0) for _ in range(3)]
    t = busy_ms
    for i, w in enumerate(ws):
        t = busy_ms + 10.0 * i
        fleet.finish(w, BatchRecord(f"b{i}", w.worker_id, (BatchItem("r", "r"),), cfg, "cpu", 0.0, t), t)
    return fleet, ws, t


def test_after_a_burst_the_workers_its_load_no_longer_needs_expire_after_the_floor() -> None:
    """Busy 100 ms, then idle: the 5 s average of busy workers is about 0.06, so one worker is needed at 50 %;
    the two that idled longest go after the 200 ms floor, the most recently idle keeps the 60 s window."""
    fleet, (w1, w2, w3), t = _burst_fleet(0.5, 100.0)
    v = 3.0 * (1.0 - math.exp(-100.0 / SCALE_DOWN_WINDOW_MS))  # 3 busy to 100 ms, then 2 to 110, 1 to 120
    for busy in (2.0, 1.0):
        v = busy + (v - busy) * math.exp(-10.0 / SCALE_DOWN_WINDOW_MS)
    assert fleet.busy.value("a", 120.0) == pytest.approx(v) and v < 0.5
    assert [w.worker_id for w in fleet.expire(299.0)] == []
    assert [w.worker_id for w in fleet.expire(300.0)] == [w1.worker_id]
    assert [w.worker_id for w in fleet.expire(310.0)] == [w2.worker_id]
    assert fleet.next_expiry_ms() == t + 60_000.0 and list(fleet.workers) == [w3.worker_id]


def test_a_stage_whose_load_needs_its_workers_keeps_them_and_off_keeps_every_window() -> None:
    """Busy 20 s: about 2.95 workers busy on average, 6 needed at 50 %: none is surplus. Off (0): none either."""
    fleet, ws, _ = _burst_fleet(0.5, 20_000.0)
    assert fleet.next_expiry_ms() == 20_000.0 + 60_000.0
    fleet, ws, _ = _burst_fleet(0.0, 100.0)
    assert fleet.next_expiry_ms() == 100.0 + 60_000.0
    assert [w.worker_id for w in fleet.expire(60_119.0)] == [ws[0].worker_id, ws[1].worker_id]


def _wave_fleet(
    waves: bool, prewarmed: bool = False, cold_ms: float = 100.0, prices: PriceSheet | None = None, held: bool = False
) -> tuple[Fleet, list[FleetWorker], float]:
    """Stage a with three workers, busy from 3,000 ms to 3,100 and going idle 10 ms apart (one pre-warmed instead, if
    asked); floor 2,000 ms (20 cold starts of 100 ms), window 60 s; ``scale_down_waves`` 0.5. With ``waves`` its calls
    came at 0-1,000 ms and 2,500-3,000 ms (a 1.5 s lull in 3 s: in waves), else every 10 ms from 0 to 3,000. With
    ``prices`` the fleet reads what their idle time costs, their idle vCPUs billed with ``held``."""
    policy = GapPolicy(min_samples=3, cap=100, floor_cold_starts=20.0, min_ms=0.0)
    adaptive = AdaptiveKeepAlive(policy, lambda s, h: cold_ms)
    times = [float(t) for t in range(0, 3001, 10) if not waves or t <= 1000 or t >= 2500]
    for t in times:
        adaptive.waves.observe("a", t)
    assert adaptive.waves.in_waves("a") == waves
    fleet = Fleet((Node("n0", 4, max_workers=8),), (), 60_000.0, adaptive=adaptive)
    fleet.scale_down_waves = 0.5
    fleet.prices, fleet.idle_vcpus = prices, held
    cfg = Config(1, 1, 0.0)
    ws = [fleet.acquire(Placement("n0", None, None, 4), "a", cfg, "cpu", 3000.0) for _ in range(2)]
    if prewarmed:
        spare = fleet.prewarm(Placement("n0", None, None, 4), "a", cfg, "cpu", 3000.0)
    else:
        ws.append(fleet.acquire(Placement("n0", None, None, 4), "a", cfg, "cpu", 3000.0))
    t = 3100.0
    if prewarmed:
        fleet.warmed(spare, t - 10.0)  # idle since the start's beginning (3,000), no batch yet
    for i, w in enumerate(ws):
        t = 3100.0 + 10.0 * i
        fleet.finish(w, BatchRecord(f"b{i}", w.worker_id, (BatchItem("r", "r"),), cfg, "cpu", 3000.0, t), t)
    return fleet, ([spare] if prewarmed else []) + ws, t


def test_in_waves_the_workers_a_stage_s_load_no_longer_needs_go_once_idle_a_lull() -> None:
    """One worker is needed at 50 % (the busy average is about 0.06); the two that idled longest go 440 ms (a 400 ms
    lull and the 10 % margin) into their idle time, under the 2 s floor; the most recently idle keeps the window."""
    fleet, (w1, w2, w3), t = _wave_fleet(waves=True)
    assert fleet.adaptive is not None and fleet.adaptive.lull_ms("a", "cpu") == pytest.approx(440.0)
    assert [w.worker_id for w in fleet.expire(3539.0)] == []
    assert [w.worker_id for w in fleet.expire(3540.0)] == [w1.worker_id]
    assert [w.worker_id for w in fleet.expire(3550.0)] == [w2.worker_id]
    assert fleet.next_expiry_ms() == t + 60_000.0 and list(fleet.workers) == [w3.worker_id]


def test_a_surplus_worker_slow_to_start_idles_two_of_its_cold_starts_first() -> None:
    """With 300 ms cold starts (floor 6 s), a lull's 440 ms is less than two restarts: the surplus goes at 600 ms."""
    fleet, (w1, w2, _), _ = _wave_fleet(waves=True, cold_ms=300.0)
    assert fleet.adaptive is not None and fleet.adaptive.lull_ms("a", "cpu") == pytest.approx(600.0)
    assert [w.worker_id for w in fleet.expire(3699.0)] == []
    assert [w.worker_id for w in fleet.expire(3710.0)] == [w1.worker_id, w2.worker_id]


def test_a_steady_stage_and_a_pre_warmed_worker_keep_the_usual_rule() -> None:
    """The same three workers of a stage whose calls never pause keep the fixed window (too few gaps for the
    histogram; scale_down_utilization is off). In waves, a pre-warmed worker with no batch yet is not surplus to cut:
    it keeps its window while the longest-idle worker with batches goes after the lull."""
    fleet, _, _ = _wave_fleet(waves=False)
    assert fleet.next_expiry_ms() == 3100.0 + 60_000.0
    assert fleet.expire(10_000.0) == []
    fleet, (spare, w1, w2), _ = _wave_fleet(waves=True, prewarmed=True)
    assert spare.fresh and not w1.fresh
    assert [w.worker_id for w in fleet.expire(3540.0)] == [w1.worker_id]
    assert fleet.expire(50_000.0) == [] and set(fleet.workers) == {spare.worker_id, w2.worker_id}


def test_scale_down_passes_over_a_worker_whose_idle_time_is_free() -> None:
    """With a price sheet and idle vCPUs unbilled the three CPU workers idle for free: none is cut after the lull,
    each keeps the 60 s window. Billed idle (``idle_vcpus``), the two that idled longest go at 3,540 and 3,550."""
    fleet, (w1, w2, w3), t = _wave_fleet(waves=True, prices=PriceSheet(1e-5, {}))
    assert all(w.idle_free for w in (w1, w2, w3))
    assert fleet.next_expiry_ms() == 3100.0 + 60_000.0 and fleet.expire(t + 59_000.0) == []
    fleet, (w1, w2, w3), t = _wave_fleet(waves=True, prices=PriceSheet(1e-5, {}), held=True)
    assert not w1.idle_free
    assert [w.worker_id for w in fleet.expire(3550.0)] == [w1.worker_id, w2.worker_id]
    assert fleet.next_expiry_ms() == t + 60_000.0


def test_a_worker_s_idle_price_is_read_once_as_it_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether idle time is free is decided when a worker starts and kept on it: its many idle events (a batch's
    end, scale-down, expiry) read no price. One read per worker started, the pre-warmed one included."""
    import esg_prefect.control.fleet as fleet_module

    reads: list[str] = []
    real = fleet_module.idle_rates

    def counted(*args: object, **kw: object) -> tuple[float, float]:
        reads.append(str(args[3]))
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(fleet_module, "idle_rates", counted)
    fleet, ws, t = _wave_fleet(waves=True, prewarmed=True, prices=PriceSheet(1e-5, {}), held=True)
    assert reads == ["cpu"] * 3  # two acquired, one pre-warmed
    fleet.expire(3550.0)
    fleet.expire(t + 59_000.0)
    for w in fleet.workers.values():
        fleet.keep_alive_of(w)
    assert len(reads) == 3 and not any(w.idle_free for w in ws)


def test_scale_down_waves_out_of_range_is_named_and_reaches_the_fleet() -> None:
    for bad in (-0.1, 1.5, float("nan"), True, "0.5"):
        with pytest.raises(ConfigError, match="scale_down_waves"):
            ESGSettings(scale_down_waves=bad)  # type: ignore[arg-type]
    assert _core(SETTINGS).fleet.scale_down_waves == 0.5  # on by default
    assert _core(replace(SETTINGS, scale_down_waves=0.0)).fleet.scale_down_waves == 0.0


def test_scale_down_utilization_out_of_range_is_named() -> None:
    for bad in (-0.1, 1.5, float("nan"), True):
        with pytest.raises(ConfigError, match="scale_down_utilization"):
            ESGSettings(scale_down_utilization=bad)


def test_the_core_hands_the_scale_down_setting_to_its_fleet() -> None:
    assert _core(replace(SETTINGS, scale_down_utilization=0.5)).fleet.scale_down_utilization == 0.5
    assert _core(SETTINGS).fleet.scale_down_utilization == 0.0  # off by default


class _AtRisk(Simple):
    """Simple's dispatches, marked best effort while ``at_risk`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.at_risk = False

    def decide(self, snapshot: Snapshot, now_ms: float) -> SchedulingResult:
        res = super().decide(snapshot, now_ms)
        return replace(res, dispatches=tuple(replace(d, at_risk=self.at_risk) for d in res.dispatches))


def _best_effort_keep(
    settings: ESGSettings, spare: bool = True, planned_reuse: bool = False, idle_vcpus: bool = True
) -> float:
    """A worker started for a best-effort batch: how long it is kept after its last batch (cold start 10 ms).

    Its idle vCPUs are billed (``idle_vcpus``) unless asked: a worker whose idle time is free keeps the fixed window.
    """
    settings = replace(settings, idle_vcpus=idle_vcpus)
    fleet = Fleet((Node("n0", 4, max_workers=8),), (), settings.keep_alive_s * 1000.0)
    sched = _AtRisk()
    core = Core(sched, CandidateTables(COLD_PROFILE, PriceSheet(1e-5, {}), settings), fleet, settings.platform,
                {"wf": CHAIN})  # type: ignore[arg-type]  # fmt: skip
    if spare:  # another worker of the stage, busy throughout: ours is not the stage's last
        core.arrive(CallArrived("hold", "rh", "rh", "wf", "a", 0.0))
        core.settle(0.0)
    sched.at_risk = True
    core.arrive(CallArrived("j0", "r0", "r0", "wf", "a", 1.0))
    (start,) = [a for a in core.settle(1.0) if isinstance(a, StartBatch)]
    assert start.cold and start.dispatch.at_risk
    me, t = start.worker.worker_id, 21.0
    core.finished(BatchFinished(start.batch_id, t))
    core.settle(t)
    if planned_reuse:  # a planned batch on it: it is an ordinary worker from now on
        sched.at_risk = False
        core.arrive(CallArrived("j1", "r1", "r1", "wf", "a", 25.0))
        (again,) = [a for a in core.settle(25.0) if isinstance(a, StartBatch)]
        assert again.worker.worker_id == me and not again.cold
        t = 36.0
        core.finished(BatchFinished(again.batch_id, t))
        core.settle(t)
    at = fleet.next_expiry_ms()  # the spare is busy: the next expiry is ours
    assert at is not None and [w.worker_id for w in fleet.expire(at)] == [me]
    return at - t


def test_a_worker_started_best_effort_is_kept_two_cold_starts_unless_a_plan_uses_it() -> None:
    assert SETTINGS.best_effort_keep_alive == 2.0 and KEEP_MS == 1000.0
    assert _best_effort_keep(SETTINGS) == 20.0  # 2 x its 10 ms cold start, not the 1 s window
    assert _best_effort_keep(SETTINGS, planned_reuse=True) == 1000.0
    assert _best_effort_keep(SETTINGS, spare=False) == 1000.0  # a stage's last worker keeps the window
    assert _best_effort_keep(replace(SETTINGS, best_effort_keep_alive=0.0)) == 1000.0  # off
    assert _best_effort_keep(replace(SETTINGS, best_effort_keep_alive=5.0)) == 50.0


def _cold_starts(core: Core, lull_ms: float, gap_ms: float = 50.0) -> int:
    """Cold starts in all when :func:`_run`'s worker (a busy spare beside it) is reused 20 times after ``gap_ms`` idle,
    then once more after ``lull_ms``: 2 when it stays warm throughout, the spare's included."""
    core.arrive(CallArrived("hold", "rh", "rh", "wf", "a", 0.0))
    core.settle(0.0)
    t = 0.0
    for i in range(22):
        t += 0.0 if i == 0 else (lull_ms if i == 21 else gap_ms)
        core.settle(t)  # the expiries due by now
        core.arrive(CallArrived(f"j{i}", f"r{i}", f"r{i}", "wf", "a", t))
        (start,) = [a for a in core.settle(t) if isinstance(a, StartBatch)]
        t += 11.0
        core.finished(BatchFinished(start.batch_id, t))
        core.settle(t)
    return core.fleet.cold_starts


def test_a_worker_whose_idle_time_is_free_keeps_the_fixed_window_through_a_lull() -> None:
    """Billed idle, 20 gaps of 50 ms put the worker's keep-alive at the 1 s least (no cold-start floor): a 30 s lull
    ends it and the next call starts cold. With idle vCPUs unbilled (the default) a CPU worker's idle time costs
    nothing, so stopping it early saves nothing: it keeps the 60 s window and the call after the lull finds it warm;
    the window still ends it (it holds a worker slot)."""
    bare = replace(
        SETTINGS, keep_alive_s=60.0, keep_alive_cold_starts=0.0, scale_down_utilization=0.0, scale_down_waves=0.0
    )
    assert _run(_core(bare), 20) == pytest.approx(1000.0)
    assert _cold_starts(_core(bare), 30_000.0) == 3
    assert _run(_core(bare, idle_vcpus=False), 20) == 60_000.0
    assert _cold_starts(_core(bare, idle_vcpus=False), 30_000.0) == 2
    # Once the stage reads as in waves, scale-down stops a billed surplus worker after a 440 ms lull, so 500 ms gaps
    # cost restarts. Free, it stays; so it does under scale-down by utilisation and the best-effort rule.
    down = replace(bare, scale_down_utilization=0.5, scale_down_waves=0.5)
    assert _cold_starts(_core(down), 500.0, gap_ms=500.0) > 2
    assert _cold_starts(_core(down, idle_vcpus=False), 30_000.0, gap_ms=500.0) == 2
    assert _run(_core(down, idle_vcpus=False), 20, gap_ms=500.0) == 60_000.0
    assert _best_effort_keep(SETTINGS) == 20.0
    assert _best_effort_keep(SETTINGS, idle_vcpus=False) == KEEP_MS


def test_best_effort_keep_alive_out_of_range_is_named() -> None:
    for bad in (-1.0, float("inf"), float("nan"), True):
        with pytest.raises(ConfigError, match="best_effort_keep_alive"):
            ESGSettings(best_effort_keep_alive=bad)


def test_keep_alive_by_price_scales_the_histograms_keep_alive_too() -> None:
    """Once the stage's gaps set the keep-alive, a worker on a type ten times the cheapest's price keeps a tenth."""
    from esg_prefect.model.cluster import Device

    policy = GapPolicy(min_samples=3, cap=100, floor_cold_starts=2.0, min_ms=0.0)
    devices = (Device("n0/gpu0", "n0", "T4"), Device("n0/gpu1", "n0", "A100"))
    fleet = Fleet((Node("n0", 8, max_workers=8),), devices, 60_000.0)
    fleet.adaptive = AdaptiveKeepAlive(policy, lambda stage, hw: 100.0)  # floor: 200 ms on either type
    fleet.prices = PriceSheet(0.01, {"T4": 0.5, "A100": 5.0})  # GPU shares: their idle time is billed
    fleet.set_keep_alive(60_000.0, fleet.prices.keep_alive_scales({"T4", "A100"}))
    cfg = Config(1, 1, 0.5)
    t4 = fleet.acquire(Placement("n0", "n0/gpu0", None, 4), "a", cfg, "T4", 0.0)
    a100 = fleet.acquire(Placement("n0", "n0/gpu1", None, 4), "a", cfg, "A100", 0.0)
    item = (BatchItem("r", "r"),)
    # Before the stage has gaps enough: the fixed window, by price (60 s and 6 s).
    assert fleet.finish(a100, BatchRecord("a0", a100.worker_id, item, cfg, "A100", 0.0, 10.0), 10.0) == 6_010.0
    t = 0.0
    for i in range(4):  # the T4 worker's reuses: 50 ms gaps fill the histogram (its percentile is under the floor)
        if i:
            t += 50.0
            fleet.acquire(Placement("n0", "n0/gpu0", t4.worker_id, 1), "a", cfg, "T4", t)
        fleet.finish(t4, BatchRecord(f"t{i}", t4.worker_id, item, cfg, "T4", t, t + 10.0), t + 10.0)
        t += 10.0
    assert fleet.keep_alive_of(t4) == 200.0  # the floor, whole on the cheapest type
    assert fleet.keep_alive_of(a100) == pytest.approx(20.0)  # a tenth of it on a type ten times dearer
    fleet.set_keep_alive(60_000.0)  # keep_alive_by_price off: no scale
    assert fleet.keep_alive_of(a100) == 200.0
