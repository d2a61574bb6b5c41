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
:meth:`~esg_prefect.store.CostStore.cost_report` prices that scope. Any other
scope holding batches of the run counts the same way (a flow run retried in
a new process whose pool attached the same store, too).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Collection, Sequence
from typing import Any, TypeVar

from sqlalchemy import and_, func, select
from sqlmodel import Session, col

from esg_prefect.control.calls import StageResult
from esg_prefect.control.records import CallRecord, RunRecords
from esg_prefect.model.attribution import BatchItem, BatchRecord, IdleRecord, idle_owners
from esg_prefect.model.config import Config
from esg_prefect.model.pricing import PriceSheet
from esg_prefect.store import queries as Q
from esg_prefect.store import rows as R
from esg_prefect.store.billing import scope_of
from esg_prefect.store.cost_store import CostStore
from esg_prefect.store.tables import BatchItemRow, BatchRow, IdleRow, PoolRow, PriceSheetRow, RunRow, StageCallRow

_Keyed = TypeVar("_Keyed", PriceSheetRow, PoolRow)
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
        caused (decided as among every batch and interval of their workers, from those around
        the run's batches), the run's calls there, that pool's prices, cost split and idle
        billing; ``settled``; each starts at the run's earliest stored arrival (the first
        instance's), where its SLO clock started. Empty when every batch of the run is this
        pool's (a pool that served the whole run): one indexed read.
    """
    with Session(store.engine) as s:
        return _parts(store, s, records, scope, known_calls, _batches_of_run(s, records.run_id))


def ended_elsewhere(
    store: CostStore, run_id: str, scope: str, prices: PriceSheet, cost_split: str, idle_billing: str
) -> RunRecords | None:
    """The records of a run that ended in the pool of ``scope`` while that pool held none of its calls.

    A pool service restarted after the run's last call: the earlier instance stored
    the whole run (its batches, calls, idle time, a provisional row), and this one
    sees only its end. The records hold no call of this pool (``prices`` and the
    options are its own, for its empty part); the run's parts are :attr:`earlier`,
    its workflow, SLO, name and start are its stored row's, its finish its stored
    calls' last end (None if one failed), so the run is published and its row
    finished as a run spanning the restart is.

    Returns:
        None when the store has no row of the run (one indexed read: a run no pool of
        the store served, such as another flow's end), when its row is no longer provisional
        (its end was written, by any instance: ``ended``), or when no other scope, or this one too, holds its batches.
    """
    with Session(store.engine) as s:
        row = s.get(RunRow, run_id)
        if row is None or row.ended:  # no row, or its end was written (a run with a failed call has no finish)
            return None
        ids = _batches_of_run(s, run_id)
        if not ids or any(scope_of(bid) == scope for bid in ids):  # this pool served some: not unseen here
            return None
        base = RunRecords(
            run_id,
            row.workflow,
            (),
            (),
            row.arrival_ms,
            None,
            row.slo_ms,
            prices,
            cost_split,
            settled=True,
            idle_billing=idle_billing,
            run_name=row.run_name,
        )
        parts = _parts(store, s, base, scope, (), ids)
    calls = [c for p in parts for c in p.calls]
    finish = max(c.end_ms for c in calls) if calls and all(c.ok for c in calls) else None
    parts = tuple(dataclasses.replace(p, finish_ms=finish) for p in parts)
    return dataclasses.replace(base, finish_ms=finish, arrival_ms=parts[0].arrival_ms, earlier=parts)


def _batches_of_run(s: Session, run_id: str) -> list[str]:
    """The ids of the stored batches with calls of the run (one indexed read)."""
    q = select(col(BatchItemRow.batch_id)).where(col(BatchItemRow.run_id) == run_id).distinct()
    return list(s.execute(q).scalars())


def _parts(
    store: CostStore,
    s: Session,
    records: RunRecords,
    scope: str,
    known_calls: Collection[str],
    batch_ids: Collection[str],
) -> tuple[RunRecords, ...]:
    """:func:`earlier_parts`, given the run's stored batch ids."""
    elsewhere = sorted(bid for bid in batch_ids if scope_of(bid) != scope)
    if not elsewhere:
        return ()
    rows = _batch_rows(s, elsewhere)
    items = Q.items_of(s, elsewhere)
    mine = [R.batch_record(r, items.get(r.batch_id, [])) for r in rows]
    neighbours, idle_rows = _around(s, mine)
    idles = [R.idle_record(r) for r in idle_rows]
    calls = s.execute(select(StageCallRow).where(col(StageCallRow.run_id) == records.run_id)).scalars()
    calls_of: defaultdict[str, list[CallRecord]] = defaultdict(list)
    failed: list[CallRecord] = []  # failed calls are stored with no batch, so with no scope: the first part's
    for c in calls:
        if c.call_id in known_calls:
            continue
        if c.batch_id is not None and scope_of(c.batch_id) != scope:
            calls_of[scope_of(c.batch_id)].append(_call_record(c, records.workflow))
        elif c.batch_id is None and not c.ok:
            failed.append(_call_record(c, records.workflow))
    sheet_of = {r.batch_id: r.sheet_id for r in rows}
    sheets = {r.sheet_id: r for r in _where_in(s, PriceSheetRow, PriceSheetRow.sheet_id, set(sheet_of.values()))}
    pools = {r.scope: r for r in _where_in(s, PoolRow, PoolRow.scope, {scope_of(b) for b in elsewhere})}
    stored = s.execute(select(col(RunRow.arrival_ms)).where(col(RunRow.run_id) == records.run_id)).scalar()
    # The run started on the first instance: its row there holds that arrival (this one's starts later).
    arrival = records.arrival_ms if stored is None else min(records.arrival_ms, stored)
    run_batches = {b.batch_id: b for b in mine}
    # Who owns each idle interval, decided among its worker's batches around the run's (as the store decides it).
    placed = [run_batches.get(r.batch_id) or _placed(r) for r in neighbours]
    caused: defaultdict[str, list[IdleRecord]] = defaultdict(list)
    for idle, owner in idle_owners(placed, idles):
        if owner is not None and owner.batch_id in run_batches:
            caused[owner.batch_id].append(idle)
    by_scope: defaultdict[str, list[BatchRecord]] = defaultdict(list)
    for b in mine:
        by_scope[scope_of(b.batch_id)].append(b)
    parts: list[RunRecords] = []
    for sc, batches in sorted(by_scope.items(), key=lambda kv: min(b.start_ms for b in kv[1])):
        billing = store.pool_billing(pools.get(sc))
        sheet = sheets[sheet_of[batches[0].batch_id]]
        parts.append(
            RunRecords(
                records.run_id,
                records.workflow,
                tuple(sorted(calls_of.get(sc, []) + (failed if not parts else []), key=lambda c: c.end_ms)),
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


def _batch_rows(s: Session, batch_ids: Sequence[str]) -> list[BatchRow]:
    """These stored batches, by start (then id, as the store orders them)."""
    out: list[BatchRow] = []
    for chunk in Q.chunks(batch_ids):
        out += s.execute(select(BatchRow).where(col(BatchRow.batch_id).in_(chunk))).scalars()
    return sorted(out, key=lambda r: (r.start_ms, r.batch_id))


def _where_in(s: Session, model: type[_Keyed], key: Any, values: Collection[str]) -> list[_Keyed]:
    """The rows of ``model`` whose ``key`` is one of ``values``."""
    out: list[_Keyed] = []
    for chunk in Q.chunks(sorted(values)):
        out += s.execute(select(model).where(col(key).in_(chunk))).scalars()
    return out


def _around(s: Session, mine: Sequence[BatchRecord]) -> tuple[list[BatchRow], list[IdleRow]]:
    """The batches and idle intervals of the run's workers that decide which idle time its batches caused.

    :func:`~esg_prefect.model.attribution.idle_owners` gives an interval to the
    batch of its worker that ended last at or before the interval's start (by
    end, then start and id, as the store orders them); with none (a lead
    interval, before the worker's first batch end), to the first batch that
    starts at or after the interval's end. So a batch of the run ending at ``e``
    can own only intervals that start in ``[e, h)``, ``h`` the worker's next
    batch end after ``e``, where the owner is one of the batches ending at ``e``,
    and lead intervals, whose owner is one batch found for each. Those are read,
    not each worker's whole history: the owners come out as among every batch.
    """
    batches: dict[str, BatchRow] = {}
    idles: dict[str, IdleRow] = {}
    end, start, worker = col(BatchRow.end_ms), col(BatchRow.start_ms), col(BatchRow.worker_id)
    idle_start, idle_worker = col(IdleRow.start_ms), col(IdleRow.worker_id)
    for w in sorted({b.worker_id for b in mine}):
        for e in sorted({b.end_ms for b in mine if b.worker_id == w}):
            batches.update((r.batch_id, r) for r in s.execute(select(BatchRow).where(worker == w, end == e)).scalars())
            h = s.execute(select(func.min(end)).where(worker == w, end > e)).scalar()
            window = idle_start >= e if h is None else and_(idle_start >= e, idle_start < h)
            idles.update((r.idle_id, r) for r in s.execute(select(IdleRow).where(idle_worker == w, window)).scalars())
        first_end = s.execute(select(func.min(end)).where(worker == w)).scalar_one()
        for lead in s.execute(select(IdleRow).where(idle_worker == w, idle_start < first_end)).scalars():
            idles[lead.idle_id] = lead
            first = (
                select(BatchRow).where(worker == w, start >= lead.end_ms).order_by(end, start, col(BatchRow.batch_id))
            )
            batches.update((r.batch_id, r) for r in s.execute(first.limit(1)).scalars())
    return (
        sorted(batches.values(), key=lambda r: (r.start_ms, r.batch_id)),
        sorted(idles.values(), key=lambda r: (r.start_ms, r.idle_id)),
    )


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
    """A stored call as the pool recorded it (its output was never kept; a failed call has no batch, no result)."""
    if c.batch_id is None:
        return CallRecord(
            c.call_id, c.request_id, c.run_id, workflow, c.stage, c.ready_ms, c.start_ms, c.end_ms, c.ok, None, c.error
        )
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
