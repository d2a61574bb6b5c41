"""From the pool's records to the store's rows (plain dicts for bulk upserts), and back.

Pure functions: no database here, so the mapping is tested without one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from esg_prefect.model.attribution import BatchItem, BatchRecord, IdleRecord
from esg_prefect.model.config import Config
from esg_prefect.model.pricing import PriceSheet
from esg_prefect.store.tables import BatchRow, IdleRow

if TYPE_CHECKING:
    from sqlalchemy import Row

    from esg_prefect.control.records import CallRecord, RunRecords, RunStub
    from esg_prefect.store.billing import Billing


def scoped(scope: str, local_id: str) -> str:
    """A pool-local id (``b7``, ``w2``) made unique across pools and processes: ``scope:b7``."""
    return f"{scope}:{local_id}" if scope else local_id


def sheet_id(prices: PriceSheet) -> str:
    """A stable id of a price sheet: equal sheets, in any process, share one row."""
    canon = json.dumps([prices.price_per_vcpu_s, sorted(prices.price_per_gpu_s.items())])
    return hashlib.sha256(canon.encode()).hexdigest()[:16]


def sheet_row(prices: PriceSheet) -> dict[str, Any]:
    """The ``price_sheets`` row of a sheet."""
    return {
        "sheet_id": sheet_id(prices),
        "price_per_vcpu_s": prices.price_per_vcpu_s,
        "price_per_gpu_s_json": json.dumps(dict(sorted(prices.price_per_gpu_s.items()))),
    }


def sheet_from_row(price_per_vcpu_s: float, price_per_gpu_s_json: str) -> PriceSheet:
    """The price sheet a ``price_sheets`` row describes."""
    return PriceSheet(price_per_vcpu_s, json.loads(price_per_gpu_s_json))


def pool_row(scope: str, billing: Billing, now_ms: float) -> dict[str, Any]:
    """The ``pools`` row of an attached pool: its scope and the options it prices with."""
    return {
        "scope": scope,
        "cost_split": billing.cost_split,
        "idle_billing": billing.idle_billing,
        "first_ms": now_ms,
    }


def utc_day(epoch_ms: float) -> str:
    """The UTC date (YYYY-MM-DD) of an epoch time in ms: the ``day`` runs are grouped by."""
    return datetime.fromtimestamp(epoch_ms / 1000.0, UTC).strftime("%Y-%m-%d")


def slo_met(records: RunRecords) -> bool:
    """Whether the run finished within its SLO (a run that failed or never finished missed it)."""
    return records.finish_ms is not None and records.finish_ms - records.arrival_ms <= records.slo_ms


def run_row(records: RunRecords, deployment: str | None, name: str | None = None) -> dict[str, Any]:
    """The ``runs`` row of a finished run (``name``: its flow run's name, if known)."""
    return {
        "run_id": records.run_id,
        "workflow": records.workflow,
        "deployment": deployment,
        "arrival_ms": records.arrival_ms,
        "finish_ms": records.finish_ms,
        "slo_ms": records.slo_ms,
        "slo_met": slo_met(records),
        "day": utc_day(records.arrival_ms),
        "cost_split": records.cost_split,
        "run_name": name,
        "ended": True,
    }


def run_stub_row(stub: RunStub, cost_split: str, deployment: str | None = None) -> dict[str, Any]:
    """A provisional ``runs`` row for a run whose calls are stored before it ends (no finish yet)."""
    return {
        "run_id": stub.run_id,
        "workflow": stub.workflow,
        "deployment": deployment,
        "arrival_ms": stub.arrival_ms,
        "finish_ms": None,
        "slo_ms": stub.slo_ms,
        "slo_met": False,
        "day": utc_day(stub.arrival_ms),
        "cost_split": cost_split,
        "run_name": stub.run_name,
        "ended": False,
    }


def call_rows(calls: Iterable[CallRecord], scope: str) -> list[dict[str, Any]]:
    """The ``stage_calls`` rows of some calls (failed calls keep their error and no batch)."""
    out = []
    for c in calls:
        r = c.result
        out.append(
            {
                "call_id": c.call_id,
                "run_id": c.run_id,
                "request_id": c.request_id,
                "stage": c.stage,
                "batch_id": scoped(scope, r.batch_id) if r else None,
                "batch_size": r.batch_size if r else None,
                "co_batched_runs": r.co_batched_runs if r else None,
                "worker_id": scoped(scope, r.worker_id) if r else None,
                "hardware": r.hardware if r else None,
                "vcpus": r.vcpus if r else None,
                "gpu_share": r.gpu_share if r else None,
                "queue_wait_ms": r.queue_wait_ms if r else None,
                "predicted_ms": r.predicted_ms if r else None,
                "actual_ms": r.actual_ms if r else None,
                "cold_start": r.cold_start if r else None,
                "at_risk": r.at_risk if r else None,
                "reason": r.reason if r else "",
                "ready_ms": c.ready_ms,
                "start_ms": c.start_ms,
                "end_ms": c.end_ms,
                "ok": c.ok,
                "error": c.error,
            }
        )
    return out


def batch_rows(
    batches_done: Iterable[BatchRecord],
    calls: Iterable[CallRecord],
    prices: PriceSheet,
    scope: str,
    where: tuple[str | None, str | None] = (None, None),
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The ``batches`` rows of some batches, and their ``batch_items`` rows (every run's items).

    A batch's workflow and stage come from its calls, else from ``where``.
    """
    stage_of = {c.result.batch_id: (c.workflow, c.stage) for c in calls if c.result is not None}
    sid = sheet_id(prices)
    batches: list[dict[str, Any]] = []
    items: list[dict[str, Any]] = []
    for b in batches_done:
        bid = scoped(scope, b.batch_id)
        workflow, stage = stage_of.get(b.batch_id, where)
        batches.append(
            {
                "batch_id": bid,
                "worker_id": scoped(scope, b.worker_id),
                "workflow": workflow,
                "stage": stage,
                "batch_size": b.config.batch,
                "vcpus": b.config.vcpus,
                "gpu_share": b.config.gpu_share,
                "hardware": b.hardware,
                "start_ms": b.start_ms,
                "end_ms": b.end_ms,
                "sheet_id": sid,
            }
        )
        items.extend(
            {
                "batch_id": bid,
                "position": i,
                "request_id": it.request_id,
                "run_id": it.run_id,
                "input_size": it.input_size,
            }
            for i, it in enumerate(b.items)
        )
    return batches, items


def idle_rows(idles: Iterable[IdleRecord], prices: PriceSheet, scope: str) -> list[dict[str, Any]]:
    """The ``worker_idle`` rows; an interval's id is its worker and start, so a longer copy replaces a shorter."""
    sid = sheet_id(prices)
    return [
        {
            "idle_id": f"{scoped(scope, i.worker_id)}@{i.start_ms!r}",
            "worker_id": scoped(scope, i.worker_id),
            "vcpus": i.vcpus,
            "gpu_share": i.gpu_share,
            "hardware": i.hardware,
            "start_ms": i.start_ms,
            "end_ms": i.end_ms,
            "sheet_id": sid,
            "loading_ms": i.loading_ms,
            "vcpus_held": i.vcpus_held,
        }
        for i in idles
    ]


def batch_record(row: BatchRow | Row[Any], items: Iterable[BatchItem]) -> BatchRecord:
    """A stored batch as the model's record: a ``BatchRow`` (or a row of its columns) and its items in order."""
    return BatchRecord(
        row.batch_id,
        row.worker_id,
        tuple(items),
        Config(row.batch_size, row.vcpus, row.gpu_share),
        row.hardware,
        row.start_ms,
        row.end_ms,
    )


def idle_record(row: IdleRow | Row[Any]) -> IdleRecord:
    """A stored idle interval (an ``IdleRow`` or a row of its columns) as the model's record."""
    return IdleRecord(
        row.worker_id,
        row.vcpus,
        row.gpu_share,
        row.hardware,
        row.start_ms,
        row.end_ms,
        row.loading_ms,
        bool(row.vcpus_held),
    )
