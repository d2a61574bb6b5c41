"""The simulated callers: requests that walk their workflow's DAG as a flow run would.

A request's entry stages are called when it arrives; a stage is called when
its last upstream call finished (on the node its inputs mostly are); the
request ends when its last exit stage finished, or fails with the first call
the core fails. An orchestrator's overheads delay the calls (``run_ms``
before the entry calls, ``call_ms`` before every call), never the arrival
the SLO counts from: every call carries it, so the core plans with the slack
the overheads left, as the live pool does. These are the simulator's stand-in for the Prefect flows that
call the runtime pool.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from esg_prefect.control.events import CallArrived
from esg_prefect.control.state import home_node
from esg_prefect.model.records import RequestRecord
from esg_prefect.model.unchecked import unchecked
from esg_prefect.model.workflow import Workflow

_request_record = unchecked(RequestRecord)
_arrived = unchecked(CallArrived)  # built from the callers' own values (no checks to skip, a faster __init__)


class _Shape:
    """A workflow's graph, read once (its properties ask the graph each time)."""

    __slots__ = ("entries", "exits", "in_degree", "successors", "wf")

    def __init__(self, wf: Workflow) -> None:
        self.wf, self.entries, self.exits = wf, wf.entries, frozenset(wf.exits)
        self.successors = {s: wf.successors(s) for s in wf.stages}
        self.in_degree = {s: len(wf.predecessors(s)) for s in wf.stages}


class Caller:
    """One request walking its workflow."""

    __slots__ = ("arrival_ms", "exits_left", "failed", "pending", "pred_nodes", "request_id", "shape", "size")

    def __init__(self, request_id: str, shape: _Shape, arrival_ms: float, size: float) -> None:
        self.request_id, self.shape, self.arrival_ms, self.size = request_id, shape, arrival_ms, size
        self.pending = dict(shape.in_degree)
        self.exits_left = len(shape.exits)
        self.pred_nodes: dict[str, list[str]] = {}  # stage -> nodes of its finished upstream calls
        self.failed = False


class Callers:
    """Every request in flight, and the records of those that ended.

    Args:
        workflows: the case's workflows by name.
        typical: each stage's typical item size (a request's relative size times it is a call's size).
        submit: hands a call to the control core.
        ended: called once when a request ends; returns whether the core marked it at risk.
        later: ``later(t, (request_id, stage))`` calls :meth:`call_due` at ``t``; needed with overheads.
        run_ms, call_ms: the orchestrator's overheads (``SimSpec.run_overhead_ms``, ``call_overhead_ms``).
    """

    def __init__(
        self,
        workflows: Mapping[str, Workflow],
        typical: Mapping[str, float],
        submit: Callable[[CallArrived], object],
        ended: Callable[[str], bool],
        later: Callable[[float, tuple[str, str]], None] | None = None,
        run_ms: float = 0.0,
        call_ms: float = 0.0,
    ) -> None:
        self._shapes = {name: _Shape(wf) for name, wf in workflows.items()}
        self._typical, self._submit, self._ended = typical, submit, ended
        self._later, self._run_ms, self._call_ms = later, run_ms, call_ms
        self.live: dict[str, Caller] = {}
        self.records: list[RequestRecord] = []
        self.open = 0  # requests neither finished nor failed
        self._n = 0

    def arrive(self, workflow: str, now: float, size: float) -> None:
        """A request arrives: its entry stages are called."""
        self._n += 1
        req = Caller(f"r{self._n}", self._shapes[workflow], now, size)
        self.live[req.request_id] = req
        self.open += 1
        for s in req.shape.entries:
            self._ready(req, s, now, self._run_ms)

    def _ready(self, req: Caller, stage: str, now: float, extra_ms: float = 0.0) -> None:
        """A call is ready: it reaches the core after the orchestrator's overheads."""
        delay = extra_ms + self._call_ms
        if delay > 0 and self._later is not None:
            self._later(now + delay, (req.request_id, stage))
        else:
            self._call(req, stage, now)

    def call_due(self, request_id: str, stage: str, now: float) -> None:
        """A delayed call reaches the core (unless its request failed meanwhile)."""
        req = self.live.get(request_id)
        if req is not None and not req.failed:
            self._call(req, stage, now)

    def _call(self, req: Caller, stage: str, now: float) -> None:
        nodes = req.pred_nodes.get(stage)
        rid, wf, size = req.request_id, req.shape.wf.name, req.size * self._typical[stage]
        home = home_node(nodes) if nodes else None
        # The request's arrival, as a live flow run's creation reaches the pool: the core plans the first calls
        # with the slack left after the orchestrator's overheads, not with the whole SLO from when they reach it.
        arrived = _arrived(f"{rid}:{stage}", rid, rid, wf, stage, now, size, home, req.arrival_ms, None, ())
        self._submit(arrived)

    def finished(self, request_id: str, stage: str, node: str, now: float) -> None:
        """A call of the request finished on ``node``: the request ends, or calls the stages now ready."""
        req = self.live[request_id]
        if req.failed:
            return
        shape = req.shape
        if stage in shape.exits:
            req.exits_left -= 1
            if req.exits_left == 0:
                self._end(req, now)
                return
        for nxt in shape.successors[stage]:
            req.pred_nodes.setdefault(nxt, []).append(node)
            req.pending[nxt] -= 1
            if req.pending[nxt] == 0:
                self._ready(req, nxt, now)

    def failed(self, request_id: str) -> None:
        """The core failed one of the request's calls: it ends unfinished."""
        req = self.live[request_id]
        if not req.failed:
            req.failed = True
            self.open -= 1

    def remote_inputs(self, request_id: str, stage: str, node: str) -> int:
        """Inputs of the request's call of ``stage`` held on other nodes than ``node``."""
        return sum(1 for n in self.live[request_id].pred_nodes.get(stage, ()) if n != node)

    def _end(self, req: Caller, now: float | None) -> None:
        rid, wf = req.request_id, req.shape.wf
        self.records.append(_request_record(rid, rid, wf.name, req.arrival_ms, now, wf.slo_ms, self._ended(rid)))
        if now is not None:
            del self.live[rid]
            self.open -= 1

    def close(self) -> None:
        """At the end of the run: every request not finished is a failure; records in arrival order."""
        for req in list(self.live.values()):
            self._end(req, None)
        self.live.clear()
        self.records.sort(key=lambda r: int(r.request_id[1:]))
