"""What a run leaves behind: one record per request and one per stage call.

The live runtime and the simulator both write these records, and one function,
:func:`esg_prefect.model.report.summarize`, turns them (with the batch and idle
records of :mod:`esg_prefect.model.attribution` and the scheduler's decision
statistics) into a report. Keeping the record types here, in the pure model
layer, is what lets a conformance test compare a simulated run with a live one
field by field (STYLE.md: "statistics computed by one shared function").

Times are milliseconds on the run's own clock (simulated or monotonic); only
differences between them carry meaning.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from esg_prefect.exceptions import InvalidInputError
from esg_prefect.model.config import CPU, normalize_share


def _finite(owner: str, name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidInputError(f"{owner}: {name} must be a finite number, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One workflow instance from arrival to its last stage (or to its failure).

    Args:
        request_id: unique id of the request.
        run_id: flow run billed for it.
        workflow: workflow name.
        arrival_ms: when it arrived (the SLO clock starts here).
        finish_ms: when its last exit stage finished; None when it failed or
            was rejected (it then counts as an SLO miss).
        slo_ms: its end-to-end latency objective.
        at_risk: some stage of it was dispatched best effort, with no plan that
            met its slack.

    Examples:
        >>> r = RequestRecord("r1", "run1", "img", arrival_ms=10.0, finish_ms=90.0, slo_ms=100.0)
        >>> r.latency_ms, r.slo_met
        (80.0, True)
    """

    request_id: str
    run_id: str
    workflow: str
    arrival_ms: float
    finish_ms: float | None
    slo_ms: float
    at_risk: bool = False

    def __post_init__(self) -> None:
        if not self.request_id or not self.run_id or not self.workflow:
            raise InvalidInputError(
                f"request_id, run_id and workflow must be non-empty, got "
                f"({self.request_id!r}, {self.run_id!r}, {self.workflow!r})"
            )
        owner = f"request {self.request_id}"
        _finite(owner, "arrival_ms", self.arrival_ms)
        if _finite(owner, "slo_ms", self.slo_ms) <= 0:
            raise InvalidInputError(f"{owner}: slo_ms must be > 0, got {self.slo_ms}")
        if self.finish_ms is not None and _finite(owner, "finish_ms", self.finish_ms) < self.arrival_ms:
            raise InvalidInputError(f"{owner}: finish_ms {self.finish_ms} is before arrival_ms {self.arrival_ms}")

    @property
    def completed(self) -> bool:
        """Whether the request finished (late or not)."""
        return self.finish_ms is not None

    @property
    def latency_ms(self) -> float | None:
        """End-to-end latency, None if the request did not finish."""
        return None if self.finish_ms is None else self.finish_ms - self.arrival_ms

    @property
    def slo_met(self) -> bool:
        """Finished within its SLO; failed requests never meet it."""
        lat = self.latency_ms
        return lat is not None and lat <= self.slo_ms


@dataclass(frozen=True, slots=True)
class StageRecord:
    """One stage call (job) as it ran: in which batch, where, and when.

    Args:
        job_id: unique id of the stage call.
        request_id: its request.
        workflow: workflow name.
        stage: stage name.
        batch_id: the batch it ran in.
        batch_size: jobs in that batch.
        worker_id: worker that ran the batch.
        hardware: ``"cpu"`` or the GPU type.
        gpu_share: GPU share of the worker (0 on the CPU).
        vcpus: vCPUs of the worker.
        ready_ms: when the job entered its queue.
        start_ms: when its batch was dispatched (a cold start, if any, follows).
        end_ms: when its batch finished.
        predicted_ms: the scheduler's predicted batch latency (cold start included).
        cold_start_ms: part of ``end_ms - start_ms`` spent starting the worker.
        transfer_ms: part of ``end_ms - start_ms`` spent fetching inputs from other nodes.

    The last two default to 0 so that a runtime that cannot separate them
    still writes valid records; the stall breakdown (experiment E7) then shows
    them inside the execution time.
    """

    job_id: str
    request_id: str
    workflow: str
    stage: str
    batch_id: str
    batch_size: int
    worker_id: str
    hardware: str
    gpu_share: float
    vcpus: int
    ready_ms: float
    start_ms: float
    end_ms: float
    predicted_ms: float
    cold_start_ms: float = 0.0
    transfer_ms: float = 0.0

    def __post_init__(self) -> None:
        for name in ("job_id", "request_id", "workflow", "stage", "batch_id", "worker_id", "hardware"):
            if not getattr(self, name):
                raise InvalidInputError(f"stage record: {name} must be non-empty, got {getattr(self, name)!r}")
        owner = f"stage record {self.job_id}"
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise InvalidInputError(f"{owner}: batch_size must be an int >= 1, got {self.batch_size!r}")
        if isinstance(self.vcpus, bool) or not isinstance(self.vcpus, int) or self.vcpus < 0:
            raise InvalidInputError(f"{owner}: vcpus must be an int >= 0, got {self.vcpus!r}")
        share = normalize_share(self.gpu_share)
        object.__setattr__(self, "gpu_share", share)
        if (share == 0.0) != (self.hardware == CPU):
            raise InvalidInputError(f"{owner}: hardware {self.hardware!r} does not fit gpu_share {share}")
        for name in ("ready_ms", "start_ms", "end_ms", "predicted_ms", "cold_start_ms", "transfer_ms"):
            _finite(owner, name, getattr(self, name))
        if not self.ready_ms <= self.start_ms <= self.end_ms:
            raise InvalidInputError(
                f"{owner}: need ready_ms <= start_ms <= end_ms, got {self.ready_ms}, {self.start_ms}, {self.end_ms}"
            )
        if self.cold_start_ms < 0 or self.transfer_ms < 0 or self.predicted_ms < 0:
            raise InvalidInputError(
                f"{owner}: predicted_ms, cold_start_ms and transfer_ms must be >= 0, got "
                f"{self.predicted_ms}, {self.cold_start_ms}, {self.transfer_ms}"
            )

    @property
    def queue_ms(self) -> float:
        """Time the job waited in its queue before its batch was dispatched."""
        return self.start_ms - self.ready_ms

    @property
    def service_ms(self) -> float:
        """Time from dispatch to the end of the batch (cold start and transfer included)."""
        return self.end_ms - self.start_ms

    @property
    def exec_ms(self) -> float:
        """Time the model itself ran: service time less cold start and transfer."""
        return self.service_ms - self.cold_start_ms - self.transfer_ms
