"""The cost store: what each flow run did in the pool, kept in SQL, and its cost on demand.

A pool hands each finished flow run's records to its run listeners
(:meth:`~esg_prefect.runtime.pool.Pool.add_run_listener`); :func:`attach_store`
makes the store one of them. Every write is an upsert by id, so a batch shared
by several runs (it arrives with each of them), a listener called twice, or an
idle interval stored while open and again once closed, is stored once.

Costs are not stored but computed when asked for, with
:func:`~esg_prefect.model.attribution.attribute_costs` over the stored
batches and idle intervals, one price sheet at a time (a worker belongs to one
pool, a pool has one sheet, so attribution never mixes sheets): a run's cost
is the figure its artifacts show, busy and idle parts (``docs/decisions/one-cost.md``).
It is final once the idle intervals after the run's batches are stored closed:
they are stored open (``StoreAttachment.flush``), as they close (handed over
with later batches and runs) and, for what was still open, at the pool's close.
Each pool's records are priced with the cost split and idle billing that pool
priced its runs with (stored per pool, :mod:`~esg_prefect.store.billing`), so
the store's figure is its artifacts'; a caller may override them for a what-if.

Example:
    >>> from esg_prefect.store import CostStore, attach_store   # doctest: +SKIP
    >>> store = CostStore("sqlite:////tmp/costs.db")              # doctest: +SKIP
    >>> attach_store(pool, store)                                 # doctest: +SKIP
    >>> for row in store.costs("workflow"): print(row.key, row.cost)   # doctest: +SKIP
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, func, select
from sqlalchemy.engine import Connection
from sqlmodel import Session, col

from esg_prefect.exceptions import ConfigError, InvalidInputError
from esg_prefect.model.attribution import CostReport, CostSplit, IdleBilling, attribute_costs, merge_reports
from esg_prefect.model.pricing import PriceSheet
from esg_prefect.store import queries as Q
from esg_prefect.store import rows as R
from esg_prefect.store import writes as W
from esg_prefect.store.billing import DEFAULT_BILLING, Billing, PoolPricing, scope_of
from esg_prefect.store.engine import WRITE, create_engine, resolve_url, safe_url
from esg_prefect.store.migrations import Migration, current_version, migrate
from esg_prefect.store.report import CostRow, RunInfo, check_group_by, group_costs
from esg_prefect.store.tables import (
    BatchItemRow,
    BatchRow,
    IdleRow,
    PoolRow,
    PriceSheetRow,
    RunRow,
    StageCallRow,
)

if TYPE_CHECKING:
    from esg_prefect.control.records import BatchDone, RunRecords, RunStub
    from esg_prefect.model.attribution import IdleRecord

logger = logging.getLogger(__name__)


def since_ms(since: datetime | float | None) -> float | None:
    """A window start as epoch ms: a datetime (naive means UTC) or a number of epoch ms.

    Raises:
        InvalidInputError: for anything else.
    """
    if since is None:
        return None
    if isinstance(since, datetime):
        if since.tzinfo is None:
            since = since.replace(tzinfo=UTC)
        return since.timestamp() * 1000.0
    if isinstance(since, (int, float)) and not isinstance(since, bool):
        return float(since)
    raise InvalidInputError(f"since must be a datetime or epoch ms, got {since!r}")


class CostStore:
    """Flow runs, stage calls, batches, idle time and prices in SQLite or PostgreSQL.

    Args:
        url: SQLAlchemy URL or SQLite file path; default ``$ESG_PREFECT_STORE_URL``,
            else ``$PREFECT_HOME/esg_prefect/costs.db``.
        cost_split: split of a batch's cost among its jobs (``equal`` or ``input_size``) for
            records whose pool stored no options (written by an older esg-prefect, or by
            :meth:`record` without ``billing``).
        idle_billing: billing of warm idle time (``attribute`` or ``separate``), likewise.
        create: create the SQLite file if missing (the CLI reads without creating).
        migrations: schema steps (tests pass their own; default the released ones).

    Raises:
        ConfigError: a bad URL or setting, a missing driver, or a schema newer than this code.

    Examples:
        >>> store = CostStore("sqlite://")        # in memory
        >>> store.schema_version
        7
        >>> store.costs("run")[-1].key
        '(unattributed idle)'
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        cost_split: CostSplit = "equal",
        idle_billing: IdleBilling = "attribute",
        create: bool = True,
        migrations: Sequence[Migration] | None = None,
    ) -> None:
        self.default_billing = Billing(cost_split, idle_billing)
        self.url = resolve_url(url)
        self.engine: Engine = create_engine(self.url, create=create)
        self._write_lock = threading.Lock()  # guards writes: pools of one process share a store
        self._pools_kept: set[str] = set()  # scopes whose options a committed write of this store stored
        self._sheets_kept: set[str] = set()  # sheet ids a committed write of this store stored
        try:
            migrate(self.engine, migrations)
        except Exception:
            self.engine.dispose()
            raise

    def __repr__(self) -> str:
        return f"CostStore({safe_url(self.url)!r})"

    @property
    def schema_version(self) -> int | None:
        """The schema version of the database."""
        return current_version(self.engine)

    # ---- writing -------------------------------------------------------------------------------

    def record(
        self,
        records: RunRecords,
        *,
        scope: str = "",
        deployment: str | None = None,
        billing: Billing | None = None,
        name: str | None = None,
    ) -> None:
        """Store one finished flow run: run, calls, batches with their items, new idle intervals, prices.

        Suitable as a pool run listener (thread-safe). Idempotent: the same records
        stored twice leave the same rows.

        Args:
            records: what the pool handed its run listeners.
            scope: prefix of the pool's batch and worker ids (see :func:`attach_store`).
            deployment: the run's deployment name, if known (a known one is never erased by None).
            billing: the pool's pricing options, kept for its scope (the first ones stored
                stay); None: its records are read with the store's defaults.
            name: the flow run's name, if known (as ``deployment``, never erased by None).
        """
        batches, items = R.batch_rows(records.batches, records.calls, records.prices, scope)
        with self._writing(scope, billing, [records.prices]) as conn:
            W.upsert(conn, RunRow, [W.run_row(conn, records, deployment, name)], ("run_id",), keep_if_null=W.KEEP)
            W.upsert(conn, BatchRow, batches, ("batch_id",))
            W.upsert(conn, BatchItemRow, items, ("batch_id", "position"))
            W.upsert(conn, StageCallRow, R.call_rows(records.calls, scope), ("call_id",))
            W.upsert(conn, IdleRow, R.idle_rows(records.new_idles, records.prices, scope), ("idle_id",))

    def record_run(
        self,
        records: RunRecords,
        *,
        scope: str = "",
        deployment: str | None = None,
        billing: Billing | None = None,
        name: str | None = None,
    ) -> tuple[float, float | None]:
        """Store a run's own row and the idle intervals closed since, when its batches are stored already.

        What a pool's run listener needs once :meth:`record_batches` has written
        the run's batches and calls as they completed (see ``attach_store``).
        ``billing`` and ``name`` as for :meth:`record`. Returns the run's arrival and finish as
        stored: the earliest arrival written for it, and no finish if a call failed, on an
        earlier pool instance too (after a restart).
        """
        with self._writing(scope, billing, [records.prices]) as conn:
            row = W.run_row(conn, records, deployment, name)
            W.upsert(conn, RunRow, [row], ("run_id",), keep_if_null=W.KEEP)
            W.upsert(conn, IdleRow, R.idle_rows(records.new_idles, records.prices, scope), ("idle_id",))
        return float(row["arrival_ms"]), row["finish_ms"]

    def record_open_runs(
        self,
        runs: Sequence[RunStub],
        *,
        scope: str = "",
        billing: Billing | None = None,
        deployments: Mapping[str, str | None] | None = None,
    ) -> None:
        """Store the start of runs a closing pool held that had not ended, under provisional rows.

        A pool service stopped while a run's calls still queued stored no batch of it:
        without this, the run would start where its calls reach the next instance. A
        stored provisional row that starts later takes the earlier start; a finished
        row is left as it is. ``billing`` and ``deployments`` as for :meth:`record_batches`.
        """
        if not runs:
            return
        split, named = (billing or self.default_billing).cost_split, deployments or {}
        with self._writing(scope, billing, []) as conn:
            W.open_runs(conn, [R.run_stub_row(r, split, named.get(r.run_id)) for r in runs])

    def record_batches(
        self,
        done: Sequence[BatchDone],
        *,
        scope: str = "",
        billing: Billing | None = None,
        deployments: Mapping[str, str | None] | None = None,
    ) -> None:
        """Store batches as they complete, in one transaction: rows, items, calls, idle intervals closed since.

        So that a pool killed mid-run loses at most the batches not yet handed
        over, not every batch of its unfinished runs. A run's calls are filed
        under a provisional run row (deployment from ``deployments``, run id -> name) until its
        end writes the real one (:meth:`record_run`). Idempotent, like :meth:`record`; ``billing`` as for it.
        """
        if not done:
            return
        batches: list[dict[str, Any]] = []
        items: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []
        idles: list[dict[str, Any]] = []
        stubs: dict[str, dict[str, Any]] = {}
        split, named = (billing or self.default_billing).cost_split, deployments or {}
        for d in done:
            b, i = R.batch_rows([d.batch], d.calls, d.prices, scope, (d.workflow, d.stage))
            batches += b
            items += i
            calls += R.call_rows(d.calls, scope)
            idles += R.idle_rows(d.new_idles, d.prices, scope)
            stubs.update(
                (r.run_id, R.run_stub_row(r, split, named.get(r.run_id))) for r in d.runs if r.run_id not in stubs
            )
        with self._writing(scope, billing, [d.prices for d in done]) as conn:
            W.upsert(conn, RunRow, list(stubs.values()), ("run_id",), update=False)  # a run's end writes the real row
            W.upsert(conn, BatchRow, batches, ("batch_id",))
            W.upsert(conn, BatchItemRow, items, ("batch_id", "position"))
            W.upsert(conn, StageCallRow, calls, ("call_id",))
            W.upsert(conn, IdleRow, idles, ("idle_id",))

    def record_idles(
        self, idles: Iterable[IdleRecord], prices: PriceSheet, *, scope: str = "", billing: Billing | None = None
    ) -> None:
        """Store idle intervals (e.g. a pool's still-open ones before it closes); idempotent like :meth:`record`."""
        rows = R.idle_rows(idles, prices, scope)
        if not rows:
            return
        with self._writing(scope, billing, [prices]) as conn:
            W.upsert(conn, IdleRow, rows, ("idle_id",))

    @contextmanager
    def _writing(self, scope: str, billing: Billing | None, prices: Iterable[PriceSheet]) -> Iterator[Connection]:
        """One write transaction under the write lock, storing the pool's options and price sheets first if new.

        Both are written once (``ON CONFLICT DO NOTHING``: a pool's first options
        stay, a sheet's id is its content), so once a write that stored them
        committed, writing them again would change nothing: each scope's options and
        each sheet are written once per store, not in every flush. They are marked
        only after the commit, so that a write rolled back does not lose them.
        """
        with self._write_lock, self.engine.connect().execution_options(**{WRITE: True}) as conn:
            new = billing if billing is not None and scope not in self._pools_kept else None
            rows = {r["sheet_id"]: r for r in map(R.sheet_row, prices) if r["sheet_id"] not in self._sheets_kept}
            with conn.begin():
                if new is not None:
                    W.record_pool(conn, scope, new)
                W.upsert(conn, PriceSheetRow, list(rows.values()), ("sheet_id",), update=False)
                yield conn
            if new is not None:
                self._pools_kept.add(scope)
            self._sheets_kept.update(rows)

    # ---- reading -------------------------------------------------------------------------------

    def cost_report(
        self,
        since: datetime | float | None = None,
        *,
        split: CostSplit | None = None,
        idle_billing: IdleBilling | None = None,
    ) -> CostReport:
        """Attribute the cost of the batches and idle intervals that started at or after ``since``.

        ``since`` is a window on time, not on runs: costs incurred before it are
        left out, even for runs that go on after it; idle time whose preceding
        batch started before it goes on the idle line (not to the next batch,
        as a worker's lead idle time would: see ``prior_workers`` of
        :func:`~esg_prefect.model.attribution.attribute_costs`).

        Each pool's records are priced with the options it stored (:meth:`billings`);
        ``split`` and ``idle_billing``, when given, override them for every pool.

        Raises:
            ConfigError: a bad override, or a stored option that is neither choice.
        """
        return self._priced_report(since, split, idle_billing)[0]

    def _priced_report(
        self, since: datetime | float | None, split: CostSplit | None, idle_billing: IdleBilling | None
    ) -> tuple[CostReport, dict[str, PoolPricing]]:
        """:meth:`cost_report`, and how each pool in it was priced, by scope (sorted), from one read."""
        DEFAULT_BILLING.overridden(split, idle_billing)  # a bad override is refused even on an empty store
        start = since_ms(since)
        with Session(self.engine) as s:
            pools = {r.scope: r for r in s.execute(select(PoolRow)).scalars()}
            sheets = {
                r.sheet_id: R.sheet_from_row(r.price_per_vcpu_s, r.price_per_gpu_s_json)
                for r in s.execute(select(PriceSheetRow)).scalars()
            }
            # Ordered, so that sums run in the same order whatever the database's physical order.
            bq = select(*Q.BATCH_COLUMNS).order_by(col(BatchRow.start_ms), col(BatchRow.batch_id))
            iq = select(*Q.IDLE_COLUMNS).order_by(col(IdleRow.start_ms), col(IdleRow.idle_id))
            if start is not None:
                bq = bq.where(col(BatchRow.start_ms) >= start)
                iq = iq.where(col(IdleRow.start_ms) >= start)
            batch_rows = s.execute(bq).all()
            idle_rows = s.execute(iq).all()
            items = Q.items_of(s, [b.batch_id for b in batch_rows])
            prior = Q.busy_before(s, sorted({i.worker_id for i in idle_rows}), start) if start is not None else set()
        # Per pool and sheet: a worker belongs to one pool, which has one sheet and one set of options.
        parts: defaultdict[tuple[str, str], tuple[list[Any], list[Any]]] = defaultdict(lambda: ([], []))
        for b in batch_rows:
            parts[scope_of(b.worker_id), b.sheet_id][0].append(R.batch_record(b, items.get(b.batch_id, [])))
        for i in idle_rows:
            parts[scope_of(i.worker_id), i.sheet_id][1].append(R.idle_record(i))
        priced = {sc: self._pricing(pools.get(sc), split, idle_billing) for sc in sorted({sc for sc, _ in parts})}
        reports = []
        for (scope, sid), (bs, ids) in sorted(parts.items()):
            opts = priced[scope].used
            reports.append(
                attribute_costs(bs, ids, sheets[sid], opts.cost_split, opts.idle_billing, prior_workers=prior)
            )
        return merge_reports(reports), priced

    def billings(self, since: datetime | float | None = None) -> dict[str, Billing | None]:
        """The options each pool with batches or idle time from ``since`` on stored, by scope; None: none stored.

        A pool attached by an older esg-prefect stored none: :meth:`cost_report`
        reads its records with the store's defaults (``cost_split``, ``idle_billing``).

        Raises:
            ConfigError: a stored option that is neither choice.
        """
        start = since_ms(since)
        with Session(self.engine) as s:
            workers: set[str] = set()
            for model in (BatchRow, IdleRow):
                q = select(col(model.worker_id)).distinct()
                if start is not None:
                    q = q.where(col(model.start_ms) >= start)
                workers.update(s.execute(q).scalars())
            pools = {r.scope: r for r in s.execute(select(PoolRow)).scalars()}
        scopes = sorted({scope_of(w) for w in workers})
        return {sc: self._stored_billing(pools[sc]) if sc in pools else None for sc in scopes}

    def pool_billing(self, row: PoolRow | None) -> Billing:
        """The options a pool's records are priced with: those its ``pools`` row stored, else the store's defaults.

        For readers of the store's rows outside it (``store.earlier``), so that they price a
        pool's records as :meth:`cost_report` does.

        Raises:
            ConfigError: a stored option that is neither choice, naming the pool.
        """
        return self._pricing(row, None, None).used

    def _pricing(self, row: PoolRow | None, split: CostSplit | None, idle_billing: IdleBilling | None) -> PoolPricing:
        stored = None if row is None else self._stored_billing(row)
        return PoolPricing(stored, (stored or self.default_billing).overridden(split, idle_billing))

    @staticmethod
    def _stored_billing(row: PoolRow) -> Billing:
        try:
            return Billing(row.cost_split, row.idle_billing)  # type: ignore[arg-type]
        except ConfigError as exc:
            raise ConfigError(f"pool {row.scope!r} in the cost store: {exc}") from None

    def costs(
        self,
        group_by: str = "run",
        since: datetime | float | None = None,
        *,
        split: CostSplit | None = None,
        idle_billing: IdleBilling | None = None,
    ) -> list[CostRow]:
        """Costs per run, workflow, deployment or day, then the idle line.

        Args:
            group_by: ``run``, ``workflow``, ``deployment`` or ``day`` (UTC day of arrival).
            since: only costs incurred from then on (a datetime, naive = UTC, or epoch ms);
                runs that arrived from then on are listed even at cost 0.
            split: cost split for every pool (default: each pool's own, see :meth:`cost_report`).
            idle_billing: idle billing for every pool (default: each pool's own).

        Returns:
            One :class:`CostRow` per group; the rows' costs add up to every stored
            worker second in the window times its price.

        Raises:
            InvalidInputError: a bad ``group_by`` or ``since``.
            ConfigError: a bad split or idle billing.
        """
        return self.priced_costs(group_by, since, split, idle_billing)[0]

    def priced_costs(
        self,
        group_by: str,
        since: datetime | float | None,
        split: CostSplit | None,
        idle_billing: IdleBilling | None,
    ) -> tuple[list[CostRow], dict[str, PoolPricing]]:
        """:meth:`costs`, and how each pool in them was priced, by scope (sorted): what ``esg-prefect costs`` shows.

        One read of the store for both (``billings`` would scan the batches and
        idle intervals again), each pool's options derived once.
        """
        check_group_by(group_by)
        report, priced = self._priced_report(since, split, idle_billing)
        start = since_ms(since)
        with Session(self.engine) as s:
            rq = select(*Q.RUN_COLUMNS)
            if start is not None:
                rq = rq.where(col(RunRow.arrival_ms) >= start)
            found = {r.run_id: r for r in s.execute(rq)}
            missing = sorted(set(report.per_run) - set(found))
            for chunk in Q.chunks(missing):
                mq = select(*Q.RUN_COLUMNS).where(col(RunRow.run_id).in_(chunk))
                found.update({r.run_id: r for r in s.execute(mq)})
            if start is None:
                cq = select(col(StageCallRow.run_id), func.count()).group_by(col(StageCallRow.run_id))
                calls: dict[str, int] = {rid: n for rid, n in s.execute(cq).all()}
            else:  # counted here: SQLite plans a GROUP BY by the run_id index, a scan of every call
                calls = Counter(
                    s.execute(select(col(StageCallRow.run_id)).where(col(StageCallRow.start_ms) >= start)).scalars()
                )
            pending = sorted(set(report.per_run) - set(found))
            batch_of_pending = Q.first_batches(s, pending)
        runs = {
            rid: RunInfo(
                r.run_id, r.workflow, r.deployment, r.day, r.arrival_ms, r.slo_met, calls.get(rid, 0), r.run_name
            )
            for rid, r in found.items()
        }
        for rid in pending:  # billed in batches shared with stored runs, not ended (or not stored) yet
            workflow, first_ms = batch_of_pending.get(rid, (None, 0.0))
            runs[rid] = RunInfo(
                rid, workflow or "(unknown)", None, R.utc_day(first_ms), first_ms, None, calls.get(rid, 0)
            )
        return group_costs(report, runs, group_by), priced

    def close(self) -> None:
        """Release the database connections."""
        self.engine.dispose()

    def __enter__(self) -> CostStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
