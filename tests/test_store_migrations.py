"""Schema versions of the cost store: migrations that keep their data, and the databases refused."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import inspect, select, text
from sqlmodel import col

from esg_prefect.exceptions import ConfigError
from esg_prefect.store import IDLE_KEY, CostStore, Migration
from esg_prefect.store.migrations import MIGRATIONS, add_column
from esg_prefect.store.tables import BatchRow, IdleRow, RunRow, StageCallRow
from tests.cost_records import EXPECTED_IDLE_LINE, EXPECTED_PER_RUN, RUN_A, RUN_B, RUN_C
from tests.test_store import SHIPPED, costs_by_key, count, record_all

NEXT = Migration(SHIPPED + 1, "runs.note", add_column("runs", "note", "VARCHAR(200)", "'none'"))
"""A test-only next version: what a newer esg-prefect would apply to this one's databases."""
ADDED_AFTER_V1: dict[int, tuple[str, str | None]] = {
    2: ("worker_idle", "loading_ms"),
    3: ("worker_idle", "vcpus_held"),
    4: ("pools", None),
    5: ("runs", "run_name"),
    6: ("runs", "ended"),
}
"""What each shipped migration after version 1 adds (table, column; None: the whole table): what version 1 lacks."""

INDEXES_AFTER_V1: dict[int, tuple[tuple[str, str], ...]] = {
    7: (("batches", "ix_batches_worker_end"), ("worker_idle", "ix_worker_idle_worker_start")),
    8: (("stage_calls", "ix_stage_calls_start_ms"),),
}
"""The indexes shipped migrations after version 1 add (table, index name): version 1 lacks them too."""


def test_schema_version_and_migration_keep_data(store_url: str) -> None:
    with CostStore(store_url) as s:
        assert s.schema_version == SHIPPED
        record_all(s)
        costs = s.costs("run")
    # an esg-prefect that knows the next version opens this one's database
    with CostStore(store_url, migrations=(*MIGRATIONS, NEXT)) as s:
        assert s.schema_version == SHIPPED + 1
        assert s.costs("run") == costs  # every row kept
        with s.engine.connect() as conn:
            cols = {c["name"] for c in inspect(conn).get_columns("runs")}
            notes = conn.execute(text("SELECT run_id, note FROM runs ORDER BY arrival_ms")).all()
            versions = conn.execute(text("SELECT version, description FROM schema_version ORDER BY version")).all()
        assert "note" in cols
        assert [tuple(n) for n in notes] == [(RUN_A, "none"), (RUN_B, "none"), (RUN_C, "none")]
        assert [tuple(v) for v in versions] == [
            *((m.version, m.description) for m in MIGRATIONS),
            (SHIPPED + 1, "runs.note"),
        ]
    with CostStore(store_url, migrations=(*MIGRATIONS, NEXT)) as s:  # applied once: a second ADD COLUMN would fail
        assert s.schema_version == SHIPPED + 1
    newer = rf"schema version {SHIPPED + 1}, newer than this esg-prefect knows \({SHIPPED}\)"
    with pytest.raises(ConfigError, match=newer):
        CostStore(store_url)


def test_a_version_1_database_upgrades_to_the_shipped_version(store_url: str) -> None:
    """A store written at schema version 1 opens under the shipped migrations, its idle rows kept.

    Version 1 had no ``worker_idle.loading_ms``: its idle intervals read as having no
    pre-warm load, i.e. billed at their GPU share's price for their whole length.
    """
    # a new migration: say what it adds
    assert sorted([*ADDED_AFTER_V1, *INDEXES_AFTER_V1]) == [m.version for m in MIGRATIONS[1:]]
    if store_url.startswith("sqlite") and sqlite3.sqlite_version_info < (3, 35, 0):
        pytest.skip(f"SQLite {sqlite3.sqlite_version} cannot drop a column (3.35 can)")
    # A fresh store stamped with version 1 alone is built from today's table classes: it has the
    # columns later versions add. Dropping them leaves version 1's shape, with its rows.
    with CostStore(store_url, migrations=MIGRATIONS[:1]) as s:
        record_all(s)  # w4's 200 ms load is written, then lost with its column, as version 1 would never have kept it
        with s.engine.begin() as conn:
            for _, index in indexes_added():
                conn.execute(text(f"DROP INDEX {index}"))
            for table, column in ADDED_AFTER_V1.values():
                drop = f"DROP TABLE {table}" if column is None else f"ALTER TABLE {table} DROP COLUMN {column}"
                conn.execute(text(drop))
        with s.engine.connect() as conn:
            idle_cols = {c["name"] for c in inspect(conn).get_columns("worker_idle")}
            versions = conn.execute(text("SELECT version FROM schema_version")).scalars().all()
        added = {column for _, column in ADDED_AFTER_V1.values() if column is not None}
        assert idle_cols == {c.name for c in IdleRow.__table__.columns} - added  # type: ignore[attr-defined]
        assert list(versions) == [1] and s.schema_version == 1
        assert not set(indexes_added()) & indexes_of(s)
    with CostStore(store_url) as s:
        assert s.schema_version == SHIPPED
        assert set(indexes_added()) <= indexes_of(s)  # added by the upgrade
        with s.engine.connect() as conn:
            idle_cols = {c["name"] for c in inspect(conn).get_columns("worker_idle")}
            versions = conn.execute(text("SELECT version, description FROM schema_version ORDER BY version")).all()
            loads = conn.execute(select(IdleRow.worker_id, IdleRow.loading_ms).order_by(IdleRow.start_ms)).all()  # type: ignore[call-overload]
            held = conn.execute(select(IdleRow.vcpus_held)).scalars().all()  # type: ignore[call-overload]
        assert {"loading_ms", "vcpus_held"} <= idle_cols
        assert held == [False, False, False]  # version 1 billed idle workers for their GPU share only
        assert [tuple(v) for v in versions] == [(m.version, m.description) for m in MIGRATIONS]
        assert count(s, IdleRow) == 3 and count(s, BatchRow) == 3 and count(s, RunRow) == 3
        assert [tuple(r) for r in loads] == [("w1", 0.0), ("w2", 0.0), ("w4", 0.0)]
        # w4's idle time at its quarter T4 alone (1.0 per s x 1 s): its load's vCPU (0.5 per s x 0.2 s) unknown
        got = costs_by_key(s)
        assert got == pytest.approx({**EXPECTED_PER_RUN, IDLE_KEY: EXPECTED_IDLE_LINE - 0.1}, rel=1e-12)
        record_all(s)  # written again by this esg-prefect: the load is known now
        assert costs_by_key(s) == pytest.approx({**EXPECTED_PER_RUN, IDLE_KEY: EXPECTED_IDLE_LINE}, rel=1e-12)
        assert count(s, IdleRow) == 3


def indexes_added() -> list[tuple[str, str]]:
    """Every (table, index) the shipped migrations after version 1 add."""
    return [ix for v in sorted(INDEXES_AFTER_V1) for ix in INDEXES_AFTER_V1[v]]


def indexes_of(store: CostStore) -> set[tuple[str, str]]:
    """The (table, index) pairs of the store's stage calls, batches and idle intervals."""
    with store.engine.connect() as conn:
        found = inspect(conn)
        return {(t, ix["name"] or "") for t in ("stage_calls", "batches", "worker_idle") for ix in found.get_indexes(t)}


def test_a_workers_records_are_read_by_time_through_an_index(store_url: str) -> None:
    """The restart read's lookups around a run's batches (``store.earlier``) do not read a worker's whole history.

    A fresh store has the indexes as an upgraded one does; on SQLite, its plans use them
    for both the worker and the time.
    """
    with CostStore(store_url) as s:
        assert set(indexes_added()) <= indexes_of(s)
        if not store_url.startswith("sqlite"):
            return
        with s.engine.connect() as conn:
            plans = {
                q: " ".join(r[3] for r in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {q}"))
                for q in (
                    "SELECT * FROM batches WHERE worker_id = 'w1' AND end_ms = 1.0",
                    "SELECT min(end_ms) FROM batches WHERE worker_id = 'w1' AND end_ms > 1.0",
                    "SELECT * FROM worker_idle WHERE worker_id = 'w1' AND start_ms >= 1.0 AND start_ms < 2.0",
                )
            }
    assert all(
        re.search(r"USING (COVERING )?INDEX ix_\w+_worker_(end|start) \(worker_id=\? AND", p) for p in plans.values()
    ), plans


def test_a_windows_calls_are_read_through_an_index(store_url: str) -> None:
    """``esg-prefect costs --since``'s per-run call counts do not scan every call the store holds.

    A fresh store has the index on stage_calls(start_ms), as an upgraded one does (above); on
    SQLite, the query the windowed read runs searches it.
    """
    with CostStore(store_url) as s:
        assert ("stage_calls", "ix_stage_calls_start_ms") in indexes_of(s)
        record_all(s)
        if not store_url.startswith("sqlite"):
            return
        q = select(col(StageCallRow.run_id)).where(col(StageCallRow.start_ms) >= 1.0)
        with s.engine.connect() as conn:
            sql = str(q.compile(conn, compile_kwargs={"literal_binds": True}))
            plan = " ".join(r[3] for r in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}"))
    assert re.search(r"SEARCH stage_calls USING (COVERING )?INDEX ix_stage_calls_start_ms \(start_ms>\?\)", plan), plan


def test_a_failed_migration_leaves_the_previous_version(store_url: str) -> None:
    with CostStore(store_url) as s:
        record_all(s)

    def broken(conn: object) -> None:
        add_column("runs", "half", "VARCHAR(20)", "'x'")(conn)  # type: ignore[arg-type]
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        CostStore(store_url, migrations=(*MIGRATIONS, Migration(SHIPPED + 1, "broken", broken)))
    with CostStore(store_url) as s:  # the half-done ADD COLUMN was rolled back with the version row
        assert s.schema_version == SHIPPED
        with s.engine.connect() as conn:
            assert "half" not in {c["name"] for c in inspect(conn).get_columns("runs")}
    with CostStore(store_url, migrations=(*MIGRATIONS, NEXT)) as s:
        assert s.schema_version == SHIPPED + 1
        assert costs_by_key(s)[RUN_A] == pytest.approx(EXPECTED_PER_RUN[RUN_A], rel=1e-12)


def test_migrations_must_be_numbered_in_order(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    gap = SHIPPED + 2  # skips SHIPPED + 1
    with pytest.raises(ConfigError, match=re.escape(f"got {[*range(1, SHIPPED + 1), gap]}")):
        CostStore(url, migrations=(*MIGRATIONS, Migration(gap, "gap", add_column("runs", "x", "INTEGER", "0"))))


def test_tables_without_a_version_are_refused(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "foreign.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY)")
    with pytest.raises(ConfigError, match=r"tables \['runs'\] but no schema_version rows"):
        CostStore(f"sqlite:///{path}")


def test_a_store_missing_version_1_but_holding_later_ones_is_refused(store_url: str) -> None:
    """Version 1 is only ever stamped by a fresh create; its absence beside later versions is a hand edit."""
    with CostStore(store_url) as s:
        record_all(s)
        with s.engine.begin() as conn:
            conn.execute(text("DELETE FROM schema_version WHERE version = 1"))
    with pytest.raises(ConfigError, match="lacks version 1 but holds later ones"):
        CostStore(store_url)
