"""The cost store's read queries over many ids: chunked ``IN (...)`` lists, so no list outgrows a database's limit.

Kept apart from :mod:`esg_prefect.store.cost_store`, which runs them while
building a cost report. A cost report reads every batch, item, idle interval
and run of its window, so these read plain column tuples, not ORM instances:
building an instance per row, to read a few of its attributes, was the bulk of that read's time.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import select
from sqlmodel import Session, col

from esg_prefect.model.attribution import BatchItem
from esg_prefect.store.tables import BatchItemRow, BatchRow, IdleRow, RunRow

CHUNK = 500  # ids per IN (...) list: well under SQLite's and PostgreSQL's parameter limits


def chunks(ids: Sequence[str]) -> Iterable[Sequence[str]]:
    """``ids`` in slices short enough for one ``IN (...)`` list."""
    for i in range(0, len(ids), CHUNK):
        yield ids[i : i + CHUNK]


BATCH_COLUMNS: tuple[Any, ...] = tuple(
    col(c)
    for c in (
        BatchRow.batch_id,
        BatchRow.worker_id,
        BatchRow.batch_size,
        BatchRow.vcpus,
        BatchRow.gpu_share,
        BatchRow.hardware,
        BatchRow.start_ms,
        BatchRow.end_ms,
        BatchRow.sheet_id,
    )
)
"""The ``batches`` columns a batch's record and its price sheet are read from (rows name them as attributes)."""
IDLE_COLUMNS: tuple[Any, ...] = tuple(
    col(c)
    for c in (
        IdleRow.worker_id,
        IdleRow.vcpus,
        IdleRow.gpu_share,
        IdleRow.hardware,
        IdleRow.start_ms,
        IdleRow.end_ms,
        IdleRow.loading_ms,
        IdleRow.vcpus_held,
        IdleRow.sheet_id,
    )
)
"""The ``worker_idle`` columns an interval's record and its price sheet are read from."""
RUN_COLUMNS: tuple[Any, ...] = tuple(
    col(c)
    for c in (
        RunRow.run_id,
        RunRow.workflow,
        RunRow.deployment,
        RunRow.day,
        RunRow.arrival_ms,
        RunRow.slo_met,
        RunRow.run_name,
    )
)
"""The ``runs`` columns a cost report groups and names its runs by."""


def items_of(s: Session, batch_ids: Sequence[str]) -> dict[str, list[BatchItem]]:
    """The items of each of these batches, in their order, as the model's items."""
    out: defaultdict[str, list[BatchItem]] = defaultdict(list)
    for chunk in chunks(batch_ids):
        q = (
            select(
                col(BatchItemRow.batch_id),
                col(BatchItemRow.request_id),
                col(BatchItemRow.run_id),
                col(BatchItemRow.input_size),
            )
            .where(col(BatchItemRow.batch_id).in_(chunk))
            .order_by(col(BatchItemRow.batch_id), col(BatchItemRow.position))
        )
        for batch_id, request_id, run_id, input_size in s.execute(q):
            out[batch_id].append(BatchItem(request_id, run_id, input_size))
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
