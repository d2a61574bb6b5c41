"""Dominator-based SLO distribution (ESG-SPEC section 4).

A workflow's end-to-end SLO is split over *segments*: the stages every request
passes through (the dominators of a virtual sink, computed from a virtual
source with :func:`networkx.immediate_dominators`) each form one segment, and
the sub-DAG strictly between two consecutive dominators (a fork-join region)
forms another. In a chain every stage is its own segment.

Each segment's weight is its critical-path latency with every stage at its
fastest configuration; segment ``i`` gets ``slo_ms * weight_i / sum(weights)``
and a job's deadline for segment ``i`` is the request's arrival time plus the
budgets of segments ``0..i``. Parallel branches inside a region share the
whole region budget. With runtime slack redistribution (a knob, on by
default), the budgets of the segments still ahead are recomputed from the real
finish time of the previous one, so slack left over (or overspent) moves on.

References:
    Hui, Xu, Guo, Shen. "ESG: Pipeline-Conscious Efficient Scheduling of DNN
    Workflows on Serverless Platforms with Shareable GPUs." HPDC '24.
    Cooper, Harvey, Kennedy. "A Simple, Fast Dominance Algorithm." 2001
    (the algorithm behind ``networkx.immediate_dominators``).

Example:
    >>> from esg_prefect.model.workflow import Workflow
    >>> wf = Workflow("d", ["a", "b", "c", "d"], [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")], 100)
    >>> [s.stages for s in dominator_segments(wf)]
    [('a',), ('b', 'c'), ('d',)]
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

import networkx as nx

from esg_prefect.exceptions import WorkflowError
from esg_prefect.model.workflow import Workflow

_SOURCE = ("__esg_source__",)
_SINK = ("__esg_sink__",)


@dataclass(frozen=True, slots=True)
class Segment:
    """A part of a workflow between two consecutive dominators.

    Attributes:
        index: position from the entry, 0-based.
        stages: its stages in topological order.
        is_region: True for a fork-join region, False for a single dominator stage.
    """

    index: int
    stages: tuple[str, ...]
    is_region: bool


def dominator_segments(workflow: Workflow) -> tuple[Segment, ...]:
    """Split ``workflow`` into segments at the dominators of its exit.

    Returns:
        The segments in the order every request meets them.
    """
    g: nx.DiGraph = workflow.graph.copy()
    g.add_edges_from((_SOURCE, e) for e in workflow.entries)
    g.add_edges_from((x, _SINK) for x in workflow.exits)
    idom = nx.immediate_dominators(g, _SOURCE)
    chain: list[object] = []
    node: object = _SINK
    while node != _SOURCE:
        node = idom[node]
        chain.append(node)
    chain.reverse()  # source, d1, d2, ..., last dominator before the sink
    dominators = [d for d in chain if d != _SOURCE]
    order = workflow.topological_order()
    position = {s: i for i, s in enumerate(order)}
    dom_pos = [position[d] for d in dominators]  # type: ignore[index]
    segments: list[Segment] = []
    # Every stage lies on a path from source to sink, so in topological order it sits
    # between two consecutive dominators (or is one): the order partitions the stages.
    bounds = [-1, *dom_pos, len(order)]
    for i in range(len(bounds) - 1):
        lo, hi = bounds[i], bounds[i + 1]
        region = order[lo + 1 : hi]
        if region:
            segments.append(Segment(len(segments), tuple(region), True))
        if i < len(dom_pos):
            segments.append(Segment(len(segments), (order[hi],), False))
    return tuple(segments)


def critical_path(
    workflow: Workflow, stages: tuple[str, ...], latency_ms: Mapping[str, float], start: str | None = None
) -> tuple[str, ...]:
    """The path of largest total latency through ``stages`` (a sub-DAG).

    Args:
        workflow: the workflow the stages belong to.
        stages: the stages to consider, in topological order.
        latency_ms: weight of each stage.
        start: if given, only paths beginning at this stage count.

    Returns:
        The stages of the heaviest path, in order (ties broken by topological order).
    """
    inside = set(stages)
    best: dict[str, tuple[float, tuple[str, ...]]] = {}
    for s in reversed(stages):  # longest path starting at s, computed from the back
        tail: tuple[float, tuple[str, ...]] = (0.0, ())
        for nxt in workflow.graph.successors(s):
            if nxt in inside and best[nxt][0] > tail[0]:
                tail = best[nxt]
        best[s] = (latency_ms[s] + tail[0], (s, *tail[1]))
    if start is not None:
        return best[start][1]
    top = max(stages, key=lambda s: best[s][0])
    return best[top][1]


class SLODistribution:
    """Per-segment SLO budgets of one workflow, and the deadlines they imply.

    Args:
        workflow: the workflow.
        min_latency_ms: each stage's latency at its fastest configuration (the
            segment weights are critical paths of these). A stage missing here
            raises; all-zero weights split the SLO evenly.
        redistribute: recompute the budgets ahead from real finish times.

    Raises:
        WorkflowError: when a stage has no minimum latency or a negative one.
    """

    def __init__(self, workflow: Workflow, min_latency_ms: Mapping[str, float], redistribute: bool = True) -> None:
        for s in workflow.stages:
            if s not in min_latency_ms:
                raise WorkflowError(f"workflow {workflow.name!r}: no minimum latency for stage {s!r}")
            v = min_latency_ms[s]
            if not (math.isfinite(v) and v >= 0):
                raise WorkflowError(f"workflow {workflow.name!r}: min latency of {s!r} must be >= 0, got {v!r}")
        self.workflow = workflow
        self.redistribute = redistribute
        self.segments = dominator_segments(workflow)
        self.min_latency_ms = dict(min_latency_ms)
        self.weights = tuple(
            sum(min_latency_ms[s] for s in critical_path(workflow, seg.stages, min_latency_ms)) for seg in self.segments
        )
        total = sum(self.weights)
        n = len(self.segments)
        self.budgets_ms = tuple(workflow.slo_ms * (w / total if total > 0 else 1.0 / n) for w in self.weights)
        self._segment_of = {s: seg.index for seg in self.segments for s in seg.stages}

    @cached_property
    def _offsets(self) -> tuple[float, ...]:
        acc, out = 0.0, []
        for b in self.budgets_ms:
            acc += b
            out.append(acc)
        return tuple(out)

    def segment_of(self, stage: str) -> Segment:
        """The segment holding ``stage``."""
        try:
            return self.segments[self._segment_of[stage]]
        except KeyError:
            raise WorkflowError(f"workflow {self.workflow.name!r} has no stage {stage!r}") from None

    def deadline_ms(self, stage: str, arrival_ms: float) -> float:
        """Absolute deadline of ``stage``'s segment for a request arriving at ``arrival_ms``."""
        return arrival_ms + self._offsets[self.segment_of(stage).index]

    def e2e_deadline_ms(self, arrival_ms: float) -> float:
        """Absolute end-to-end deadline of a request arriving at ``arrival_ms``."""
        return arrival_ms + self.workflow.slo_ms

    def deadline_after(self, stage: str, arrival_ms: float, segment_start_ms: float) -> float:
        """Deadline of ``stage``'s segment, given when that segment started.

        ``segment_start_ms`` is when the segment's first job became ready: for
        a single-stage segment, this job's ready time; for a fork-join region,
        when the dominator before it finished, so that every stage of the
        region (heads and the stages after them) gets the same deadline.
        Without redistribution this is :meth:`deadline_ms`. With it, the time
        left to the end-to-end deadline is split again over the segments from
        this one on, in proportion to their weights.
        """
        seg = self.segment_of(stage)
        if not self.redistribute:
            return self.deadline_ms(stage, arrival_ms)
        remaining = self.e2e_deadline_ms(arrival_ms) - segment_start_ms
        weights = self.weights[seg.index :]
        total = sum(weights)
        share = weights[0] / total if total > 0 else 1.0 / len(weights)
        return segment_start_ms + remaining * share
