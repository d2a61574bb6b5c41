"""What crosses the boundary between a flow run and the pool: calls and results.

Plain data only, so the same types travel in-process and, encoded, over HTTP
to the pool service.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from esg_prefect.exceptions import InvalidInputError


@dataclass(frozen=True, slots=True)
class WorkflowDecl:
    """A workflow as a flow declares it: name, SLO and, optionally, its edges.

    Args:
        name: workflow (application) name.
        slo_ms: end-to-end SLO in ms.
        edges: ``(upstream, downstream)`` stage names; None to learn them from runs.
        stages: stage names known up front (order of declaration).
    """

    name: str
    slo_ms: float
    edges: tuple[tuple[str, str], ...] | None = None
    stages: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidInputError(f"workflow name must be non-empty, got {self.name!r}")
        if not (isinstance(self.slo_ms, (int, float)) and math.isfinite(self.slo_ms) and self.slo_ms > 0):
            raise InvalidInputError(f"workflow {self.name!r}: slo_ms must be > 0, got {self.slo_ms!r}")


@dataclass(frozen=True, slots=True)
class StageCall:
    """One stage call of one request.

    Args:
        call_id: unique id (the Prefect task run id when there is one); also the
            idempotency key of the call.
        stage: the stage's name.
        stage_path: import path of the stage (see :mod:`esg_prefect.runtime.stages`).
        workflow: the workflow the call belongs to.
        request_id: the workflow instance (by default the flow run id).
        run_id: the flow run billed for it.
        item: the input.
        upstream: call ids whose outputs fed this call (to learn the DAG).
        arrival_ms: when the request arrived (wall clock, ms); the SLO starts there.
        input_size: size of the input in its profile's unit, for size-aware
            batching (Cypress) and cost splits; None: the pool measures it with
            :func:`~esg_prefect.runtime.stages.input_size`.
        task_run_id: the Prefect task run, if any (upstream lists name these).
        deployment_id: the Prefect deployment the flow run came from, if any: the
            pool service learns it only this way (costs per deployment).
    """

    call_id: str
    stage: str
    stage_path: str
    workflow: WorkflowDecl
    request_id: str
    run_id: str
    item: Any
    upstream: tuple[str, ...] = ()
    arrival_ms: float = 0.0
    input_size: float | None = None
    task_run_id: str = ""
    deployment_id: str = ""


@dataclass(frozen=True, slots=True)
class StageResult:
    """The output of a call and how it was produced (for logs and artifacts)."""

    call_id: str
    output: Any
    batch_id: str
    batch_size: int
    worker_id: str
    hardware: str
    vcpus: int
    gpu_share: float
    queue_wait_ms: float
    predicted_ms: float
    actual_ms: float
    cold_start: bool
    at_risk: bool
    reason: str = ""
    co_batched_runs: int = 1
    extra: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        """One log line: which batch, its size, the worker and share, waits and latencies."""
        where = f"{self.hardware} share {self.gpu_share:.2f}" if self.hardware != "cpu" else "cpu"
        return (
            f"batch {self.batch_id} ({self.batch_size} items from {self.co_batched_runs} run(s)) on worker "
            f"{self.worker_id} [{where}, {self.vcpus} vCPU]{' cold start' if self.cold_start else ''}; "
            f"queue wait {self.queue_wait_ms:.1f} ms; predicted {self.predicted_ms:.1f} ms, "
            f"actual {self.actual_ms:.1f} ms{'; AT RISK of missing the SLO' if self.at_risk else ''}"
        )


def batch_ids(results: Sequence[StageResult]) -> set[str]:
    """Distinct batches among results (helps tests and reports)."""
    return {r.batch_id for r in results}
