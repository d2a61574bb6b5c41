"""What crosses the boundary between a flow run and the pool: calls and results.

Plain data only, so the same types travel in-process and, encoded, over HTTP
to the pool service.
"""

from __future__ import annotations

import concurrent.futures
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import networkx as nx

from esg_prefect.exceptions import InvalidInputError
from esg_prefect.model.workflow import MAX_SLO_MS
from esg_prefect.wording import counted

MAX_RUN_NAME = 200
"""Characters of a call's ``run_name`` kept (a name for a table; Prefect's own are short)."""


def shortened_run_name(name: str) -> str:
    """``name`` as a call carries it: at most :data:`MAX_RUN_NAME` characters, a cut one ending in ``…``.

    A ``flow_run_name`` template can make long names; cut silently, ``esg-prefect costs --by run``
    would show a truncated name as if it were the whole one.

    Example:
        >>> shortened_run_name("crimson-fox"), len(shortened_run_name("x" * 500)), shortened_run_name("x" * 500)[-2:]
        ('crimson-fox', 200, 'x…')
    """
    return name if len(name) <= MAX_RUN_NAME else name[: MAX_RUN_NAME - 1] + "…"


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
        if not isinstance(self.name, str) or not self.name:
            raise InvalidInputError(f"workflow name must be a non-empty string, got {self.name!r}")
        slo = self.slo_ms
        if isinstance(slo, bool) or not (isinstance(slo, (int, float)) and 0 < slo <= MAX_SLO_MS):
            raise InvalidInputError(
                f"workflow {self.name!r}: slo_ms must be a number of ms > 0 and at most {MAX_SLO_MS:.0f} "
                f"(a week), got {slo!r}"
            )
        if self.edges is not None and not all(isinstance(e, tuple) and len(e) == 2 for e in self.edges):
            raise InvalidInputError(f"workflow {self.name!r}: edges must be (upstream, downstream) pairs")
        for n in (*self.stages, *(x for e in self.edges or () for x in e)):
            if not isinstance(n, str) or not n:
                raise InvalidInputError(f"workflow {self.name!r}: stage names must be non-empty strings, got {n!r}")
        cycle = _cycle(self.edges or ())
        if cycle:
            raise InvalidInputError(f"workflow {self.name!r}: edges form a cycle {' -> '.join(cycle)}")

    def graph(self) -> tuple[frozenset[str], frozenset[tuple[str, str]]] | None:
        """The declared stages and edges, order-free (to compare two declarations); None when undeclared."""
        if self.edges is None:
            return None
        return frozenset((*self.stages, *(x for e in self.edges for x in e))), frozenset(self.edges)


def _cycle(edges: Sequence[tuple[str, str]]) -> list[str]:
    """A cycle of the directed graph ``edges`` as a closed list of names, or [] when it has none.

    networkx's search is iterative: a chain of thousands of stages is no recursion limit.
    """
    try:
        found = nx.find_cycle(nx.DiGraph(list(edges)))
    except nx.NetworkXNoCycle:
        return []
    return [found[0][0], *(b for _, b in found)]


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
        profile_stage: the stage's name in the latency profile, where it differs
            from ``stage`` (``profile_name`` of the decorator); empty: ``stage``.
        run_name: the flow run's name in Prefect, if any: the pool's run records
            carry it to the cost store (``esg-prefect costs --by run``).
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
    profile_stage: str = ""
    run_name: str = ""

    def __post_init__(self) -> None:
        for name in ("call_id", "stage", "stage_path", "request_id", "run_id"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise InvalidInputError(f"call field {name!r} must be a non-empty string, got {value!r}")
        if ":" not in self.stage_path:
            raise InvalidInputError(f"stage_path must look like 'module:attribute', got {self.stage_path!r}")
        for name in ("profile_stage", "run_name"):
            if not isinstance(getattr(self, name), str):
                raise InvalidInputError(f"call field {name!r} must be a string, got {getattr(self, name)!r}")
        if not isinstance(self.workflow, WorkflowDecl):
            raise InvalidInputError(f"call workflow must be a WorkflowDecl, got {type(self.workflow).__name__}")
        if not all(isinstance(u, str) for u in self.upstream):
            raise InvalidInputError(f"call upstream must be call ids (strings), got {self.upstream!r}")
        arrival = self.arrival_ms
        if isinstance(arrival, bool) or not isinstance(arrival, (int, float)) or not math.isfinite(arrival):
            raise InvalidInputError(f"arrival_ms must be a finite number, got {arrival!r}")
        size = self.input_size
        if size is not None and (
            isinstance(size, bool) or not isinstance(size, (int, float)) or not (math.isfinite(size) and size > 0)
        ):
            raise InvalidInputError(f"input_size must be a finite number > 0, got {size!r}")

    def identity(self) -> tuple[str, str, str, str, str]:
        """What a call id is bound to besides its input: a reused id must name the same call."""
        return (self.stage, self.stage_path, self.workflow.name, self.request_id, self.run_id)


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
    lines: tuple[tuple[int, str, str], ...] = ()
    """What the batch printed or logged: (level, logger or "" for a print, text) (``runtime.batch_output``)."""

    def describe(self) -> str:
        """One log line: which batch, its size, the worker and share, waits and latencies, and the scheduler's reason.

        The reason says why a batch was at risk (no plan met the slack) or how it was planned; it is
        shortened and kept on the line.
        """
        where = f"{self.hardware} share {self.gpu_share:.2f}" if self.hardware != "cpu" else "cpu"
        tail = "; AT RISK of missing the SLO" if self.at_risk else ""
        why = _short(self.reason)
        if why:
            tail += (": " if self.at_risk else "; ") + why
        return (
            f"batch {self.batch_id} ({counted(self.batch_size, 'item')} from {counted(self.co_batched_runs, 'run')}) "
            f"on worker "
            f"{self.worker_id} [{where}, {self.vcpus} vCPU]{' cold start' if self.cold_start else ''}; "
            f"queue wait {self.queue_wait_ms:.1f} ms; predicted {self.predicted_ms:.1f} ms, "
            f"actual {self.actual_ms:.1f} ms{tail}"
        )


_REASON_CHARS = 120


def _short(text: str) -> str:
    """``text`` on one line (runs of whitespace, newlines included, as one space), cut to :data:`_REASON_CHARS`."""
    one = " ".join(text.split())
    return one if len(one) <= _REASON_CHARS else one[: _REASON_CHARS - 3].rstrip() + "..."


def batch_ids(results: Sequence[StageResult]) -> set[str]:
    """Distinct batches among results (helps tests and reports)."""
    return {r.batch_id for r in results}


class StagePool(Protocol):
    """Where a runner hands stage calls: an embedded :class:`~esg_prefect.runtime.pool.Pool`
    or a :class:`~esg_prefect.service.client.PoolClient` of the pool service."""

    def submit(self, call: StageCall) -> concurrent.futures.Future[StageResult]:
        """Queue a call; the future resolves to its result or raises a StageCallError."""
        ...

    def end_run(self, run_id: str) -> None:
        """A flow run ended (non-blocking)."""
        ...

    def cancel(self, call_id: str) -> None:
        """The caller stopped waiting for a call: withdrawn if still queued (non-blocking)."""
        ...
