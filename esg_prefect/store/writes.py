"""The cost store's write statements: upserts by id, and the run rows that keep a run's earliest start.

Kept apart from :mod:`esg_prefect.store.cost_store`, which runs them in its
write transactions. Every write is an upsert (``INSERT ... ON CONFLICT``), so
that a record written twice leaves one row.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection
from sqlmodel import Session, col

from esg_prefect.exceptions import ConfigError
from esg_prefect.store import rows as R
from esg_prefect.store.billing import Billing
from esg_prefect.store.tables import PoolRow, RunRow, StageCallRow, StoreModel

if TYPE_CHECKING:
    from esg_prefect.control.records import RunRecords

KEEP = ("deployment", "run_name")  # a run's columns that a later record without them never erases


def run_row(conn: Connection, records: RunRecords, deployment: str | None, name: str | None) -> dict[str, Any]:
    """The run's row, from the earliest arrival stored for it: the run started there.

    A pool service restarted while the run was in flight stored the run under
    the first instance's arrival (its provisional row); the second instance's
    records start at its own first call. The row keeps the earlier start, and
    the SLO outcome and day that follow from it (read in the write transaction).
    """
    first = conn.execute(select(col(RunRow.arrival_ms)).where(col(RunRow.run_id) == records.run_id)).scalar()
    if first is not None and first < records.arrival_ms:
        records = dataclasses.replace(records, arrival_ms=first)
    if records.finish_ms is not None and failed_elsewhere(conn, records.run_id, {c.call_id for c in records.calls}):
        records = dataclasses.replace(records, finish_ms=None)  # a call failed on an earlier instance
    return R.run_row(records, deployment, name)


def failed_elsewhere(conn: Connection | Session, run_id: str, mine: Collection[str] = ()) -> bool:
    """Whether a stored call of the run, not one of ``mine``, failed: one an earlier pool instance ran.

    A failed call is stored with no batch, so no scope tells whose it was; a call
    retried under its id and answered since reads answered (its row is the last).
    """
    q = select(col(StageCallRow.call_id)).where(col(StageCallRow.run_id) == run_id, col(StageCallRow.ok).is_(False))
    return any(call_id not in mine for call_id in conn.execute(q).scalars())


def open_runs(conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
    """Provisional rows of runs that had not ended: a new run gets its row; a provisional one, the earlier start.

    A stored provisional row that starts later (its first stored batch was of a
    later call) takes the row's arrival and day; an ended row is left as it is.
    """
    upsert(
        conn,
        RunRow,
        rows,
        ("run_id",),
        columns=("arrival_ms", "day"),
        where=lambda new, old: old.ended.is_(False) & (new.arrival_ms < old.arrival_ms),
    )


def record_pool(conn: Connection, scope: str, billing: Billing) -> None:
    """Keep a pool's options for its scope, once (a pool's settings do not change while it runs)."""
    row = R.pool_row(scope, billing, time.time() * 1000.0)
    upsert(conn, PoolRow, [row], ("scope",), update=False)


def upsert(
    conn: Connection,
    model: type[StoreModel],
    rows: Sequence[dict[str, Any]],
    keys: tuple[str, ...],
    *,
    update: bool = True,
    keep_if_null: tuple[str, ...] = (),
    columns: tuple[str, ...] | None = None,
    where: Callable[[Any, Any], Any] | None = None,
) -> None:
    """Insert ``rows``, or update the stored row with the same ``keys`` (do nothing if not ``update``).

    ``columns``: only these are updated (default: every one but the keys); ``where(new, stored)``:
    only stored rows for which it holds are (the columns of the row offered, of the stored row).
    """
    if not rows:
        return
    table = model.__table__  # type: ignore[attr-defined]
    dialect = conn.dialect.name
    if dialect == "sqlite":
        stmt: Any = sqlite.insert(table)
    elif dialect == "postgresql":
        stmt = postgresql.insert(table)
    else:  # resolve_url admits no other dialect
        raise ConfigError(f"the cost store supports sqlite and postgresql, not {dialect!r}")
    if update:
        cols = [c for c in rows[0] if c not in keys and (columns is None or c in columns)]
        new = {c: func.coalesce(stmt.excluded[c], table.c[c]) if c in keep_if_null else stmt.excluded[c] for c in cols}
        cond = None if where is None else where(stmt.excluded, table.c)
        stmt = stmt.on_conflict_do_update(index_elements=list(keys), set_=new, where=cond)
    else:
        stmt = stmt.on_conflict_do_nothing(index_elements=list(keys))
    conn.execute(stmt, list(rows))
