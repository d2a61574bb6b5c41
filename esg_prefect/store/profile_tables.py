"""The profile store's tables: profile runs, their measured points, stalls and co-runs.

Profiles live beside the cost records (same database, same URL resolution) but
in tables of their own, with a metadata object and a schema-version table of
their own (``profile_schema_version``): a profile is not a cost record, and
the two schemas evolve separately, so a new profile column never bumps the
cost store's version (and the reverse).
"""

from __future__ import annotations

from sqlalchemy import MetaData
from sqlmodel import Field, SQLModel


class ProfileModel(SQLModel):
    """Base of the profile tables: a metadata of its own."""

    metadata = MetaData()


class ProfileSchemaVersion(ProfileModel, table=True):
    """One row per profile-store migration applied to this database."""

    __tablename__ = "profile_schema_version"

    version: int = Field(primary_key=True)
    description: str
    applied_at_ms: float


class ProfileRunRow(ProfileModel, table=True):
    """One profile run: when, on what, with which request, and how busy the machine was."""

    __tablename__ = "profile_runs"

    run_id: str = Field(primary_key=True)
    label: str = Field(default="", index=True, description="free text, e.g. 'examples on dev VM'")
    started_at_ms: float = Field(index=True)
    wall_s: float
    host_json: str = Field(description="python, torch, CPUs, platform")
    request_json: str = Field(description="targets, vcpus, GPU shares, measurement settings")
    other_cpu_json: str = Field(description="cores other processes used, per configuration")


class ProfilePointRow(ProfileModel, table=True):
    """One measured point of a run (``cold_start_ms`` includes the worker start)."""

    __tablename__ = "profile_points"

    run_id: str = Field(primary_key=True, foreign_key="profile_runs.run_id")
    stage: str = Field(primary_key=True)
    hardware: str = Field(primary_key=True)
    batch: int = Field(primary_key=True)
    vcpus: int = Field(primary_key=True)
    gpu_share: float = Field(primary_key=True)
    mean_ms: float
    p50_ms: float
    p95_ms: float
    cold_start_ms: float
    load_ms: float
    peak_mem_mb: float
    gpu_peak_mem_mb: float
    reps: int
    other_cpu: float
    quiet: bool
    mean_input_size: float
    pipeline: str = ""


class ProfileStallRow(ProfileModel, table=True):
    """One stall component (Stash) of one stage at one configuration, ms per batch."""

    __tablename__ = "profile_stalls"

    run_id: str = Field(primary_key=True, foreign_key="profile_runs.run_id")
    stage: str = Field(primary_key=True)
    hardware: str = Field(primary_key=True)
    batch: int = Field(primary_key=True)
    vcpus: int = Field(primary_key=True)
    gpu_share: float = Field(primary_key=True)
    component: str = Field(primary_key=True, description="compute, h2d, interference, transfer, queueing, cold_start")
    ms: float | None = Field(default=None, description="None where the component does not apply (h2d on CPU)")


class ProfileCoRunRow(ProfileModel, table=True):
    """One co-run measurement: the stage beside ``co_runners`` copies of itself at the same configuration."""

    __tablename__ = "profile_coruns"

    run_id: str = Field(primary_key=True, foreign_key="profile_runs.run_id")
    stage: str = Field(primary_key=True)
    hardware: str = Field(primary_key=True)
    batch: int = Field(primary_key=True)
    vcpus: int = Field(primary_key=True)
    gpu_share: float = Field(primary_key=True)
    co_runners: int = Field(primary_key=True)
    alone_ms: float
    corun_ms: float


PROFILE_TABLES: tuple[type[ProfileModel], ...] = (ProfileRunRow, ProfilePointRow, ProfileStallRow, ProfileCoRunRow)
"""The profile tables, in an order that respects their foreign keys."""
