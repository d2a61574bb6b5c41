"""Dominator segments and SLO budgets (ESG-SPEC section 4), on hand-worked examples.

Latencies are chosen so that every weight fraction is a power-of-two fraction, so
the budgets and deadlines are exact in floating point and compared with ``==``.
"""

from __future__ import annotations

import pytest

from esg_prefect.exceptions import WorkflowError
from esg_prefect.model.slo import Segment, SLODistribution, critical_path, dominator_segments
from esg_prefect.model.workflow import Workflow


def seg_stages(wf: Workflow) -> list[tuple[tuple[str, ...], bool]]:
    """(stages, is_region) of each segment, checking the indices run 0, 1, 2, ..."""
    segs = dominator_segments(wf)
    assert [s.index for s in segs] == list(range(len(segs)))
    return [(s.stages, s.is_region) for s in segs]


def nested() -> Workflow:
    """a -> {b -> {c1, c2} -> d, e} -> f: a fork-join (b..d) inside a branch of another."""
    edges = [("a", "b"), ("a", "e"), ("b", "c1"), ("b", "c2"), ("c1", "d"), ("c2", "d"), ("d", "f"), ("e", "f")]
    return Workflow("nest", ["a", "b", "c1", "c2", "d", "e", "f"], edges, 64)


def diamond(slo_ms: float = 128) -> Workflow:
    return Workflow("dia", ["a", "b", "c", "d"], [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")], slo_ms)


# ---- dominator_segments -------------------------------------------------------


def test_chain_every_stage_is_its_own_segment() -> None:
    wf = Workflow.chain("c", ["a", "b", "c"], 10)
    assert seg_stages(wf) == [(("a",), False), (("b",), False), (("c",), False)]


def test_single_stage_is_one_dominator_segment() -> None:
    assert dominator_segments(Workflow.chain("one", ["x"], 10)) == (Segment(0, ("x",), False),)


def test_diamond_is_dominator_region_dominator() -> None:
    assert seg_stages(diamond()) == [(("a",), False), (("b", "c"), True), (("d",), False)]


def test_nested_fork_join_stays_inside_the_outer_region() -> None:
    # b and d dominate only their own branch, not the sink (e bypasses them): one outer region
    assert seg_stages(nested()) == [(("a",), False), (("b", "c1", "c2", "d", "e"), True), (("f",), False)]


def test_multiple_entries_form_a_leading_region() -> None:
    wf = Workflow("me", ["x", "y", "z"], [("x", "z"), ("y", "z")], 80)
    assert seg_stages(wf) == [(("x", "y"), True), (("z",), False)]


def test_multiple_exits_form_a_trailing_region() -> None:
    wf = Workflow("mx", ["a", "b", "c"], [("a", "b"), ("a", "c")], 40)
    assert seg_stages(wf) == [(("a",), False), (("b", "c"), True)]


def test_multiple_entries_and_exits() -> None:
    wf = Workflow("mm", ["a", "b", "c", "d", "e"], [("a", "c"), ("b", "c"), ("c", "d"), ("c", "e")], 10)
    assert seg_stages(wf) == [(("a", "b"), True), (("c",), False), (("d", "e"), True)]


def test_disjoint_chains_have_no_dominator_and_form_one_region() -> None:
    # a -> c and b -> d share nothing: the virtual source is the only dominator of the sink
    wf = Workflow("two", ["a", "b", "c", "d"], [("a", "c"), ("b", "d")], 10)
    assert seg_stages(wf) == [(("a", "b", "c", "d"), True)]


def test_chain_then_diamond_then_chain() -> None:
    edges = [("s", "a"), ("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"), ("d", "t")]
    wf = Workflow("mix", ["s", "a", "b", "c", "d", "t"], edges, 10)
    stages = [s for s, _ in seg_stages(wf)]
    assert stages == [("s",), ("a",), ("b", "c"), ("d",), ("t",)]


# ---- critical_path ------------------------------------------------------------


def test_critical_path_picks_the_heaviest_branch_of_the_nested_region() -> None:
    lat = {"b": 2.0, "c1": 3.0, "c2": 6.0, "d": 2.0, "e": 9.0}
    # b-c2-d = 10 beats e = 9 and b-c1-d = 7
    assert critical_path(nested(), ("b", "c1", "c2", "d", "e"), lat) == ("b", "c2", "d")
    # starting at e only e itself is reachable inside the region
    assert critical_path(nested(), ("b", "c1", "c2", "d", "e"), lat, start="e") == ("e",)


# ---- budgets and deadlines ----------------------------------------------------


def test_chain_budgets_are_proportional_to_min_latency() -> None:
    wf = Workflow.chain("c", ["a", "b", "c"], 160)
    slo = SLODistribution(wf, {"a": 1.0, "b": 3.0, "c": 4.0})
    assert slo.weights == (1.0, 3.0, 4.0)
    # 160 * 1/8, 160 * 3/8, 160 * 4/8
    assert slo.budgets_ms == (20.0, 60.0, 80.0)
    # arrival 1000 plus cumulative budgets 20, 80, 160
    assert [slo.deadline_ms(s, 1000.0) for s in "abc"] == [1020.0, 1080.0, 1160.0]
    assert slo.e2e_deadline_ms(1000.0) == 1160.0


def test_diamond_region_weight_is_its_critical_path_and_branches_share_it() -> None:
    slo = SLODistribution(diamond(128), {"a": 4.0, "b": 8.0, "c": 2.0, "d": 4.0})
    # region weight = max(b, c) = 8, total 4 + 8 + 4 = 16
    assert slo.weights == (4.0, 8.0, 4.0)
    # 128 * 4/16, 128 * 8/16, 128 * 4/16
    assert slo.budgets_ms == (32.0, 64.0, 32.0)
    # both parallel branches get the whole region budget: same deadline 0 + 32 + 64
    assert slo.deadline_ms("b", 0.0) == slo.deadline_ms("c", 0.0) == 96.0
    assert slo.deadline_ms("d", 0.0) == 128.0


def test_nested_region_weight_follows_the_inner_fork_join() -> None:
    lat = {"a": 4.0, "b": 2.0, "c1": 3.0, "c2": 6.0, "d": 2.0, "e": 9.0, "f": 2.0}
    slo = SLODistribution(nested(), lat)
    # region critical path b + c2 + d = 10 (not e = 9); total 4 + 10 + 2 = 16
    assert slo.weights == (4.0, 10.0, 2.0)
    # 64 * 4/16, 64 * 10/16, 64 * 2/16
    assert slo.budgets_ms == (16.0, 40.0, 8.0)
    assert {s: slo.deadline_ms(s, 0.0) for s in ("c1", "e", "f")} == {"c1": 56.0, "e": 56.0, "f": 64.0}
    assert slo.segment_of("c2") == Segment(1, ("b", "c1", "c2", "d", "e"), True)


def test_multiple_entries_budget() -> None:
    wf = Workflow("me", ["x", "y", "z"], [("x", "z"), ("y", "z")], 80)
    slo = SLODistribution(wf, {"x": 3.0, "y": 5.0, "z": 3.0})
    # entry region weight max(3, 5) = 5, total 8: 80 * 5/8 and 80 * 3/8
    assert slo.budgets_ms == (50.0, 30.0)
    assert slo.deadline_ms("x", 10.0) == slo.deadline_ms("y", 10.0) == 60.0


def test_multiple_exits_budget() -> None:
    wf = Workflow("mx", ["a", "b", "c"], [("a", "b"), ("a", "c")], 40)
    slo = SLODistribution(wf, {"a": 2.0, "b": 6.0, "c": 4.0})
    # weights 2 and max(6, 4) = 6, total 8: 40 * 2/8 and 40 * 6/8
    assert slo.budgets_ms == (10.0, 30.0)


def test_multiple_entries_and_exits_budget() -> None:
    wf = Workflow("mm", ["a", "b", "c", "d", "e"], [("a", "c"), ("b", "c"), ("c", "d"), ("c", "e")], 32)
    slo = SLODistribution(wf, {"a": 1.0, "b": 2.0, "c": 4.0, "d": 1.0, "e": 2.0})
    # weights max(1, 2) = 2, 4, max(1, 2) = 2; total 8: 32 * 2/8, 32 * 4/8, 32 * 2/8
    assert slo.budgets_ms == (8.0, 16.0, 8.0)


def test_single_stage_gets_the_whole_slo() -> None:
    slo = SLODistribution(Workflow.chain("one", ["x"], 75), {"x": 12.0})
    assert slo.budgets_ms == (75.0,)
    assert slo.deadline_ms("x", 5.0) == 80.0


def test_all_zero_weights_split_evenly() -> None:
    slo = SLODistribution(Workflow.chain("z", ["a", "b", "c", "d"], 100), dict.fromkeys("abcd", 0.0))
    assert slo.weights == (0.0, 0.0, 0.0, 0.0)
    # 100 / 4 segments
    assert slo.budgets_ms == (25.0, 25.0, 25.0, 25.0)
    # redistribution with zero weights splits evenly too: c and d are left, c gets 1/2 of the 60 ms left
    assert slo.deadline_after("c", 0.0, 40.0) == 70.0


def test_a_zero_weight_stage_gets_a_zero_budget() -> None:
    slo = SLODistribution(Workflow.chain("z", ["a", "b"], 100), {"a": 0.0, "b": 5.0})
    assert slo.budgets_ms == (0.0, 100.0)


def test_extra_latencies_for_unknown_stages_are_ignored() -> None:
    slo = SLODistribution(Workflow.chain("c", ["a"], 10), {"a": 1.0, "ghost": 50.0})
    assert slo.budgets_ms == (10.0,)


# ---- runtime slack redistribution ---------------------------------------------


def chain_211() -> Workflow:
    """a, b, c with min latencies 2, 1, 1 and SLO 80: budgets 40, 20, 20; static deadlines 40, 60, 80."""
    return Workflow.chain("r", ["a", "b", "c"], 80)


@pytest.mark.parametrize(
    ("ready_ms", "expected"),
    [
        (40.0, 60.0),  # on time: 40 left, b's share 1/2 -> 40 + 20, the static deadline
        (50.0, 65.0),  # late: 30 left -> 50 + 15, later than static 60
        (30.0, 55.0),  # early: 50 left -> 30 + 25, slack shared with c
    ],
)
def test_redistribution_splits_the_time_left_by_remaining_weights(ready_ms: float, expected: float) -> None:
    slo = SLODistribution(chain_211(), {"a": 2.0, "b": 1.0, "c": 1.0})
    assert slo.deadline_ms("b", 0.0) == 60.0
    assert slo.deadline_after("b", 0.0, ready_ms) == expected


def test_redistribution_gives_the_last_segment_the_e2e_deadline() -> None:
    slo = SLODistribution(chain_211(), {"a": 2.0, "b": 1.0, "c": 1.0})
    # c is the only segment left: share 1/1, whatever the ready time
    assert slo.deadline_after("c", 0.0, 70.0) == 80.0
    assert slo.deadline_after("c", 0.0, 90.0) == 80.0


def test_redistribution_off_keeps_static_deadlines() -> None:
    slo = SLODistribution(chain_211(), {"a": 2.0, "b": 1.0, "c": 1.0}, redistribute=False)
    assert slo.deadline_after("b", 0.0, 50.0) == 60.0
    assert slo.deadline_after("c", 0.0, 70.0) == 80.0


def region_with_tail() -> Workflow:
    """a -> {b -> b2, c} -> d: region heads b and c, non-head b2."""
    edges = [("a", "b"), ("b", "b2"), ("a", "c"), ("b2", "d"), ("c", "d")]
    return Workflow("rt", ["a", "b", "b2", "c", "d"], edges, 64)


def test_every_stage_of_a_region_shares_the_redistributed_deadline() -> None:
    lat = {"a": 16.0, "b": 6.0, "b2": 6.0, "c": 5.0, "d": 4.0}
    slo = SLODistribution(region_with_tail(), lat)
    # weights 16, max(6 + 6, 5) = 12, 4; total 32: budgets 32, 24, 8; region static deadline 56
    assert slo.budgets_ms == (32.0, 24.0, 8.0)
    # head b ready at 40: 24 left, share 12/16 -> 40 + 18; head c agrees
    assert slo.deadline_after("b", 0.0, 40.0) == 58.0
    assert slo.deadline_after("c", 0.0, 40.0) == 58.0
    # b2 is in the same region, which started at 40: the same deadline as its heads, so a late
    # region never gives a later stage an earlier deadline than the stage before it
    assert slo.deadline_after("b2", 0.0, 40.0) == 58.0
    # without redistribution every stage of the region keeps the static 56
    static = SLODistribution(region_with_tail(), lat, redistribute=False)
    assert [static.deadline_after(s, 0.0, 40.0) for s in ("b", "b2", "c")] == [56.0, 56.0, 56.0]


# ---- errors -------------------------------------------------------------------


def test_missing_min_latency_names_the_stage() -> None:
    with pytest.raises(WorkflowError, match="no minimum latency for stage 'b'"):
        SLODistribution(Workflow.chain("c", ["a", "b"], 10), {"a": 1.0})


@pytest.mark.parametrize(("value", "shown"), [(-1.0, "-1.0"), (float("nan"), "nan"), (float("inf"), "inf")])
def test_negative_or_non_finite_min_latency_is_named(value: float, shown: str) -> None:
    with pytest.raises(WorkflowError, match=f"min latency of 'b' must be >= 0, got {shown}"):
        SLODistribution(Workflow.chain("c", ["a", "b"], 10), {"a": 1.0, "b": value})


@pytest.mark.parametrize("call", ["segment_of", "deadline_ms", "deadline_after"])
def test_unknown_stage_is_named(call: str) -> None:
    slo = SLODistribution(Workflow.chain("c", ["a"], 10), {"a": 1.0})
    args = {"segment_of": ("zz",), "deadline_ms": ("zz", 0.0), "deadline_after": ("zz", 0.0, 1.0)}[call]
    with pytest.raises(WorkflowError, match="workflow 'c' has no stage 'zz'"):
        getattr(slo, call)(*args)
