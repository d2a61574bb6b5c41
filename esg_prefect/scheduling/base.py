"""The scheduler interface: a pure function of a snapshot and a time value.

``Scheduler.decide(snapshot, now_ms) -> SchedulingResult``. A scheduler reads
no clock (a time budget, if any, comes through an injected clock) and does no
I/O; the runtime and the simulator call the very same objects. ESG and every
baseline implement this interface and are created by name through
:mod:`esg_prefect.scheduling.registry`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter, is_
from typing import Protocol, runtime_checkable

from esg_prefect.exceptions import InvalidInputError
from esg_prefect.model.cluster import ClusterSnapshot
from esg_prefect.model.config import Config
from esg_prefect.model.jobs import Job, QueueKey
from esg_prefect.model.unchecked import unchecked
from esg_prefect.model.workflow import Workflow

_QUEUE_OF = attrgetter("queue")


@dataclass(frozen=True, slots=True)
class QueueState:
    """One AFW queue: its waiting jobs and its recent arrival rate.

    Args:
        key: the queue.
        jobs: jobs waiting, in any order (schedulers sort them).
        arrival_rate_per_s: EWMA arrival rate kept by the runtime/simulator;
            0 when unknown, which disables waiting for a fuller batch.
    """

    key: QueueKey
    jobs: tuple[Job, ...]
    arrival_rate_per_s: float = 0.0

    def __post_init__(self) -> None:
        r = self.arrival_rate_per_s
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r) or r < 0:
            raise InvalidInputError(f"queue {self.key}: arrival_rate_per_s must be >= 0, got {r!r}")
        key = self.key
        # A C-level identity pass first: the runtime and the simulator give every job of a queue the
        # queue's own key object, and queues may hold thousands of jobs.
        if all(map(is_, map(_QUEUE_OF, self.jobs), repeat(key))):
            return
        for j in self.jobs:
            if j.queue != key:
                raise InvalidInputError(f"queue {self.key} holds job {j.job_id} of queue {j.queue}")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything a scheduler may look at in one round.

    Raises:
        InvalidInputError: when a queue names a workflow or stage not given.
    """

    queues: tuple[QueueState, ...]
    cluster: ClusterSnapshot
    workflows: Mapping[str, Workflow]

    def __post_init__(self) -> None:
        for q in self.queues:
            wf = self.workflows.get(q.key.workflow)
            if wf is None:
                raise InvalidInputError(f"queue {q.key} names unknown workflow {q.key.workflow!r}")
            if q.key.stage not in wf.graph:
                raise InvalidInputError(f"queue {q.key} names unknown stage {q.key.stage!r} of {wf.name!r}")


@dataclass(frozen=True, slots=True)
class DecisionStats:
    """Statistics of one queue decision (ESG-SPEC section 3, "Report per decision").

    Attributes:
        queue: the queue decided.
        expansions, generated, cut_latency, cut_cost, budget_hit: from the search.
        decision_ms: wall time of the decision, when a clock was injected.
        feasible: whether a plan within the slack existed.
        horizon: number of stages planned together.
        options: first-stage options after Pareto pruning.
    """

    queue: QueueKey
    expansions: int = 0
    generated: int = 0
    cut_latency: int = 0
    cut_cost: int = 0
    budget_hit: bool = False
    decision_ms: float | None = None
    feasible: bool = True
    horizon: int = 1
    options: int = 0


_unchecked_stats = unchecked(DecisionStats)


def search_stats(
    queue: QueueKey,
    expansions: int,
    generated: int,
    cut_latency: int,
    cut_cost: int,
    budget_hit: bool,
    decision_ms: float | None,
    feasible: bool,
    horizon: int,
    options: int,
) -> DecisionStats:
    """``DecisionStats(...)`` with every field given, built without the frozen ``__init__``'s cost.

    Schedulers return one per queue (or job) per round: hundreds of thousands
    in a minute of a loaded simulation (:mod:`esg_prefect.model.unchecked`;
    the class has no checks to skip).
    """
    return _unchecked_stats(
        queue, expansions, generated, cut_latency, cut_cost, budget_hit, decision_ms, feasible, horizon, options
    )


def plain_stats(queue: QueueKey, feasible: bool, options: int) -> DecisionStats:
    """Statistics of a decision made without a search (the baselines'), built fast (:func:`search_stats`)."""
    return _unchecked_stats(queue, 0, 0, 0, 0, False, None, feasible, 1, options)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a batch runs.

    Attributes:
        node: node of the worker.
        device_id: GPU of the worker, None on the CPU.
        worker_id: an existing idle warm worker, or None to start a new one.
        rule: which ESG_Dispatch rule chose it: 1 warm+local, 2 warm,
            3 cold on the inputs' node, 4 cold best fit anywhere.
        evict: idle workers to stop first, to make room for the new one.
    """

    node: str
    device_id: str | None
    worker_id: str | None
    rule: int
    evict: tuple[str, ...] = ()

    @property
    def cold(self) -> bool:
        """Whether a new worker must start (and load its model)."""
        return self.worker_id is None


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Run these jobs now as one batch.

    Attributes:
        queue: their queue.
        job_ids: the jobs, in EDF order; ``config.batch == len(job_ids)``.
        config: resources and the real batch size.
        hardware: ``"cpu"`` or the GPU type.
        placement: the worker to use or start.
        predicted_ms: predicted batch latency, cold start included.
        plan: the downstream part of the plan, ``(stage, config, hardware)``;
            informative only (receding horizon).
        at_risk: no plan met the slack; dispatched best effort.
        reason: a short account of why, for logs and artifacts.
    """

    queue: QueueKey
    job_ids: tuple[str, ...]
    config: Config
    hardware: str
    placement: Placement
    predicted_ms: float
    plan: tuple[tuple[str, Config, str], ...] = ()
    at_risk: bool = False
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Start:
    """Start a worker now, without jobs, so that it is warm when the queue next needs it.

    A cold start rarely fits a job's slack (model load is tens of ms against
    SLO segments of tens of ms), so a scheduler that only ever starts workers
    with jobs on them keeps serving a queue from whatever warm workers it has,
    however overpriced. A ``Start`` pays the cold start off the requests' path;
    its time is billed as the worker's idle time, attributed to the runs of the
    worker's first batch.

    Attributes:
        queue: the queue the worker is for (its stage is ``queue.stage``).
        config: the worker's resources (``batch`` is the batch it was sized for).
        hardware: ``"cpu"`` or the GPU type.
        placement: where it starts: always a new worker (``worker_id`` None).
        reason: a short account of why, for logs.
    """

    queue: QueueKey
    config: Config
    hardware: str
    placement: Placement
    reason: str = ""

    def __post_init__(self) -> None:
        if self.placement.worker_id is not None:
            raise InvalidInputError(f"a start places a new worker, got worker {self.placement.worker_id!r}")


@dataclass(frozen=True, slots=True)
class Hold:
    """Leave a queue's jobs waiting this round (for a fuller batch, or capacity)."""

    queue: QueueKey
    reason: str


@dataclass(frozen=True, slots=True)
class Reject:
    """Fail these jobs: no configuration can serve them in time (``reject`` policy)."""

    queue: QueueKey
    job_ids: tuple[str, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class SchedulingResult:
    """Decisions of one round and the statistics of each queue decision.

    ``retire``: idle workers to stop now, after the round's dispatches and starts (a scheduler that sizes a
    stage's fleet itself, e.g. ESG's ``stage_plan_retire``); the core refuses a busy or unknown one.
    """

    dispatches: tuple[Dispatch, ...] = ()
    holds: tuple[Hold, ...] = ()
    rejects: tuple[Reject, ...] = ()
    stats: tuple[DecisionStats, ...] = field(default=())
    starts: tuple[Start, ...] = ()
    retire: tuple[str, ...] = ()


@runtime_checkable
class Scheduler(Protocol):
    """What the runtime and the simulator call each round."""

    name: str

    def decide(self, snapshot: Snapshot, now_ms: float) -> SchedulingResult:
        """Decide dispatches for the queues of ``snapshot`` at time ``now_ms``."""
        ...
