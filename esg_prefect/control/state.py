"""What the control core keeps per workflow, request, queue and batch in flight, and its hop estimate.

Plain state with no behaviour of its own beyond small estimators; the core
(:mod:`esg_prefect.control.core`) changes it as events come in.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from dataclasses import dataclass

from esg_prefect.control.worker import FleetWorker
from esg_prefect.model.jobs import Job, QueueKey
from esg_prefect.model.slo import SLODistribution
from esg_prefect.model.workflow import Workflow
from esg_prefect.scheduling.base import Dispatch, QueueState
from esg_prefect.workload.rate import ArrivalRateEWMA


class Plan:
    """What the core precomputes per workflow (for the tables and hardware in use)."""

    __slots__ = ("dist", "keys", "region", "segment", "workflow")

    def __init__(self, workflow: Workflow, dist: SLODistribution) -> None:
        self.workflow = workflow
        self.dist = dist
        self.segment = {s: dist.segment_of(s).index for s in workflow.stages}
        self.region = {s: dist.segment_of(s).is_region for s in workflow.stages}
        self.keys = {s: QueueKey(workflow.name, s) for s in workflow.stages}


class Request:
    """A request (workflow instance) as the core tracks it."""

    __slots__ = (
        "arrival_ms",
        "at_risk",
        "closed",
        "failed",
        "last_end_ms",
        "open",
        "queued",
        "request_id",
        "run_id",
        "seg_start",
        "workflow",
    )

    def __init__(self, request_id: str, run_id: str, workflow: str, arrival_ms: float) -> None:
        self.request_id = request_id
        self.run_id = run_id
        self.workflow = workflow
        self.arrival_ms = arrival_ms
        self.seg_start: dict[int, float] = {}
        self.at_risk = False
        self.failed = False
        self.closed = False  # its run ended: no more calls
        self.open = 0  # jobs admitted and not finished
        self.last_end_ms = 0.0
        self.queued: dict[str, QueueKey] = {}  # job id -> queue, while it waits


class Queue:
    """An AFW queue: waiting jobs (in arrival order) and the arrival-rate estimate."""

    __slots__ = ("jobs", "key", "rate", "state")

    def __init__(self, key: QueueKey, alpha: float) -> None:
        self.key = key
        self.jobs: dict[str, Job] = {}
        self.rate = ArrivalRateEWMA(alpha)
        self.state: QueueState | None = None


@dataclass(slots=True)
class Flight:
    """A batch in flight."""

    batch_id: str
    worker: FleetWorker
    jobs: tuple[Job, ...]
    dispatch: Dispatch
    start_ms: float


@dataclass(slots=True)
class HopOverhead:
    """Smoothed time between a stage call's result and its downstream call's arrival, per workflow.

    Between two pooled stages of one request the caller's own machinery runs
    (under Prefect, the upstream task run finishes and the downstream one is
    created and started). That time is spent against the SLO outside the pool.
    The core reserves the smoothed mean plus twice the smoothed mean deviation
    (RFC 6298's estimator, with a smaller multiplier): a hop that takes longer
    than planned is a missed SLO.
    """

    alpha: float
    mean_ms: float | None = None
    dev_ms: float = 0.0

    def observe(self, gap_ms: float) -> None:
        """Fold one measured hop in."""
        gap_ms = max(0.0, gap_ms)
        if self.mean_ms is None:
            self.mean_ms, self.dev_ms = gap_ms, gap_ms / 2
            return
        self.dev_ms = (1 - self.alpha) * self.dev_ms + self.alpha * abs(gap_ms - self.mean_ms)
        self.mean_ms = (1 - self.alpha) * self.mean_ms + self.alpha * gap_ms

    @property
    def ms(self) -> float | None:
        """Time to reserve per hop, or None before the first observation."""
        return None if self.mean_ms is None else self.mean_ms + 2.0 * self.dev_ms


_HOP_MEMORY = 50_000  # task runs whose delivery time is kept, to measure the hop to their downstream calls


class Hops:
    """Where and when each stage result went back, and each workflow's measured hop (:class:`HopOverhead`).

    A downstream call names its upstream task runs: the newest of their
    delivery times gives the hop, their nodes the call's home node.
    """

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha
        self._delivered: OrderedDict[str, tuple[float, str]] = OrderedDict()  # task run -> (time, node)
        self._hops: dict[str, HopOverhead] = {}

    def delivered(self, task_run_id: str, t: float, node: str) -> None:
        """A stage result went back to its caller at ``t`` from ``node``."""
        self._delivered[task_run_id] = (t, node)
        if len(self._delivered) > _HOP_MEMORY:
            self._delivered.popitem(last=False)

    def observe(self, workflow: str, upstream: tuple[str, ...], t: float) -> None:
        """A call of ``workflow`` after ``upstream`` arrived at ``t``: fold its hop in."""
        ends = [self._delivered[u][0] for u in upstream if u in self._delivered]
        if ends:
            self._hops.setdefault(workflow, HopOverhead(self.alpha)).observe(t - max(ends))

    def home(self, upstream: tuple[str, ...]) -> str | None:
        """The node holding most of ``upstream``'s results (None: unknown)."""
        return home_node([self._delivered[u][1] for u in upstream if u in self._delivered])

    def hop_ms(self, workflow: str) -> float | None:
        """The measured hop of ``workflow`` (None before the first)."""
        hop = self._hops.get(workflow)
        return None if hop is None else hop.ms


def home_node(nodes: list[str]) -> str | None:
    """Where a call's inputs mostly are: the node holding most of its upstream results (ties: by name)."""
    return max(sorted(set(nodes)), key=nodes.count) if nodes else None


@functools.lru_cache(maxsize=4096)
def stages_after(workflow: Workflow, stage: str) -> int:
    """Stages on the longest path from ``stage`` (excluded) to an exit of ``workflow``."""
    succ = workflow.successors(stage)
    return 1 + max(stages_after(workflow, s) for s in succ) if succ else 0
