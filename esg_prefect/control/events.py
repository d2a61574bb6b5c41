"""What goes into the control core (events, each with its time) and what comes out (actions).

A driver (the runtime's asyncio pool, the simulator's event loop) turns what
happens on its platform into events and carries out the actions: it starts a
batch on a worker, starts or stops a worker, fails calls with a reason, and
hands the core a :class:`Tick` at the time a :class:`WakeAt` names. The core
itself reads no clock and does no I/O (:mod:`esg_prefect.control.core`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from esg_prefect.model.jobs import Job, QueueKey
from esg_prefect.scheduling.base import Dispatch

if TYPE_CHECKING:
    from esg_prefect.control.worker import FleetWorker

# ---- events --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CallArrived:
    """A stage call of a request arrived at ``t`` (a flow run's task, or a simulated request's stage).

    ``arrival_ms`` is when its request arrived (None: now, for its first call);
    ``home`` the node holding its input; ``task_run_id`` and ``upstream`` let the
    core measure the caller's time between pooled stages (the hop reserve).
    """

    job_id: str
    request_id: str
    run_id: str
    workflow: str
    stage: str
    t: float
    input_size: float = 1.0
    home: str | None = None
    arrival_ms: float | None = None
    task_run_id: str | None = None
    upstream: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class BatchFinished:
    """Batch ``batch_id`` ended at ``t``.

    ``failed``: its jobs that ended in an error; ``requeue``: jobs that did not
    run (their worker died) and go back to the front of their queue; ``lost``:
    the worker died (it is dropped, not kept idle). ``cold_ms`` and
    ``transfer_ms`` are the parts of the batch's time spent loading and moving
    inputs, for the records.
    """

    batch_id: str
    t: float
    failed: frozenset[str] = frozenset()
    requeue: tuple[str, ...] = ()
    lost: bool = False
    cold_ms: float = 0.0
    transfer_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class WorkerReady:
    """A worker started with no batch (a pre-warm :class:`StartWorker`) finished loading at ``t``."""

    worker_id: str
    t: float


@dataclass(frozen=True, slots=True)
class WorkerLost:
    """A worker with no batch running died or failed to load at ``t``."""

    worker_id: str
    t: float


@dataclass(frozen=True, slots=True)
class RunEnded:
    """A flow run ended: its requests expect no more calls."""

    run_id: str
    t: float


@dataclass(frozen=True, slots=True)
class Tick:
    """The driver hands the core control at ``t``, after the events of that instant (or a :class:`WakeAt`)."""

    t: float


Event = CallArrived | BatchFinished | WorkerReady | WorkerLost | RunEnded | Tick

# ---- actions -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StartBatch:
    """Run ``jobs`` as one batch on ``worker`` (``cold``: the worker is new and must load first)."""

    batch_id: str
    worker: FleetWorker
    jobs: tuple[Job, ...]
    dispatch: Dispatch
    cold: bool
    t: float


@dataclass(frozen=True, slots=True)
class StartWorker:
    """Start ``worker`` for ``queue`` with no batch (pre-warm); answer with WorkerReady or WorkerLost."""

    worker: FleetWorker
    queue: QueueKey
    t: float
    reason: str = ""


@dataclass(frozen=True, slots=True)
class StopWorker:
    """Stop the idle worker ``worker_id`` (keep-alive ran out, evicted, or the end of a run)."""

    worker_id: str
    t: float


@dataclass(frozen=True, slots=True)
class FailJobs:
    """These queued jobs will not run: answer their calls with ``reason``."""

    jobs: tuple[Job, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class WakeAt:
    """Hand the core a :class:`Tick` at ``t`` (or earlier)."""

    t: float


Action = StartBatch | StartWorker | StopWorker | FailJobs | WakeAt
