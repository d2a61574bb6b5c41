"""The profile store: measured latency profiles, stall breakdowns and co-run tables, kept in SQL.

``esg-prefect profile`` saves every run here (besides its CSV files), so that
profiles measured on different days or machines stay side by side, and
:meth:`ProfileStore.load_profile` gives the scheduler the latest one
(``Pool(profile=store.load_profile())``). The database is the cost store's
(:func:`~esg_prefect.store.engine.resolve_url`: ``$ESG_PREFECT_STORE_URL``, else
``$PREFECT_HOME/esg_prefect/costs.db``), the tables and their schema versions
are the profile store's own (:mod:`esg_prefect.store.profile_tables`).

Schema versions follow :mod:`esg_prefect.store.migrations`: a fresh database
is created at the newest shape and stamped; an older one gets each missing
:class:`~esg_prefect.store.migrations.Migration` of :data:`PROFILE_MIGRATIONS`
in its own transaction; a newer one is refused.

Example:
    >>> store = ProfileStore("sqlite://")   # in memory
    >>> run_id = store.add_run(started_at_ms=0.0, wall_s=1.0, points=[dict(
    ...     stage="enc", hardware="cpu", batch=1, vcpus=1, gpu_share=0.0, mean_ms=5.0, p50_ms=5.0,
    ...     p95_ms=6.0, cold_start_ms=40.0, load_ms=30.0, peak_mem_mb=200.0, gpu_peak_mem_mb=0.0,
    ...     reps=7, other_cpu=0.0, quiet=True, mean_input_size=1.0)])
    >>> store.load_profile().latency_ms("enc", __import__("esg_prefect.model").model.Config(1, 1), "cpu")
    6.0
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Engine, inspect, select
from sqlalchemy.engine import Connection
from sqlmodel import Session, col

from esg_prefect.exceptions import ConfigError, MissingProfileError
from esg_prefect.model import LatencyProfile, ProfilePoint
from esg_prefect.store.engine import WRITE, create_engine, resolve_url, safe_url
from esg_prefect.store.migrations import Migration, check_migrations
from esg_prefect.store.profile_tables import (
    PROFILE_TABLES,
    ProfileCoRunRow,
    ProfileModel,
    ProfilePointRow,
    ProfileRunRow,
    ProfileSchemaVersion,
    ProfileStallRow,
)


def _create_v1(conn: Connection) -> None:
    ProfileModel.metadata.create_all(conn)


PROFILE_MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "profile runs, measured points, stall breakdowns, co-run tables", _create_v1),
)
"""Every profile-store schema version, oldest first."""


def migrate_profiles(engine: Engine, migrations: Sequence[Migration] | None = None) -> tuple[int, ...]:
    """Bring the profile tables to the newest version; returns the versions applied now.

    Raises:
        ConfigError: the database is newer than this code, or holds profile tables without a version.
    """
    steps = tuple(PROFILE_MIGRATIONS if migrations is None else migrations)
    check_migrations(steps)
    newest = steps[-1].version
    with engine.connect().execution_options(**{WRITE: True}) as conn:
        with conn.begin():
            ProfileSchemaVersion.__table__.create(conn, checkfirst=True)  # type: ignore[attr-defined]
            applied = set(conn.execute(select(col(ProfileSchemaVersion.version))).scalars())
            if not applied:
                names = inspect(conn).get_table_names()
                present = [t.__tablename__ for t in PROFILE_TABLES if t.__tablename__ in names]
                if present:
                    raise ConfigError(
                        f"the database holds profile tables {present} but no profile_schema_version rows: "
                        "point the profile store at another database"
                    )
                ProfileModel.metadata.create_all(conn)
                for step in steps:
                    _stamp(conn, step)
                return tuple(s.version for s in steps)
        above = sorted(v for v in applied if v > newest)
        if above:
            raise ConfigError(
                f"the profile store is at schema version {max(above)}, newer than this esg-prefect knows ({newest})"
            )
        done = []
        for step in steps:
            if step.version in applied:
                continue
            with conn.begin():
                step.apply(conn)
                _stamp(conn, step)
            done.append(step.version)
        return tuple(done)


def _stamp(conn: Connection, step: Migration) -> None:
    conn.execute(
        ProfileSchemaVersion.__table__.insert().values(  # type: ignore[attr-defined]
            version=step.version, description=step.description, applied_at_ms=time.time() * 1000.0
        )
    )


class ProfileStore:
    """Profile runs in SQLite (default) or PostgreSQL.

    Args:
        url: database URL or SQLite path; see :func:`~esg_prefect.store.engine.resolve_url`.
    """

    def __init__(self, url: str | None = None) -> None:
        self.url = resolve_url(url)
        self.engine = create_engine(self.url)
        migrate_profiles(self.engine)

    def __enter__(self) -> ProfileStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the database connections."""
        self.engine.dispose()

    def _session(self) -> Session:
        return Session(self.engine.execution_options(**{WRITE: True}))

    def add_run(
        self,
        *,
        started_at_ms: float,
        wall_s: float,
        points: Iterable[Mapping[str, Any]],
        host: Mapping[str, Any] | None = None,
        request: Mapping[str, Any] | None = None,
        other_cpu: Mapping[str, Any] | None = None,
        label: str = "",
        run_id: str | None = None,
    ) -> str:
        """Store one profile run and its points (mappings with :class:`ProfilePointRow`'s fields); its id."""
        rid = run_id or uuid.uuid4().hex
        fields = set(ProfilePointRow.model_fields) - {"run_id"}
        with self._session() as s:
            s.add(
                ProfileRunRow(
                    run_id=rid,
                    label=label,
                    started_at_ms=started_at_ms,
                    wall_s=wall_s,
                    host_json=json.dumps(dict(host or {})),
                    request_json=json.dumps(dict(request or {}), default=str),
                    other_cpu_json=json.dumps(dict(other_cpu or {})),
                )
            )
            s.flush()  # the run row first: the points reference it
            for p in points:
                s.add(ProfilePointRow(run_id=rid, **{k: v for k, v in p.items() if k in fields}))
            s.commit()
        return rid

    def add_stalls(self, run_id: str, rows: Iterable[Mapping[str, Any]]) -> int:
        """Store stall components (``stage, hardware, batch, vcpus, gpu_share, component, ms``); how many."""
        n = 0
        with self._session() as s:
            for r in rows:
                s.merge(ProfileStallRow(run_id=run_id, **dict(r)))
                n += 1
            s.commit()
        return n

    def add_coruns(self, run_id: str, rows: Iterable[Mapping[str, Any]]) -> int:
        """Store co-run rows (``stage, hardware, batch, vcpus, gpu_share, co_runners, alone_ms, corun_ms``)."""
        n = 0
        with self._session() as s:
            for r in rows:
                s.merge(ProfileCoRunRow(run_id=run_id, **dict(r)))
                n += 1
            s.commit()
        return n

    def runs(self) -> list[ProfileRunRow]:
        """Every stored run, newest first."""
        with Session(self.engine) as s:
            return list(s.exec(select(ProfileRunRow).order_by(col(ProfileRunRow.started_at_ms).desc())).scalars())  # type: ignore[call-overload]

    def points(self, run_id: str) -> list[ProfilePointRow]:
        """The points of one run."""
        with Session(self.engine) as s:
            stmt = select(ProfilePointRow).where(col(ProfilePointRow.run_id) == run_id)
            return list(s.exec(stmt).scalars())  # type: ignore[call-overload]

    def stalls(self, run_id: str) -> list[ProfileStallRow]:
        """The stall components of one run."""
        with Session(self.engine) as s:
            stmt = select(ProfileStallRow).where(col(ProfileStallRow.run_id) == run_id)
            return list(s.exec(stmt).scalars())  # type: ignore[call-overload]

    def load_profile(self, run_id: str | None = None) -> LatencyProfile:
        """The latency profile of ``run_id`` (default: the newest run with points).

        Raises:
            MissingProfileError: when the store holds no such run, or no run at all.
        """
        if run_id is None:
            runs = [r.run_id for r in self.runs()]
            run_id = next((r for r in runs if self.points(r)), None)
            if run_id is None:
                raise MissingProfileError(f"the profile store at {safe_url(self.url)} holds no profile run")
        rows = self.points(run_id)
        if not rows:
            raise MissingProfileError(f"no profile run {run_id!r} with points in the store")
        pts = [ProfilePoint(r.stage, r.hardware, r.batch, r.vcpus, r.gpu_share, r.mean_ms, r.p95_ms) for r in rows]
        cold: dict[tuple[str, str], float] = {}
        for r in rows:
            cold[(r.stage, r.hardware)] = max(cold.get((r.stage, r.hardware), 0.0), r.cold_start_ms)
        return LatencyProfile(pts, cold)
