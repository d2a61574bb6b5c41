"""Schema versions of the cost store, applied in order when a store is opened.

The ``schema_version`` table holds one row per migration applied. On open:

* a database without the store's tables is created from the table classes of
  :mod:`esg_prefect.store.tables` (the newest shape) and stamped with every
  known version, as Alembic's ``stamp head`` does, since there is nothing to
  migrate;
* a database at an older version gets each missing migration, in version
  order, each in its own transaction with its ``schema_version`` row: a
  migration that fails leaves the database at the version before it, data
  intact;
* a database at a newer version than this code knows is refused (an older
  esg-prefect would write rows that lack the new columns' meaning).

Writing version N+1: change the table classes, then append a
``Migration(N+1, ...)`` whose ``apply`` brings a version-N database to that
shape without losing rows, e.g. ``ALTER TABLE runs ADD COLUMN tags VARCHAR
DEFAULT ''`` (both SQLite and PostgreSQL keep the rows and fill the default).
A migration must never be edited once released; the test suite checks that a
version-1 database upgrades with its data.

Concurrent opens are safe: on PostgreSQL the migration holds an advisory
lock; on SQLite the write transaction (``BEGIN IMMEDIATE``) serialises them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy import Engine, inspect, select, text
from sqlalchemy.engine import Connection
from sqlmodel import col

from esg_prefect.exceptions import ConfigError
from esg_prefect.store.engine import WRITE
from esg_prefect.store.tables import DATA_TABLES, SchemaVersion, StoreModel

_PG_LOCK_KEY = 0x45534743  # "ESGC": one advisory lock id for migrating the cost store


@dataclass(frozen=True, slots=True)
class Migration:
    """One step of the schema: ``apply(conn)`` brings version ``version - 1`` to ``version``."""

    version: int
    description: str
    apply: Callable[[Connection], None]


def _create_v1(conn: Connection) -> None:
    """Version 1 is never applied as a step: an unversioned database is created at the newest
    shape and stamped with every version (:func:`_create_fresh`), so any versioned one has 1.

    ``create_all`` here would build today's tables, and the later steps' ``ADD COLUMN`` would
    then fail on columns already there; a database stamped with later versions but not 1 was
    edited by hand, and is refused rather than guessed at.
    """
    raise ConfigError(
        "the cost store's schema_version table lacks version 1 but holds later ones: "
        "it was edited by hand; restore the version rows or point the store at an empty database"
    )


def check_migrations(migrations: Sequence[Migration]) -> None:
    """Versions must be 1, 2, ..., N: a gap or a duplicate would skip or repeat a step.

    Raises:
        ConfigError: naming the versions found.
    """
    versions = [m.version for m in migrations]
    if versions != list(range(1, len(versions) + 1)):
        raise ConfigError(f"cost store migrations must be numbered 1..N in order, got {versions}")


def current_version(engine: Engine) -> int | None:
    """The newest version applied to the database, or None before the store's first open."""
    with engine.connect() as conn:
        if not inspect(conn).has_table(SchemaVersion.__tablename__):
            return None
        return conn.execute(select(col(SchemaVersion.version)).order_by(col(SchemaVersion.version).desc())).scalar()  # type: ignore[no-any-return]


def migrate(engine: Engine, migrations: Sequence[Migration] | None = None) -> tuple[int, ...]:
    """Bring the database to the newest schema version.

    Args:
        engine: the store's engine.
        migrations: the steps (default :data:`MIGRATIONS`; tests pass others).

    Returns:
        The versions applied by this call (empty when it was up to date).

    Raises:
        ConfigError: the database is newer than this code, or holds the store's
            tables without a version (not made by this store).
    """
    steps = tuple(MIGRATIONS if migrations is None else migrations)
    check_migrations(steps)
    newest = steps[-1].version
    with engine.connect().execution_options(**{WRITE: True}) as conn:
        with conn.begin():
            _lock(conn)
            SchemaVersion.__table__.create(conn, checkfirst=True)  # type: ignore[attr-defined]
            applied = set(conn.execute(select(col(SchemaVersion.version))).scalars())
            if not applied:
                return _create_fresh(conn, steps)
        above = sorted(v for v in applied if v > newest)
        if above:
            raise ConfigError(
                f"the cost store is at schema version {max(above)}, newer than this esg-prefect knows "
                f"({newest}): upgrade esg-prefect, or point it at another store"
            )
        done: list[int] = []
        for step in steps:
            if step.version in applied:
                continue
            with conn.begin():
                _lock(conn)
                if conn.execute(
                    select(col(SchemaVersion.version)).where(col(SchemaVersion.version) == step.version)
                ).first():
                    continue  # another process applied it while we waited for the lock
                step.apply(conn)
                _stamp(conn, step)
            done.append(step.version)
        return tuple(done)


def _create_fresh(conn: Connection, steps: Sequence[Migration]) -> tuple[int, ...]:
    names = inspect(conn).get_table_names()
    present = [t.__tablename__ for t in DATA_TABLES if t.__tablename__ in names]
    if present:
        raise ConfigError(
            f"the database holds cost store tables {present} but no schema_version rows: "
            "it was not made by esg-prefect's cost store; point the store at an empty database"
        )
    StoreModel.metadata.create_all(conn)
    for step in steps:
        _stamp(conn, step)
    return tuple(s.version for s in steps)


def _stamp(conn: Connection, step: Migration) -> None:
    conn.execute(
        SchemaVersion.__table__.insert().values(  # type: ignore[attr-defined]
            version=step.version, description=step.description, applied_at_ms=time.time() * 1000.0
        )
    )


def _lock(conn: Connection) -> None:
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})


def add_column(table: str, column: str, ddl_type: str, default_sql: str) -> Callable[[Connection], None]:
    """A migration step adding ``column`` to ``table`` with a default, keeping every row.

    Example:
        >>> step = Migration(2, "runs.tags", add_column("runs", "tags", "VARCHAR", "''"))
    """

    def apply(conn: Connection) -> None:
        conn.execute(text(f"ALTER TABLE {table} ADD COLUMN {column} {ddl_type} DEFAULT {default_sql}"))

    return apply


def _create_pools(conn: Connection) -> None:
    """Version 4: the ``pools`` table (empty: pools of older versions recorded no options, read as the defaults).

    Spelled out rather than built from :class:`~esg_prefect.store.tables.PoolRow`, so that a later change
    of the class cannot change what this released step does.
    """
    conn.execute(
        text(
            "CREATE TABLE pools (scope VARCHAR NOT NULL, cost_split VARCHAR NOT NULL, "
            "idle_billing VARCHAR NOT NULL, first_ms FLOAT NOT NULL, PRIMARY KEY (scope))"
        )
    )


def _index_workers_by_time(conn: Connection) -> None:
    """Version 7: a worker's batches by end and its idle intervals by start, in one index each.

    What the restart read (:mod:`esg_prefect.store.earlier`) looks up around a run's batches:
    with an index on the worker alone, each lookup reads the worker's whole history. Spelled
    out, as :func:`_create_pools` is; ``IF NOT EXISTS``, since a store created at an older
    version by this code's table classes has them already.
    """
    conn.execute(text("CREATE INDEX IF NOT EXISTS ix_batches_worker_end ON batches (worker_id, end_ms)"))
    conn.execute(text("CREATE INDEX IF NOT EXISTS ix_worker_idle_worker_start ON worker_idle (worker_id, start_ms)"))


def _index_calls_by_start(conn: Connection) -> None:
    """Version 8: stage calls by start, for the per-run call counts of a window (``esg-prefect costs --since``).

    Without it, the read scans every call the store holds. ``IF NOT EXISTS``, as in version 7.
    """
    conn.execute(text("CREATE INDEX IF NOT EXISTS ix_stage_calls_start_ms ON stage_calls (start_ms)"))


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "runs, stage calls, batches and their items, worker idle intervals, price sheets", _create_v1),
    Migration(
        2,
        "worker_idle.loading_ms: a pre-warm load at an idle interval's start",
        add_column("worker_idle", "loading_ms", "FLOAT", "0"),
    ),
    Migration(
        3,
        "worker_idle.vcpus_held: a worker that held its vCPUs while idle",
        add_column("worker_idle", "vcpus_held", "BOOLEAN", "FALSE"),
    ),
    Migration(4, "pools: the cost split and idle billing each pool priced its runs with", _create_pools),
    Migration(
        5,
        "runs.run_name: the flow run's name in Prefect, shown by esg-prefect costs --by run",
        add_column("runs", "run_name", "VARCHAR", "NULL"),
    ),
    Migration(
        6,
        "runs.ended: a provisional row told from a run that ended with no finish (older rows read as ended)",
        add_column("runs", "ended", "BOOLEAN", "TRUE"),
    ),
    Migration(
        7,
        "indexes batches(worker_id, end_ms) and worker_idle(worker_id, start_ms): a worker's records by time",
        _index_workers_by_time,
    ),
    Migration(8, "index stage_calls(start_ms): the calls of a time window", _index_calls_by_start),
)
"""Every schema version, oldest first; the last one is the version the table classes describe."""
