"""The cost store's read queries over many ids: chunked ``IN (...)`` lists, so no list outgrows a database's limit.

Kept apart from :mod:`esg_prefect.store.cost_store`, which runs them while
building a cost report.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from sqlalchemy import select
from sqlmodel import Session, col

from esg_prefect.store.tables import BatchItemRow, BatchRow

CHUNK = 500  # ids per IN (...) list: well under SQLite's and PostgreSQL's parameter limits


def chunks(ids: Sequence[str]) -> Iterable[Sequence[str]]:
    """``ids`` in slices short enough for one ``IN (...)`` list."""
    for i in range(0, len(ids), CHUNK):
        yield ids[i : i + CHUNK]


def items_of(s: Session, batch_ids: Sequence[str]) -> dict[str, list[BatchItemRow]]:
    """The items of each of these batches, in their order."""
    out: defaultdict[str, list[BatchItemRow]] = defaultdict(list)
    for chunk in chunks(batch_ids):
        q = (
            select(BatchItemRow)
            .where(col(BatchItemRow.batch_id).in_(chunk))
            .order_by(col(BatchItemRow.batch_id), col(BatchItemRow.position))
        )
        for item in s.execute(q).scalars():
            out[item.batch_id].append(item)
    return out


def first_batches(s: Session, run_ids: Sequence[str]) -> dict[str, tuple[str | None, float]]:
    """Workflow and start of the first stored batch of each run: all we know of runs not stored yet."""
    out: dict[str, tuple[str | None, float]] = {}
    for chunk in chunks(run_ids):
        q = (
            select(col(BatchItemRow.run_id), col(BatchRow.workflow), col(BatchRow.start_ms))
            .join(BatchRow, col(BatchRow.batch_id) == col(BatchItemRow.batch_id))
            .where(col(BatchItemRow.run_id).in_(chunk))
            .order_by(col(BatchRow.start_ms))
        )
        for rid, workflow, start in s.execute(q).all():
            out.setdefault(rid, (workflow, start))
    return out


def busy_before(s: Session, worker_ids: Sequence[str], start: float) -> set[str]:
    """Which of these workers ran a batch that started before ``start`` (a window's cut)."""
    out: set[str] = set()
    for chunk in chunks(worker_ids):
        q = (
            select(col(BatchRow.worker_id))
            .where(col(BatchRow.worker_id).in_(chunk), col(BatchRow.start_ms) < start)
            .distinct()
        )
        out.update(s.execute(q).scalars())
    return out
