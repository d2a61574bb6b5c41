"""Workflows: DAGs of DNN stages with one end-to-end latency SLO.

A workflow (the paper's "application") is a directed acyclic graph of stages
(functions); each request is one instance of it and creates one job per stage.
The graph is a :class:`networkx.DiGraph` kept private; validation happens at
construction so a scheduler never sees a cycle or a dangling edge.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import networkx as nx

from esg_prefect.exceptions import WorkflowError

MAX_SLO_MS = 7 * 24 * 3600 * 1000.0  # a week: longer is no latency objective, and overflows the search's units
MIN_LIKELY_SLO_MS = 10.0
"""Below it an SLO is most likely written in seconds (``0.5`` meant as half a second): warned of, never refused."""


def seconds_slo_hint(slo_ms: float) -> str | None:
    """What to say of an SLO under :data:`MIN_LIKELY_SLO_MS`: that ``slo_ms`` is in ms, and how the same
    number of seconds is written; None for one at or above it.

    The one rule for every place an SLO is declared (``Pipeline``, a simulator case file), each warning
    in its own words of what such an SLO does there. Not refused: a tiny SLO can be meant (toy stages).

    Examples:
        >>> seconds_slo_hint(0.5)
        'slo_ms is in milliseconds: for 0.5 s write slo_ms=500'
        >>> seconds_slo_hint(10) is None
        True
    """
    if not slo_ms < MIN_LIKELY_SLO_MS:
        return None
    return f"slo_ms is in milliseconds: for {slo_ms:g} s write slo_ms={slo_ms * 1000:g}"


@dataclass(frozen=True, slots=True)
class Workflow:
    """A DAG of stages with an end-to-end SLO.

    Args:
        name: workflow (application) name, unique in a pool.
        stages: stage names, unique and non-empty.
        edges: ``(upstream, downstream)`` pairs between declared stages.
        slo_ms: end-to-end latency objective in ms, > 0.

    Raises:
        WorkflowError: on an empty workflow, a duplicate or empty stage name,
            an edge naming an unknown stage, a self-loop or cycle, or ``slo_ms <= 0``.

    Examples:
        >>> wf = Workflow("img", ["detect", "classify"], [("detect", "classify")], slo_ms=200)
        >>> wf.entries, wf.exits
        (('detect',), ('classify',))
    """

    name: str
    stages: tuple[str, ...]
    edges: tuple[tuple[str, str], ...]
    slo_ms: float
    graph: nx.DiGraph = field(init=False, repr=False, compare=False, hash=False)
    _hash: int = field(init=False, repr=False, compare=False, hash=False)

    def __init__(self, name: str, stages: Sequence[str], edges: Iterable[tuple[str, str]], slo_ms: float) -> None:
        if not isinstance(name, str) or not name:
            raise WorkflowError(f"workflow name must be a non-empty string, got {name!r}")
        stages = tuple(stages)
        if not stages:
            raise WorkflowError(f"workflow {name!r} has no stages")
        seen: set[str] = set()
        for s in stages:
            if not isinstance(s, str) or not s:
                raise WorkflowError(f"workflow {name!r}: stage names must be non-empty strings, got {s!r}")
            if s in seen:
                raise WorkflowError(f"workflow {name!r}: duplicate stage name {s!r}")
            seen.add(s)
        edge_list = tuple((str(u), str(v)) for u, v in edges)
        for u, v in edge_list:
            for end in (u, v):
                if end not in seen:
                    raise WorkflowError(
                        f"workflow {name!r}: edge ({u!r}, {v!r}) names unknown stage {end!r}; "
                        f"its stages are {list(stages)}"
                    )
            if u == v:
                raise WorkflowError(f"workflow {name!r}: self-loop on stage {u!r}")
        if isinstance(slo_ms, bool) or not isinstance(slo_ms, (int, float)) or not math.isfinite(slo_ms):
            raise WorkflowError(f"workflow {name!r}: slo_ms must be a finite number, got {slo_ms!r}")
        if slo_ms <= 0:
            raise WorkflowError(f"workflow {name!r}: slo_ms must be > 0, got {slo_ms}")
        if slo_ms > MAX_SLO_MS:
            raise WorkflowError(f"workflow {name!r}: slo_ms must be at most {MAX_SLO_MS:.0f} (a week), got {slo_ms}")
        graph = nx.DiGraph()
        graph.add_nodes_from(stages)
        graph.add_edges_from(edge_list)
        if not nx.is_directed_acyclic_graph(graph):
            cycle = nx.find_cycle(graph)
            raise WorkflowError(f"workflow {name!r} has a cycle: {cycle}")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "stages", stages)
        object.__setattr__(self, "edges", tuple(sorted(set(edge_list))))
        object.__setattr__(self, "slo_ms", float(slo_ms))
        object.__setattr__(self, "_hash", hash((self.name, self.stages, self.edges, self.slo_ms)))
        object.__setattr__(self, "graph", graph)

    def __hash__(self) -> int:
        # Kept from construction (and recomputed on unpickling, where string hashes may differ):
        # workflows key the schedulers' caches, looked up every decision, and hashing the stage and
        # edge tuples again each time cost more than the lookup.
        return self._hash

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Workflow):
            return NotImplemented
        return (self.name, self.stages, self.edges, self.slo_ms) == (
            other.name,
            other.stages,
            other.edges,
            other.slo_ms,
        )

    def __getstate__(self) -> tuple[str, tuple[str, ...], tuple[tuple[str, str], ...], float]:
        return self.name, self.stages, self.edges, self.slo_ms

    def __setstate__(self, state: tuple[str, tuple[str, ...], tuple[tuple[str, str], ...], float]) -> None:
        self.__init__(*state)  # type: ignore[misc]

    @classmethod
    def chain(cls, name: str, stages: Sequence[str], slo_ms: float) -> Workflow:
        """A linear pipeline ``stages[0] -> stages[1] -> ...``."""
        stages = tuple(stages)
        return cls(name, stages, list(itertools.pairwise(stages)), slo_ms)

    @property
    def entries(self) -> tuple[str, ...]:
        """Stages without upstream stages, in declaration order."""
        return tuple(s for s in self.stages if self.graph.in_degree(s) == 0)

    @property
    def exits(self) -> tuple[str, ...]:
        """Stages without downstream stages, in declaration order."""
        return tuple(s for s in self.stages if self.graph.out_degree(s) == 0)

    def topological_order(self) -> tuple[str, ...]:
        """Stages in a deterministic topological order (ties by declaration order)."""
        rank = {s: i for i, s in enumerate(self.stages)}
        return tuple(nx.lexicographical_topological_sort(self.graph, key=rank.__getitem__))

    def successors(self, stage: str) -> tuple[str, ...]:
        """Direct downstream stages of ``stage``."""
        self._check(stage)
        return tuple(self.graph.successors(stage))

    def predecessors(self, stage: str) -> tuple[str, ...]:
        """Direct upstream stages of ``stage``."""
        self._check(stage)
        return tuple(self.graph.predecessors(stage))

    def _check(self, stage: str) -> None:
        if stage not in self.graph:
            raise WorkflowError(f"workflow {self.name!r} has no stage {stage!r}; stages: {list(self.stages)}")
