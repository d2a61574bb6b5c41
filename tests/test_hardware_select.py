"""PALDIA's hardware selection (esg_prefect/scheduling/hardware.py): cheapest type that carries the load."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from esg_prefect.exceptions import ConfigError
from esg_prefect.model import ClusterSnapshot, ConfigSpace, Device, LatencyProfile, Node, PriceSheet, ProfilePoint
from esg_prefect.model.jobs import QueueKey
from esg_prefect.model.workflow import Workflow
from esg_prefect.scheduling.base import QueueState, Snapshot
from esg_prefect.scheduling.esg import ESGScheduler
from esg_prefect.scheduling.hardware import HardwareSelector
from esg_prefect.scheduling.settings import ESGSettings
from esg_prefect.scheduling.tables import CandidateTables
from esg_prefect.simulator import simulate
from esg_prefect.simulator.standard import tiny_case

PRICES = PriceSheet.from_hourly(0.04, {"T4": 0.35, "A100": 3.67})


def tables(
    points: list[ProfilePoint], shares: tuple[float, ...] = (0.0, 1.0), prices: PriceSheet = PRICES
) -> CandidateTables:
    space = ConfigSpace((1, 2, 4, 8), (1,), shares)
    return CandidateTables(LatencyProfile(points), prices, ESGSettings(config_space=space))


def cpu_and_t4() -> CandidateTables:
    # CPU: 20 ms per item, no batching gain; T4: 2 ms + 1 ms per item on a whole GPU.
    pts = [ProfilePoint("m", "cpu", b, 1, 0.0, 20.0 * b) for b in (1, 2, 4, 8)]
    pts += [ProfilePoint("m", "T4", b, 1, 1.0, 2.0 + b) for b in (1, 2, 4, 8)]
    return tables(pts)


def t4_and_a100() -> CandidateTables:
    # A100 three times as fast as a T4, ten times the price.
    pts = [ProfilePoint("m", "T4", b, 1, 1.0, 6.0 * (1 + b)) for b in (1, 2, 4, 8)]
    pts += [ProfilePoint("m", "A100", b, 1, 1.0, 2.0 * (1 + b)) for b in (1, 2, 4, 8)]
    return tables(pts, shares=(1.0,))


WF = Workflow.chain("w", ["m"], slo_ms=100)


def test_cpu_at_low_load_gpu_as_load_rises() -> None:
    sel = HardwareSelector(cpu_and_t4(), utilization=0.7)
    cluster = ClusterSnapshot([Node("n", 4)], [Device("n/gpu0", "n", "T4")])
    # At 10/s only batch 1 fits the 100 ms budget, and a CPU vCPU (20 ms) is cheaper than a whole T4 (3 ms).
    # At 100/s a batch of 8 fills in 70 ms and runs in 10 ms on the T4: cheaper per request than the CPU.
    picks = {rate: sel.select(WF, "m", rate, cluster).hardware for rate in (1.0, 10.0, 100.0, 800.0)}
    assert picks == {1.0: "cpu", 10.0: "cpu", 100.0: "T4", 800.0: "T4"}
    low = sel.select(WF, "m", 10.0, cluster)
    assert low.allowed == frozenset({"cpu", "T4"})  # the faster type stays allowed as overflow
    assert sel.select(WF, "m", 800.0, cluster).allowed == frozenset({"T4"})
    # 4 vCPUs carry 0.7 x 4 x 50 = 140/s; a GPU priced out of reach leaves the CPU the cheaper type,
    # until the load exceeds what the CPUs carry.
    dear = HardwareSelector(
        tables(list(cpu_and_t4().profile.points), prices=PriceSheet.from_hourly(0.04, {"T4": 100.0}))
    )
    picks = {rate: dear.select(WF, "m", rate, cluster).hardware for rate in (10.0, 130.0, 150.0)}
    assert picks == {10.0: "cpu", 130.0: "cpu", 150.0: "T4"}


def test_t4_then_a100_as_load_rises() -> None:
    sel = HardwareSelector(t4_and_a100(), utilization=0.7)
    cluster = ClusterSnapshot(
        [Node("n", 32)], [Device("n/gpu0", "n", "T4"), Device("n/gpu1", "n", "T4"), Device("n/gpu2", "n", "A100")]
    )
    caps = {c.hardware: c for c in sel.capacities(WF, "m", 300.0, cluster)}
    assert caps["T4"].cost_per_request < caps["A100"].cost_per_request
    assert caps["A100"].per_unit_per_s > caps["T4"].per_unit_per_s
    low, high = sel.select(WF, "m", 50.0, cluster), sel.select(WF, "m", 900.0, cluster)
    assert (low.hardware, high.hardware) == ("T4", "A100")
    assert high.allowed == frozenset({"A100"})


def test_pools_are_shared_among_queues() -> None:
    """Two queues that each fit the T4 pool alone do not both fit: the busier keeps T4, the other moves."""
    t = t4_and_a100()
    sel = HardwareSelector(t, utilization=0.7)
    cluster = ClusterSnapshot([Node("n", 32)], [Device("n/gpu0", "n", "T4"), Device("n/gpu1", "n", "A100")])
    per_t4 = sel.capacities(WF, "m", 60.0, cluster)[0]
    assert per_t4.hardware == "T4"
    rate = 0.6 * per_t4.capacity_per_s  # each alone fits in 0.7 of the T4 pool; two do not
    wfs = {"w": WF, "v": Workflow.chain("v", ["m"], slo_ms=100)}
    qa, qb = QueueKey("w", "m"), QueueKey("v", "m")
    sel.observe(Snapshot((QueueState(qa, (), rate), QueueState(qb, (), rate * 0.9)), cluster, wfs), 0.0)
    a, b = sel.selection(qa), sel.selection(qb)
    assert a is not None and b is not None
    assert (a.hardware, b.hardware) == ("T4", "A100")


def test_selections_stick_while_they_fit_and_move_down_only_with_margin() -> None:
    """Two queues competing for the T4 pool do not swap types when the busier one changes.

    Without stickiness the busiest-first pass hands the cheap pool to whichever
    queue is busier this round, so near equal loads the two swap types back and
    forth, each swap starting workers on the new type.
    """
    t = t4_and_a100()
    sel = HardwareSelector(t, utilization=0.7)
    cluster = ClusterSnapshot([Node("n", 32)], [Device("n/gpu0", "n", "T4"), Device("n/gpu1", "n", "A100")])
    per_t4 = sel.capacities(WF, "m", 60.0, cluster)[0]
    rate = 0.6 * per_t4.capacity_per_s
    wfs = {"w": WF, "v": Workflow.chain("v", ["m"], slo_ms=100)}
    qa, qb = QueueKey("w", "m"), QueueKey("v", "m")

    def at(t_s: float, ra: float, rb: float) -> tuple[str | None, str | None]:
        sel.observe(Snapshot((QueueState(qa, (), ra), QueueState(qb, (), rb)), cluster, wfs), t_s * 1000.0)
        a, b = sel.selection(qa), sel.selection(qb)
        assert a is not None and b is not None
        return a.hardware, b.hardware

    assert at(0, rate, rate * 0.9) == ("T4", "A100")
    assert at(10, rate * 0.8, rate * 1.1) == ("T4", "A100")  # b is now the busier one: no swap, a still fits
    assert at(20, rate * 1.5, rate * 1.1) == ("A100", "A100")  # a outgrows T4: it moves up at once
    # a's load falls: it moves back down. b would now fit what is left of T4, but not with the margin: it stays...
    assert at(30, rate * 0.1, rate) == ("T4", "A100")
    assert at(40, rate * 0.1, rate * 0.7) == ("T4", "T4")  # ...until it fits with room to spare


def test_types_about_as_cheap_stay_allowed() -> None:
    """A slower type within 10 % of the selected one's cost per request stays usable; a dearer one does not.

    Forbidding a type that costs the same only takes placement room away from
    ESG (on the heterogeneous case, pinning a ResNeXt stage to the two A100s
    tripled the workers started for no saving).
    """
    pts = []
    for hw, per_item in (("T4", 6.0), ("L4", 6.3), ("K80", 12.0)):
        pts += [ProfilePoint("m", hw, b, 1, 1.0, per_item * (1 + b)) for b in (1, 2, 4, 8)]
    prices = PriceSheet.from_hourly(0.04, {"T4": 0.35, "L4": 0.35, "K80": 0.35})
    sel = HardwareSelector(tables(pts, shares=(1.0,), prices=prices), utilization=0.7)
    cluster = ClusterSnapshot(
        [Node("n", 32)], [Device("n/g0", "n", "T4"), Device("n/g1", "n", "L4"), Device("n/g2", "n", "K80")]
    )
    got = sel.select(WF, "m", 20.0, cluster)
    assert got.hardware == "T4"
    assert got.allowed == frozenset({"T4", "L4"})


def test_restrict_filters_and_keeps_identity() -> None:
    t = cpu_and_t4()
    sel = HardwareSelector(t, utilization=0.7)
    cluster = ClusterSnapshot([Node("n", 4)], [Device("n/gpu0", "n", "T4")])
    q = QueueKey("w", "m")
    res = (("T4", 1, 1.0, False), ("cpu", 1, 0.0, False))
    assert sel.restrict(q, res) is res  # nothing observed yet: not restricted
    sel.observe(Snapshot((QueueState(q, (), 500.0),), cluster, {"w": WF}), 0.0)
    got = sel.restrict(q, res)
    assert got == (("T4", 1, 1.0, False),)
    assert sel.restrict(q, res) is got  # same input, same object: ESG's answer cache still hits
    only_cpu = (("cpu", 1, 0.0, False),)
    assert sel.restrict(q, only_cpu) is only_cpu  # nothing placeable on the allowed types: ESG's choice stands


def test_re_evaluated_as_the_rate_moves() -> None:
    sel = HardwareSelector(cpu_and_t4(), utilization=0.7)
    cluster = ClusterSnapshot([Node("n", 4)], [Device("n/gpu0", "n", "T4")])
    q = QueueKey("w", "m")
    seen = []
    for t_s, rate in ((0, 5.0), (10, 400.0), (20, 5.0)):  # far apart: the smoothed load follows
        sel.observe(Snapshot((QueueState(q, (), rate),), cluster, {"w": WF}), t_s * 1000.0)
        s = sel.selection(q)
        assert s is not None
        seen.append(s.hardware)
    assert seen == ["cpu", "T4", "cpu"]


def test_a_burst_does_not_move_the_selection() -> None:
    """The selector smooths the queue's rate over ~1 s: 50 ms of a 20x higher estimate barely moves it."""
    sel = HardwareSelector(cpu_and_t4(), utilization=0.7)
    cluster = ClusterSnapshot([Node("n", 4)], [Device("n/gpu0", "n", "T4")])
    q = QueueKey("w", "m")
    for t_ms, rate in ((0.0, 5.0), (5000.0, 5.0), (5050.0, 100.0)):
        sel.observe(Snapshot((QueueState(q, (), rate),), cluster, {"w": WF}), t_ms)
    s = sel.selection(q)
    assert s is not None and s.hardware == "cpu"
    assert sel._rates[q] == pytest.approx(5.0 + (1 - math.exp(-0.05)) * 95.0)


@pytest.mark.parametrize(
    ("knob", "value", "match"),
    [
        ("hardware_selection", "yes", "hardware_selection must be a bool, got 'yes'"),
        ("hardware_utilization", 0.0, r"hardware_utilization must be in \(0, 1\], got 0.0"),
        ("hardware_utilization", 1.5, r"hardware_utilization must be in \(0, 1\], got 1.5"),
        ("hardware_utilization", True, r"hardware_utilization must be in \(0, 1\], got True"),
    ],
)
def test_bad_knob_values_name_the_value(knob: str, value: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ESGSettings(**{knob: value})  # type: ignore[arg-type]


def test_selector_rejects_bad_utilization() -> None:
    with pytest.raises(ValueError, match="utilization must be in"):
        HardwareSelector(cpu_and_t4(), utilization=2.0)


def test_knobs_off_is_the_paper_esg() -> None:
    s = ESGSettings()
    assert (s.hardware_selection, s.hybrid_sharing) == (False, False)
    sched = ESGScheduler(LatencyProfile([ProfilePoint("m", "cpu", 1, 1, 0.0, 1.0)]), PRICES, s)
    assert sched._hardware is None and sched._review is None and sched._packing is None
    case = tiny_case()
    explicit = case.with_(settings=replace(case.settings, hardware_selection=False, hybrid_sharing=False))
    assert simulate(case).report == simulate(explicit).report


def test_selection_on_a_single_type_cluster_changes_nothing() -> None:
    """With one GPU type there is nothing to select: ESG + selection gives ESG's report."""
    case = tiny_case()
    on = case.with_(settings=replace(case.settings, hardware_selection=True))
    assert simulate(case).report == simulate(on).report
