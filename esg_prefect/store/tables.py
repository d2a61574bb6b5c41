"""The cost store's tables, as SQLModel classes (the shape of the newest schema version).

One row per flow run, per stage call, per batch (its items in ``batch_items``),
per warm idle interval of a worker, per distinct price sheet and per attached
pool (the cost split and idle billing it priced its runs with). Batches and
idle intervals are what is billed; runs and calls are what the bill is read
against. Costs are never stored: they are recomputed by
:func:`~esg_prefect.model.attribution.attribute_costs` when asked for, with
each pool's own options unless the reader overrides them.

Ids of batches, workers and idle intervals are *scoped*: the pool numbers them
from 1 in every process (``b1``, ``w1``), so the store prefixes them with a
scope unique to each attached pool (``3f2a9c1e5d7b0a44:b1``); call and run ids are
Prefect's UUIDs and stored as they are.

Times are wall-clock epoch milliseconds, as the pool records them.

The classes use a metadata object of their own, so that other SQLModel tables
in the same process (or a user's) are never created in the cost store, nor
ours in theirs.
"""

from __future__ import annotations

from sqlalchemy import Index, MetaData
from sqlmodel import Field, SQLModel


class StoreModel(SQLModel):
    """Base of the store's tables: a metadata of its own."""

    metadata = MetaData()


class SchemaVersion(StoreModel, table=True):
    """One row per migration applied to this database, so that it is applied once."""

    __tablename__ = "schema_version"

    version: int = Field(primary_key=True)
    description: str
    applied_at_ms: float


class PriceSheetRow(StoreModel, table=True):
    """A price sheet that was in force for some batches (one row per distinct sheet)."""

    __tablename__ = "price_sheets"

    sheet_id: str = Field(primary_key=True, description="hash of the prices, so equal sheets share a row")
    price_per_vcpu_s: float
    price_per_gpu_s_json: str = Field(description='JSON object {"T4": price per s, ...}')


class RunRow(StoreModel, table=True):
    """One flow run as the pool saw it."""

    __tablename__ = "runs"

    run_id: str = Field(primary_key=True)
    workflow: str = Field(index=True)
    deployment: str | None = Field(default=None, index=True)
    arrival_ms: float = Field(index=True)
    finish_ms: float | None = None
    slo_ms: float
    slo_met: bool
    day: str = Field(index=True, description="UTC date of arrival, YYYY-MM-DD")
    cost_split: str = Field(default="equal", description="the pool's cost split when the run ended")
    run_name: str | None = Field(default=None, description="the flow run's name in Prefect, if known")
    ended: bool = Field(
        default=True, description="its end reached a pool (False: a provisional row, its calls stored before its end)"
    )


class StageCallRow(StoreModel, table=True):
    """One stage call of a run, and where and how it ran."""

    __tablename__ = "stage_calls"

    call_id: str = Field(primary_key=True)
    run_id: str = Field(foreign_key="runs.run_id", index=True)
    request_id: str
    stage: str
    batch_id: str | None = Field(default=None, index=True)
    batch_size: int | None = None
    co_batched_runs: int | None = None
    worker_id: str | None = None
    hardware: str | None = None
    vcpus: int | None = None
    gpu_share: float | None = None
    queue_wait_ms: float | None = None
    predicted_ms: float | None = None
    actual_ms: float | None = None
    cold_start: bool | None = None
    at_risk: bool | None = None
    reason: str = ""
    ready_ms: float
    start_ms: float = Field(index=True)  # the calls of a window (``esg-prefect costs --since``)
    end_ms: float
    ok: bool
    error: str = ""


class BatchRow(StoreModel, table=True):
    """One batch as it ran: worker, configuration, hardware, time and the prices in force."""

    __tablename__ = "batches"
    __table_args__ = (Index("ix_batches_worker_end", "worker_id", "end_ms"),)  # a worker's batches by end

    batch_id: str = Field(primary_key=True)
    worker_id: str = Field(index=True)
    workflow: str | None = None
    stage: str | None = None
    batch_size: int
    vcpus: int
    gpu_share: float
    hardware: str
    start_ms: float = Field(index=True)
    end_ms: float
    sheet_id: str = Field(foreign_key="price_sheets.sheet_id")


class BatchItemRow(StoreModel, table=True):
    """One job of a batch (its run may not be stored yet: no foreign key to runs)."""

    __tablename__ = "batch_items"

    batch_id: str = Field(primary_key=True, foreign_key="batches.batch_id")
    position: int = Field(primary_key=True)
    request_id: str
    run_id: str = Field(index=True)
    input_size: float


class IdleRow(StoreModel, table=True):
    """An interval in which a warm worker held its resources without work."""

    __tablename__ = "worker_idle"
    __table_args__ = (Index("ix_worker_idle_worker_start", "worker_id", "start_ms"),)  # a worker's idle by start

    idle_id: str = Field(primary_key=True, description="scoped worker id and start time")
    worker_id: str = Field(index=True)
    vcpus: int
    gpu_share: float
    hardware: str
    start_ms: float = Field(index=True)
    end_ms: float
    sheet_id: str = Field(foreign_key="price_sheets.sheet_id")
    loading_ms: float = Field(default=0.0, description="the interval's first part spent on a pre-warm load")
    vcpus_held: bool = Field(default=False, description="the worker held its vCPUs while idle (billed for them)")


class PoolRow(StoreModel, table=True):
    """The pricing options of one attached pool: what its batches and idle intervals are read with.

    One row per scope (a pool's attachment to the store), so that pools and
    restarts with different settings writing one store each keep theirs.
    """

    __tablename__ = "pools"

    scope: str = Field(primary_key=True, description="the prefix of the pool's batch and worker ids")
    cost_split: str = Field(description="equal or input_size")
    idle_billing: str = Field(description="attribute or separate")
    first_ms: float = Field(description="when the store first heard of the pool (epoch ms)")


DATA_TABLES: tuple[type[StoreModel], ...] = (
    PriceSheetRow,
    RunRow,
    BatchRow,
    BatchItemRow,
    StageCallRow,
    IdleRow,
    PoolRow,
)
"""The tables holding records, in an order that respects their foreign keys."""
