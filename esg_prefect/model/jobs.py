"""Jobs, AFW queue keys and the batches formed from them.

A request (one workflow instance, i.e. one flow run's pass through a pipeline)
creates one job per stage. Jobs of many requests of the same workflow wait in
one Application-Function-Wise (AFW) queue per ``(workflow, stage)`` until the
scheduler dispatches a batch of them (ESG-SPEC sections 1 and 3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from esg_prefect.exceptions import InvalidInputError
from esg_prefect.model.config import Config


@dataclass(frozen=True, slots=True, order=True)
class QueueKey:
    """Identity of an AFW queue: one per (workflow, stage)."""

    workflow: str
    stage: str

    def __post_init__(self) -> None:
        if not self.workflow or not self.stage:
            raise InvalidInputError(f"QueueKey needs a workflow and a stage, got ({self.workflow!r}, {self.stage!r})")

    def __str__(self) -> str:
        return f"{self.workflow}/{self.stage}"


def _finite(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidInputError(f"{name} must be a finite number, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class Job:
    """One stage call of one request, waiting in its AFW queue.

    Args:
        job_id: unique id of this stage call.
        request_id: id of the workflow instance it belongs to.
        run_id: id of the flow run billed for it (often equal to ``request_id``).
        queue: the AFW queue it waits in.
        arrival_ms: when the request arrived (the SLO clock starts here).
        ready_ms: when this job entered its queue.
        deadline_ms: absolute deadline of the job's SLO segment.
        e2e_deadline_ms: absolute end-to-end deadline of the request.
        input_node: node that holds the job's input, for locality; None if any.
        input_size: size of the input (tokens, pixels, ...) for size-aware models.
    """

    job_id: str
    request_id: str
    run_id: str
    queue: QueueKey
    arrival_ms: float
    ready_ms: float
    deadline_ms: float
    e2e_deadline_ms: float
    input_node: str | None = None
    input_size: float = 1.0

    def __post_init__(self) -> None:
        if not self.job_id or not self.request_id or not self.run_id:
            raise InvalidInputError(
                f"job_id, request_id and run_id must be non-empty, got "
                f"({self.job_id!r}, {self.request_id!r}, {self.run_id!r})"
            )
        for name in ("arrival_ms", "ready_ms", "deadline_ms", "e2e_deadline_ms"):
            _finite(name, getattr(self, name))
        if self.ready_ms < self.arrival_ms:
            raise InvalidInputError(
                f"job {self.job_id}: ready_ms {self.ready_ms} is before arrival_ms {self.arrival_ms}"
            )
        if _finite("input_size", self.input_size) <= 0:
            raise InvalidInputError(f"job {self.job_id}: input_size must be > 0, got {self.input_size}")


@dataclass(frozen=True, slots=True)
class Batch:
    """Jobs of one queue run together on one worker with one configuration.

    The batch's ``config.batch`` is its real size (``len(jobs)``), which may be
    below the planned batch when the queue held fewer jobs.
    """

    batch_id: str
    queue: QueueKey
    jobs: tuple[Job, ...]
    config: Config
    hardware: str

    def __post_init__(self) -> None:
        if not self.jobs:
            raise InvalidInputError(f"batch {self.batch_id} has no jobs; a batch always holds at least one")
        if len(self.jobs) != self.config.batch:
            raise InvalidInputError(
                f"batch {self.batch_id}: {len(self.jobs)} jobs but config.batch={self.config.batch}"
            )
        for j in self.jobs:
            if j.queue != self.queue:
                raise InvalidInputError(f"batch {self.batch_id} for {self.queue} holds job {j.job_id} of {j.queue}")
