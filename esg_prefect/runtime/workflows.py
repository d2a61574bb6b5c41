"""Workflows known to a pool: declared by flows, or learned from observed runs.

A flow may declare its DAG (edges) up front; otherwise the pool learns it:
each stage call names the calls whose outputs it consumed (Prefect records
these as the task run's inputs), and an edge ``upstream stage -> stage`` is
added the first time it is seen. A stage seen with no upstream is an entry.
An edge that would close a cycle (a stage called again downstream of itself)
is ignored, with one warning, so the DAG stays schedulable.

Who may change a workflow: its first call fixes its SLO, and the first call
that declares edges fixes its graph, for the life of the pool. A later call
that declares another SLO or another graph is refused with
:class:`~esg_prefect.exceptions.CallConflictError` naming both (the service
answers 409), and nothing changes: one caller cannot retune or break another
caller's workflow. To change them, use a new workflow name or restart the pool.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import networkx as nx

from esg_prefect.control.calls import StageCall, WorkflowDecl
from esg_prefect.exceptions import CallConflictError
from esg_prefect.model.workflow import Workflow

logger = logging.getLogger(__name__)


class WorkflowRegistry:
    """Current DAG of each workflow, declared or learned.

    Args:
        memory: how many recent call ids to remember for learning edges.
    """

    def __init__(self, memory: int = 100_000) -> None:
        self._stages: dict[str, list[str]] = {}
        self._edges: dict[str, set[tuple[str, str]]] = {}
        self._declared: dict[str, WorkflowDecl] = {}
        self._renamed: dict[str, dict[str, str]] = {}  # workflow -> declared name -> the pool's name
        self._slo: dict[str, float] = {}
        self._current: dict[str, Workflow] = {}
        self._stage_of_call: OrderedDict[str, str] = OrderedDict()
        self._memory = memory
        self._warned: set[tuple[str, str, str]] = set()

    def check(self, decl: WorkflowDecl) -> None:
        """Refuse a declaration that contradicts the workflow's fixed SLO or graph (changes nothing).

        Raises:
            CallConflictError: naming the value in force and the one given.
        """
        name = decl.name
        slo = self._slo.get(name)
        if slo is not None and slo != decl.slo_ms:
            raise CallConflictError(
                f"workflow {name!r} runs with slo_ms={slo:g}; this call declares {decl.slo_ms:g} "
                "(a workflow's SLO is fixed by its first call: use another workflow name or restart the pool)"
            )
        first = self._declared.get(name)
        if first is not None and decl.edges is not None and decl.graph() != first.graph():
            raise CallConflictError(
                f"workflow {name!r} was declared with edges {sorted(first.edges or ())}; this call declares "
                f"{sorted(decl.edges)} (a workflow's graph is fixed by its first declaration)"
            )

    def observe(self, call: StageCall, stage: str | None = None) -> Workflow:
        """Record a call (its stage, its upstream edges) and return its workflow's current DAG.

        ``stage`` is the pool's name for the call's stage (see :meth:`rename`),
        by default the call's own. The new DAG is built before anything is
        recorded, so a call that cannot be recorded leaves the registry as it was.

        Raises:
            CallConflictError: see :meth:`check`.
            WorkflowError: when the DAG with this call would not be a valid workflow.
        """
        decl = call.workflow
        self.check(decl)
        name = decl.name
        stage = stage or call.stage
        stages = list(self._stages.get(name, []))
        edges = set(self._edges.get(name, set()))
        changed = name not in self._slo
        declare = decl.edges is not None and name not in self._declared
        if declare:
            names = self._renamed.get(name, {})
            for s in (*decl.stages, *(x for e in decl.edges or () for x in e)):
                if names.get(s, s) not in stages:
                    stages.append(names.get(s, s))
            edges.update((names.get(a, a), names.get(b, b)) for a, b in decl.edges or ())
            changed = True
        if stage not in stages:
            stages.append(stage)
            changed = True
        if name not in self._declared and not declare:
            for up in call.upstream:
                up_stage = self._stage_of_call.get(up)
                if up_stage is None or up_stage == stage or (up_stage, stage) in edges:
                    continue
                g = nx.DiGraph(list(edges))
                g.add_edge(up_stage, stage)
                if not nx.is_directed_acyclic_graph(g):
                    key = (name, up_stage, stage)
                    if key not in self._warned:
                        self._warned.add(key)
                        logger.warning(
                            "workflow %r: ignoring edge %s -> %s, it would close a cycle", name, up_stage, stage
                        )
                    continue
                edges.add((up_stage, stage))
                changed = True
        workflow = Workflow(name, stages, sorted(edges), decl.slo_ms) if changed else self._current[name]
        # Everything checked: record it.
        self._slo[name] = decl.slo_ms
        if declare:
            self._declared[name] = decl
        self._stages[name], self._edges[name] = stages, edges
        self._current[name] = workflow
        self._stage_of_call[call.task_run_id or call.call_id] = stage
        if len(self._stage_of_call) > self._memory:
            self._stage_of_call.popitem(last=False)
        return workflow

    def rename(self, workflow: str, old: str, new: str) -> None:
        """Call stage ``old`` of ``workflow`` ``new`` from now on (in its DAG and in later declarations).

        The pool renames a stage whose name another workflow's stage, with other
        code, already holds: workers are matched to queues by stage name, so two
        codes must never share one. Done before the stage's first call is queued.
        """
        self._renamed.setdefault(workflow, {})[old] = new
        if workflow not in self._stages or old not in self._stages[workflow]:
            return
        self._stages[workflow] = [new if s == old else s for s in self._stages[workflow]]
        self._edges[workflow] = {(new if a == old else a, new if b == old else b) for a, b in self._edges[workflow]}
        wf = self._current[workflow]
        self._current[workflow] = Workflow(workflow, self._stages[workflow], sorted(self._edges[workflow]), wf.slo_ms)

    def slo_ms(self, workflow: str) -> float:
        """The SLO in force for ``workflow`` (0 when it has not been seen)."""
        return self._slo.get(workflow, 0.0)

    def current(self) -> dict[str, Workflow]:
        """Every workflow's current DAG, by name."""
        return dict(self._current)
