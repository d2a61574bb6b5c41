"""Workflow: construction-time validation, graph queries, equality and pickling."""

from __future__ import annotations

import dataclasses
import pickle
import re

import pytest

from esg_prefect.exceptions import InvalidInputError, WorkflowError
from esg_prefect.model.workflow import Workflow


def diamond(slo_ms: float = 100.0) -> Workflow:
    """a -> {b, c} -> d, declared with c before b to test declaration-order ties."""
    return Workflow("dia", ["a", "c", "b", "d"], [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")], slo_ms)


# ---- validation ---------------------------------------------------------------


def test_empty_workflow_is_rejected_and_named() -> None:
    with pytest.raises(WorkflowError, match="workflow 'w' has no stages"):
        Workflow("w", [], [], 100)


@pytest.mark.parametrize("name", ["", None, 7])
def test_bad_workflow_name_is_rejected(name: object) -> None:
    with pytest.raises(WorkflowError, match=re.escape(f"got {name!r}")):
        Workflow(name, ["a"], [], 100)  # type: ignore[arg-type]


def test_duplicate_stage_name_is_named() -> None:
    with pytest.raises(WorkflowError, match="duplicate stage name 'b'"):
        Workflow("w", ["a", "b", "b"], [], 100)


@pytest.mark.parametrize("stage", ["", None])
def test_empty_stage_name_is_rejected(stage: object) -> None:
    with pytest.raises(WorkflowError, match=re.escape(f"non-empty strings, got {stage!r}")):
        Workflow("w", ["a", stage], [], 100)  # type: ignore[list-item]


@pytest.mark.parametrize(("edge", "unknown"), [(("a", "z"), "z"), (("y", "a"), "y")])
def test_edge_naming_unknown_stage_is_rejected(edge: tuple[str, str], unknown: str) -> None:
    with pytest.raises(WorkflowError, match=re.escape(f"names unknown stage {unknown!r}")):
        Workflow("w", ["a", "b"], [edge], 100)


def test_self_loop_is_rejected() -> None:
    with pytest.raises(WorkflowError, match="self-loop on stage 'b'"):
        Workflow("w", ["a", "b"], [("a", "b"), ("b", "b")], 100)


def test_cycle_is_rejected_and_shown() -> None:
    with pytest.raises(WorkflowError, match=re.escape("has a cycle: [('a', 'b'), ('b', 'c'), ('c', 'a')]")):
        Workflow("w", ["a", "b", "c"], [("a", "b"), ("b", "c"), ("c", "a")], 100)


@pytest.mark.parametrize("slo_ms", [0, -1.5])
def test_non_positive_slo_is_rejected(slo_ms: float) -> None:
    with pytest.raises(WorkflowError, match=re.escape(f"slo_ms must be > 0, got {slo_ms}")):
        Workflow("w", ["a"], [], slo_ms)


@pytest.mark.parametrize("slo_ms", [float("nan"), float("inf"), float("-inf"), True, "100"])
def test_non_finite_or_non_number_slo_is_rejected(slo_ms: object) -> None:
    with pytest.raises(WorkflowError, match=re.escape(f"slo_ms must be a finite number, got {slo_ms!r}")):
        Workflow("w", ["a"], [], slo_ms)  # type: ignore[arg-type]


def test_workflow_error_is_an_invalid_input_and_value_error() -> None:
    with pytest.raises(InvalidInputError, match="no stages"):
        Workflow("w", [], [], 1)
    assert issubclass(WorkflowError, ValueError)


def test_int_slo_is_stored_as_float() -> None:
    wf = Workflow("w", ["a"], [], 100)
    assert wf.slo_ms == 100.0
    assert isinstance(wf.slo_ms, float)


def test_stages_are_a_tuple_and_edges_deduplicated_and_sorted() -> None:
    wf = Workflow("w", ["c", "a", "b"], [("b", "c"), ("a", "b"), ("b", "c")], 10)
    assert wf.stages == ("c", "a", "b")
    assert wf.edges == (("a", "b"), ("b", "c"))


def test_workflow_is_frozen() -> None:
    wf = Workflow.chain("w", ["a"], 10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        wf.slo_ms = 5.0  # type: ignore[misc]


# ---- graph queries ------------------------------------------------------------


def test_entries_exits_of_a_diamond() -> None:
    wf = diamond()
    assert wf.entries == ("a",)
    assert wf.exits == ("d",)


def test_entries_and_exits_keep_declaration_order() -> None:
    # two independent chains y -> x and b -> a, plus an isolated stage m (both entry and exit)
    wf = Workflow("w", ["y", "m", "b", "x", "a"], [("y", "x"), ("b", "a")], 10)
    assert wf.entries == ("y", "m", "b")
    assert wf.exits == ("m", "x", "a")


def test_topological_order_breaks_ties_by_declaration_order() -> None:
    # diamond declares c before b, so after a the tie b/c goes to c
    assert diamond().topological_order() == ("a", "c", "b", "d")


def test_topological_order_respects_edges_against_declaration_order() -> None:
    # b is declared first but depends on a; c has no edges and is declared first-ranked among the free ones
    wf = Workflow("w", ["b", "c", "a"], [("a", "b")], 10)
    assert wf.topological_order() == ("c", "a", "b")


def test_successors_and_predecessors() -> None:
    wf = diamond()
    assert set(wf.successors("a")) == {"b", "c"}
    assert set(wf.predecessors("d")) == {"b", "c"}
    assert wf.predecessors("a") == ()
    assert wf.successors("d") == ()


@pytest.mark.parametrize("query", ["successors", "predecessors"])
def test_neighbours_of_unknown_stage_raise(query: str) -> None:
    with pytest.raises(WorkflowError, match="has no stage 'zz'"):
        getattr(diamond(), query)("zz")


# ---- chain --------------------------------------------------------------------


def test_chain_links_consecutive_stages() -> None:
    wf = Workflow.chain("pipe", ["det", "crop", "cls"], 300)
    assert wf.edges == (("crop", "cls"), ("det", "crop"))  # sorted
    assert wf.entries == ("det",)
    assert wf.exits == ("cls",)
    assert wf.topological_order() == ("det", "crop", "cls")
    assert wf == Workflow("pipe", ["det", "crop", "cls"], [("det", "crop"), ("crop", "cls")], 300)


def test_chain_of_one_stage_has_no_edges() -> None:
    wf = Workflow.chain("one", ["only"], 50)
    assert wf.edges == ()
    assert wf.entries == wf.exits == ("only",)


def test_chain_validates_like_the_constructor() -> None:
    with pytest.raises(WorkflowError, match="duplicate stage name 'a'"):
        Workflow.chain("w", ["a", "b", "a"], 10)
    with pytest.raises(WorkflowError, match="has no stages"):
        Workflow.chain("w", [], 10)


# ---- equality, hash, pickle ---------------------------------------------------


def test_equality_ignores_edge_order_and_duplicates() -> None:
    a = Workflow("w", ["a", "b", "c"], [("a", "b"), ("b", "c")], 10)
    b = Workflow("w", ("a", "b", "c"), [("b", "c"), ("a", "b"), ("a", "b")], 10.0)
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b}) == 1


@pytest.mark.parametrize(
    "other",
    [
        Workflow("w2", ["a", "b"], [("a", "b")], 10),  # name
        Workflow("w", ["b", "a"], [("a", "b")], 10),  # stage order
        Workflow("w", ["a", "b"], [], 10),  # edges
        Workflow("w", ["a", "b"], [("a", "b")], 11),  # slo
    ],
)
def test_inequality_on_each_field(other: Workflow) -> None:
    assert Workflow("w", ["a", "b"], [("a", "b")], 10) != other


def test_comparison_with_other_type_is_not_equal() -> None:
    assert Workflow.chain("w", ["a"], 1) != ("w", ("a",), (), 1.0)


def test_pickle_round_trip_rebuilds_the_graph() -> None:
    wf = diamond(250.0)
    back = pickle.loads(pickle.dumps(wf))
    assert back == wf
    assert hash(back) == hash(wf)
    assert back.entries == ("a",)
    assert back.exits == ("d",)
    assert back.topological_order() == wf.topological_order()
    assert set(back.graph.edges) == set(wf.graph.edges)
    assert back.graph is not wf.graph
