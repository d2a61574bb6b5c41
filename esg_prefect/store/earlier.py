"""A flow run's parts served by earlier instances of its pool, read back from the cost store.

A pool service restarted while a flow run is in flight (``esg-prefect pool
serve``, Ctrl-C, started again) serves the run's first calls in one process
and the rest in the next. The first instance's batches, calls and idle time
are in the store under its scope; it does not publish the run (the run had
not ended), and the second instance's records hold only its own calls. So
that the figure the second instance publishes is the store's
(``docs/decisions/one-cost.md``), the publisher adds these parts to the run's
records (:attr:`~esg_prefect.control.records.RunRecords.earlier`): one per
earlier scope, with the run's batches there, the idle time they caused and
their calls, priced with that instance's own prices and options, exactly as
:meth:`~esg_prefect.store.CostStore.cost_report` prices that scope.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Sequence
from typing import TypeVar

from sqlalchemy import select
from sqlmodel import Session, col

from esg_prefect.control.calls import StageResult
from esg_prefect.control.records import CallRecord, RunRecords
from esg_prefect.model.attribution import BatchItem, BatchRecord, IdleRecord, idle_owners
from esg_prefect.model.config import Config
from esg_prefect.store import queries as Q
from esg_prefect.store import rows as R
from esg_prefect.store.billing import Billing, scope_of
from esg_prefect.store.cost_store import CostStore
from esg_prefect.store.tables import BatchItemRow, BatchRow, IdleRow, PoolRow, PriceSheetRow, RunRow, StageCallRow

_Row = TypeVar("_Row", BatchRow, IdleRow)
_OTHER = BatchItem("-", "-")  # the item of a batch read only for its place on its worker (idle ownership)


def earlier_parts(
    store: CostStore, records: RunRecords, scope: str, known_calls: Collection[str] = ()
) -> tuple[RunRecords, ...]:
    """The run's parts that pools of other scopes than ``scope`` served, one per scope, oldest first.

    Args:
        store: the cost store the pools wrote.
        records: the run's records from the pool of ``scope`` (its id, workflow, times, SLO).
        scope: the scope of that pool's attachment: its own batches are in ``records``.
        known_calls: call ids ``records`` holds already (a call answered again here is not repeated).

    Returns:
        Each part's records: the run's batches in that scope, the idle intervals those batches
        caused (every batch and idle interval of their workers decides which), the run's calls
        there, that pool's prices, cost split and idle billing; ``settled``; each starts at the
        run's earliest stored arrival (the first instance's), where its SLO clock started. Empty
        when every batch of the run is this pool's (a pool that served the whole run): one
        indexed read.
    """
    with Session(store.engine) as s:
        ids = s.execute(
            select(col(BatchItemRow.batch_id)).where(col(BatchItemRow.run_id) == records.run_id).distinct()
        ).scalars()
        elsewhere = sorted(bid for bid in ids if scope_of(bid) != scope)
        if not elsewhere:
            return ()
        mine = _batches(s, elsewhere)
        workers = sorted({b.worker_id for b in mine})
        neighbours = _on_workers(s, BatchRow, workers)
        idles = [R.idle_record(r) for r in _on_workers(s, IdleRow, workers)]
        calls = s.execute(select(StageCallRow).where(col(StageCallRow.run_id) == records.run_id)).scalars()
        calls_of: defaultdict[str, list[CallRecord]] = defaultdict(list)
        for c in calls:
            if c.batch_id is not None and c.call_id not in known_calls and scope_of(c.batch_id) != scope:
                calls_of[scope_of(c.batch_id)].append(_call_record(c, records.workflow))
        sheets = {r.sheet_id: r for r in s.execute(select(PriceSheetRow)).scalars()}
        pools = {r.scope: r for r in s.execute(select(PoolRow)).scalars()}
        stored = s.execute(select(col(RunRow.arrival_ms)).where(col(RunRow.run_id) == records.run_id)).scalar()
    # The run started on the first instance: its row there holds that arrival (this one's starts later).
    arrival = records.arrival_ms if stored is None else min(records.arrival_ms, stored)
    sheet_of = {r.batch_id: r.sheet_id for r in neighbours}
    run_batches = {b.batch_id: b for b in mine}
    # Who owns each idle interval, decided among every batch of its worker (as the store decides it).
    placed = [run_batches.get(r.batch_id) or _placed(r) for r in neighbours]
    caused: defaultdict[str, list[IdleRecord]] = defaultdict(list)
    for idle, owner in idle_owners(placed, idles):
        if owner is not None and owner.batch_id in run_batches:
            caused[owner.batch_id].append(idle)
    by_scope: defaultdict[str, list[BatchRecord]] = defaultdict(list)
    for b in mine:
        by_scope[scope_of(b.batch_id)].append(b)
    parts = []
    for sc, batches in sorted(by_scope.items(), key=lambda kv: min(b.start_ms for b in kv[1])):
        row = pools.get(sc)
        billing = store.default_billing if row is None else Billing(row.cost_split, row.idle_billing)  # type: ignore[arg-type]
        sheet = sheets[sheet_of[batches[0].batch_id]]
        parts.append(
            RunRecords(
                records.run_id,
                records.workflow,
                tuple(sorted(calls_of.get(sc, []), key=lambda c: c.end_ms)),
                tuple(batches),
                arrival,
                records.finish_ms,
                records.slo_ms,
                R.sheet_from_row(sheet.price_per_vcpu_s, sheet.price_per_gpu_s_json),
                billing.cost_split,
                caused_idles=tuple(i for b in batches for i in caused[b.batch_id]),
                settled=True,
                idle_billing=billing.idle_billing,
                run_name=records.run_name,
            )
        )
    return tuple(parts)


def _batches(s: Session, batch_ids: Sequence[str]) -> list[BatchRecord]:
    """These stored batches with their items, by start."""
    items = Q.items_of(s, batch_ids)
    out: list[BatchRecord] = []
    for chunk in Q.chunks(batch_ids):
        rows = s.execute(select(BatchRow).where(col(BatchRow.batch_id).in_(chunk))).scalars()
        out += [R.batch_record(r, items.get(r.batch_id, [])) for r in rows]
    return sorted(out, key=lambda b: (b.start_ms, b.batch_id))


def _on_workers(s: Session, model: type[_Row], workers: Sequence[str]) -> list[_Row]:
    """Every stored batch (or idle interval) of these workers, by start."""
    out: list[_Row] = []
    for chunk in Q.chunks(workers):
        out += s.execute(select(model).where(col(model.worker_id).in_(chunk))).scalars()
    return sorted(out, key=lambda r: r.start_ms)


def _placed(row: BatchRow) -> BatchRecord:
    """Another run's batch, for its place on its worker only (its items are not read)."""
    return BatchRecord(
        row.batch_id,
        row.worker_id,
        (_OTHER,),
        Config(row.batch_size, row.vcpus, row.gpu_share),
        row.hardware,
        row.start_ms,
        row.end_ms,
    )


def _call_record(c: StageCallRow, workflow: str) -> CallRecord:
    """A stored call of a batch as the pool recorded it (its output was never kept)."""
    result = StageResult(
        c.call_id,
        None,
        c.batch_id or "",
        c.batch_size or 0,
        c.worker_id or "",
        c.hardware or "",
        c.vcpus or 0,
        c.gpu_share or 0.0,
        c.queue_wait_ms or 0.0,
        c.predicted_ms or 0.0,
        c.actual_ms or 0.0,
        bool(c.cold_start),
        bool(c.at_risk),
        c.reason,
        c.co_batched_runs or 1,
    )
    return CallRecord(
        c.call_id, c.request_id, c.run_id, workflow, c.stage, c.ready_ms, c.start_ms, c.end_ms, c.ok, result, c.error
    )
