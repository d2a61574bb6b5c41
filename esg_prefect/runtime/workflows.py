"""Workflows known to a pool: declared by flows, or learned from observed runs.

A flow may declare its DAG (edges) up front; otherwise the pool learns it:
each stage call names the calls whose outputs it consumed (Prefect records
these as the task run's inputs), and an edge ``upstream stage -> stage`` is
added the first time it is seen. A stage seen with no upstream is an entry.
An edge that would close a cycle (a stage called again downstream of itself)
is ignored, with one warning, so the DAG stays schedulable.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import networkx as nx

from esg_prefect.model.workflow import Workflow
from esg_prefect.runtime.calls import StageCall

logger = logging.getLogger(__name__)


class WorkflowRegistry:
    """Current DAG of each workflow, declared or learned.

    Args:
        memory: how many recent call ids to remember for learning edges.
    """

    def __init__(self, memory: int = 100_000) -> None:
        self._stages: dict[str, list[str]] = {}
        self._edges: dict[str, set[tuple[str, str]]] = {}
        self._declared: set[str] = set()
        self._slo: dict[str, float] = {}
        self._current: dict[str, Workflow] = {}
        self._stage_of_call: OrderedDict[str, str] = OrderedDict()
        self._memory = memory
        self._warned: set[tuple[str, str, str]] = set()

    def observe(self, call: StageCall) -> Workflow:
        """Record a call (its stage, its upstream edges) and return its workflow's current DAG."""
        decl = call.workflow
        name = decl.name
        stages = self._stages.setdefault(name, [])
        edges = self._edges.setdefault(name, set())
        changed = self._slo.get(name) != decl.slo_ms
        self._slo[name] = decl.slo_ms
        if decl.edges is not None and name not in self._declared:
            self._declared.add(name)
            for s in (*decl.stages, *(x for e in decl.edges for x in e)):
                if s not in stages:
                    stages.append(s)
            edges.update(decl.edges)
            changed = True
        if call.stage not in stages:
            stages.append(call.stage)
            changed = True
        if name not in self._declared:
            for up in call.upstream:
                up_stage = self._stage_of_call.get(up)
                if up_stage is None or up_stage == call.stage or (up_stage, call.stage) in edges:
                    continue
                g = nx.DiGraph(list(edges))
                g.add_edge(up_stage, call.stage)
                if not nx.is_directed_acyclic_graph(g):
                    key = (name, up_stage, call.stage)
                    if key not in self._warned:
                        self._warned.add(key)
                        logger.warning(
                            "workflow %r: ignoring edge %s -> %s, it would close a cycle", name, up_stage, call.stage
                        )
                    continue
                edges.add((up_stage, call.stage))
                changed = True
        self._stage_of_call[call.task_run_id or call.call_id] = call.stage
        if len(self._stage_of_call) > self._memory:
            self._stage_of_call.popitem(last=False)
        if changed or name not in self._current:
            self._current[name] = Workflow(name, stages, sorted(edges), self._slo[name])
        return self._current[name]

    def current(self) -> dict[str, Workflow]:
        """Every workflow's current DAG, by name."""
        return dict(self._current)
