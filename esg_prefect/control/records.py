"""What a pool records of the calls it served: typed rows that the store, artifacts and reports read.

Records keep no outputs (only sizes, times, placements and outcomes), so they
stay small however large the stage outputs are.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from esg_prefect.control.calls import StageResult
from esg_prefect.control.totals import Totals
from esg_prefect.model.attribution import BatchRecord, IdleRecord, RunCost, attribute_costs, split_weights
from esg_prefect.model.jobs import QueueKey
from esg_prefect.model.pricing import PriceSheet
from esg_prefect.model.records import RequestRecord, StageRecord
from esg_prefect.scheduling.base import DecisionStats


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One finished call, for reports and artifacts (``result`` carries no output)."""

    call_id: str
    request_id: str
    run_id: str
    workflow: str
    stage: str
    ready_ms: float
    start_ms: float
    end_ms: float
    ok: bool
    result: StageResult | None
    error: str = ""


@dataclass(frozen=True, slots=True)
class RequestRow:
    """One request (workflow instance) the pool saw; ``finish_ms`` is None until it finished well."""

    run_id: str
    workflow: str
    arrival_ms: float
    finish_ms: float | None
    slo_ms: float
    at_risk: bool


@dataclass(frozen=True, slots=True)
class WorkerRow:
    """One live worker: what it holds and serves, and how its share is enforced."""

    worker_id: str
    stage: str
    busy: bool
    vcpus: int
    gpu_share: float
    hardware: str
    enforcement: str = ""


@dataclass(frozen=True, slots=True)
class CorrectionRow:
    """The online correction of one (stage, hardware): learned factor, factor planned with, batches seen.

    ``overhead_ms``: the learned per-batch overhead of a worker in another
    process (round trip beyond the worker's own time); 0 for in-process workers.
    """

    stage: str
    hardware: str
    factor: float
    applied: float
    batches: int
    overhead_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """Copies of a pool's records, taken at one instant so they are consistent.

    ``idles`` holds the closed idle intervals, in the order the pool recorded
    them, then the open ones of the workers idle now, counted up to the
    snapshot (``closed_idles`` of them are closed; None: not known).
    ``idle_since`` maps each worker idle now to when its idle time began.
    ``first_batch`` and ``first_idle`` are the positions of ``batches[0]`` and
    ``idles[0]`` among every record the pool made (a long-lived pool keeps the
    newest only); ``closed_idles`` counts from ``first_idle``. ``queues``: the
    waiting jobs of every queue, empty ones too (:attr:`queue_depths` is read
    from it); ``totals``: the running totals since the pool started
    (:class:`~esg_prefect.control.totals.Totals`, a copy).
    """

    calls: tuple[CallRecord, ...]
    batches: tuple[BatchRecord, ...]
    idles: tuple[IdleRecord, ...]
    decisions: tuple[DecisionStats, ...]
    requests: dict[str, RequestRow]
    workers: tuple[WorkerRow, ...]
    corrections: tuple[CorrectionRow, ...] = ()
    closed_idles: int | None = None
    idle_since: Mapping[str, float] = field(default_factory=dict)
    first_batch: int = 0
    first_idle: int = 0
    queues: Mapping[QueueKey, int] = field(default_factory=dict)
    totals: Totals = field(default_factory=Totals)

    @property
    def queue_depths(self) -> dict[str, int]:
        """Waiting jobs of the non-empty queues, keyed ``workflow/stage`` (``str(QueueKey)``), as JSON shows them.

        Read from :attr:`queues`, so the two cannot disagree; the service's ``/metrics`` JSON carries it.
        """
        return {str(k): n for k, n in self.queues.items() if n}


@dataclass(frozen=True, slots=True)
class RunRecords:
    """What one flow run did in the pool, handed to run listeners when the run ends.

    Attributes:
        run_id: the flow run.
        workflow: its workflow (of its first request).
        calls: its stage calls, in completion order.
        batches: the batches its calls ran in (with the other runs' items: costs are shares).
        arrival_ms, finish_ms: first arrival and last stage end of its requests (wall clock).
        slo_ms: the workflow's SLO.
        prices: the price sheet in force.
        cost_split: how batch costs are split among jobs.
        new_idles: warm idle intervals of any worker closed since the previous run ended,
            so that a listener storing them sees each exactly once.
        caused_idles: the idle intervals its batches caused (each attributed to one
            of ``batches``, see :mod:`~esg_prefect.model.attribution`), once known:
            the artifact publisher fills them in when the run's cost is final.
        settled: whether ``caused_idles`` is complete, so that :meth:`cost` is final
            (every idle interval after the run's batches has closed).
        idle_billing: the pool's idle billing (``separate``: no idle time is the run's).
        run_name: the flow run's name in Prefect, from its calls (None: none said it).
        earlier: the run's parts served by other instances of the pool: the cost store's other
            scopes holding its batches (a pool service restarted while the run was in flight, a
            flow run retried in a new process), one per instance, each priced with that
            instance's own prices and options: read back from the cost store by the artifact
            publisher (``store.earlier``), so that the run's figure is the store's. Their
            costs are in :meth:`cost`; empty for a run one pool served from start to end.
    """

    run_id: str
    workflow: str
    calls: tuple[CallRecord, ...]
    batches: tuple[BatchRecord, ...]
    arrival_ms: float
    finish_ms: float | None
    slo_ms: float
    prices: PriceSheet
    cost_split: str
    new_idles: tuple[IdleRecord, ...] = ()
    caused_idles: tuple[IdleRecord, ...] = ()
    settled: bool = False
    idle_billing: str = "attribute"
    run_name: str | None = None
    earlier: tuple[RunRecords, ...] = ()

    def cost(self) -> RunCost:
        """The run's cost: its shares of its batches' busy time and of the idle time they caused.

        The one figure the artifacts, the cost store and the reports show
        (:func:`~esg_prefect.model.attribution.attribute_costs` over the run's
        batches and ``caused_idles``, plus the cost of each :attr:`earlier` part);
        final when ``settled``.
        """
        own = attribute_costs(
            self.batches,
            self.caused_idles,
            self.prices,
            self.cost_split,  # type: ignore[arg-type]
            self.idle_billing,  # type: ignore[arg-type]
        ).run_cost(self.run_id)
        parts = [p.cost() for p in self.earlier]
        if not parts:
            return own
        return RunCost(own.busy + sum(p.busy for p in parts), own.idle + sum(p.idle for p in parts), own.unit)

    def busy_cost(self) -> float:
        """This run's share of its batches' busy time alone: the busy part of :meth:`cost`."""
        total = 0.0
        for b in self.batches:
            cost = self.prices.batch_cost(b.config, b.hardware, b.duration_ms)
            for item, w in zip(b.items, split_weights(b.items, self.cost_split), strict=True):  # type: ignore[arg-type]
                if item.run_id == self.run_id:
                    total += cost * w
        return total + sum(p.busy_cost() for p in self.earlier)


RunListener = Callable[[RunRecords], None]
"""Called with each ended run's records.

A run or batch listener (or the object a bound-method listener belongs to)
that has a ``pool_closed()`` method is called once more when the pool closes,
on the listeners' thread, after everything else it was handed: the pool's
records are final then (read them with
:func:`~esg_prefect.runtime.pool_records.final_records`).
"""


RunLookup = Callable[[str], RunRecords | None]
"""Given a run that ended in a pool holding none of its calls, its records from elsewhere (None: unknown).

The cost store's (``StoreAttachment.ended_elsewhere``): a pool service restarted
after the run's last call stored the whole run under the earlier instance's scope.
"""


class ClosingListener(Protocol):
    """A listener told of the pool's close (see :data:`RunListener`)."""

    def pool_closed(self) -> None:
        """The pool closed: its records are final."""
        ...


@dataclass(frozen=True, slots=True)
class RunStub:
    """What is known of a run before it ends: enough for the store to file its calls under it.

    ``run_name``: the flow run's name its calls carried (None: none did), so that a run that never
    ends (its process died) is still listed by name in ``esg-prefect costs``.
    """

    run_id: str
    workflow: str
    arrival_ms: float
    slo_ms: float
    run_name: str | None = None


@dataclass(frozen=True, slots=True)
class BatchDone:
    """One batch as it completes, handed to batch listeners (the cost store keeps it at once).

    Attributes:
        batch: the batch (every item, with its run).
        calls: the calls it finished (calls re-queued after a crash come with a later batch).
        workflow: the workflow of its queue.
        stage: the stage of its queue (the pool's name for it).
        prices: the price sheet in force.
        runs: the runs of ``calls``, as known so far.
        new_idles: idle intervals of any worker closed since the previous batch was handed over.
        batch_index: the batch's position in the pool's batch records (-1: not known).
        idle_index: the position of ``new_idles[0]`` in the pool's idle records (-1: not known),
            so that a listener that also reads snapshots takes each record once.
    """

    batch: BatchRecord
    calls: tuple[CallRecord, ...]
    workflow: str
    stage: str
    prices: PriceSheet
    runs: tuple[RunStub, ...] = ()
    new_idles: tuple[IdleRecord, ...] = ()
    batch_index: int = -1
    idle_index: int = -1


BatchListener = Callable[[Sequence[BatchDone]], None]  # the batches completed since its previous call


class RecordSource(Protocol):
    """What keeps records for listeners: a pool (the store and the artifacts need only this)."""

    prices: PriceSheet

    def snapshot(self, timeout_s: float = 30.0) -> PoolSnapshot:
        """Consistent copies of the records so far."""
        ...

    def add_run_listener(self, listener: RunListener) -> None:
        """Call ``listener(records)`` each time a flow run ends."""
        ...

    def add_batch_listener(self, listener: BatchListener) -> None:
        """Call ``listener(batches)`` with the batches completed since its previous call."""
        ...


def request_records(snap: PoolSnapshot) -> list[RequestRecord]:
    """One record per request the pool saw (unfinished or failed ones have no finish time)."""
    return [
        RequestRecord(rid, r.run_id, r.workflow, r.arrival_ms, r.finish_ms, r.slo_ms, r.at_risk)
        for rid, r in snap.requests.items()
    ]


def stage_records(snap: PoolSnapshot) -> list[StageRecord]:
    """One record per stage call that produced its output."""
    out = []
    for c in snap.calls:
        res = c.result
        if not c.ok or res is None:
            continue
        out.append(
            StageRecord(
                c.call_id,
                c.request_id,
                c.workflow,
                c.stage,
                res.batch_id,
                res.batch_size,
                res.worker_id,
                res.hardware,
                res.gpu_share,
                res.vcpus,
                c.ready_ms,
                c.start_ms,
                c.end_ms,
                res.predicted_ms,
            )
        )
    return out
