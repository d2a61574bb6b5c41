"""The cost store prices each pool's records with the cost split and idle billing that pool used.

The worked example (tests/cost_records.py) recorded by pools of different
options into one store: each pool's share of a run's cost is what that pool's
artifacts showed, an override prices every pool alike, and a store written
before the options were kept reads as the defaults, as it did then.
"""

from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy import event, inspect, select, text
from sqlalchemy.engine import Engine

from esg_prefect.control.records import BatchDone, RunStub
from esg_prefect.exceptions import ConfigError
from esg_prefect.model.pricing import PriceSheet
from esg_prefect.scheduling import ESGSettings
from esg_prefect.store import IDLE_KEY, CostStore
from esg_prefect.store.billing import Billing, billing_of, scope_of
from esg_prefect.store.migrations import MIGRATIONS
from esg_prefect.store.tables import PoolRow, PriceSheetRow
from tests.cost_records import B1, EXPECTED_PER_RUN, IDLE_W1, PRICES, RUN_A, RUN_B, RUN_C, T0, all_records, records_a
from tests.test_store import costs_by_key

DEFAULT = {**EXPECTED_PER_RUN, IDLE_KEY: 1.1}
"""Equal split, idle attributed (the defaults): the worked example's figures."""
BY_SIZE_SEPARATE = {RUN_A: 0.25 + 0.4, RUN_B: 0.75, RUN_C: 0.05, IDLE_KEY: 2.5 + 0.2 + 1.1}
"""Input-size split (A 1 : B 3 in b1), every idle interval on the idle line."""


def record(store: CostStore, scope: str, billing: Billing | None) -> None:
    for rec in all_records():
        store.record(rec, scope=scope, billing=billing)


def test_each_pool_is_priced_with_its_own_options(store_url: str) -> None:
    with CostStore(store_url) as s:
        record(s, "p1", Billing("input_size", "separate"))
        record(s, "p2", Billing())
        record(s, "p3", None)  # a pool that stored no options: the store's defaults
        assert s.billings() == {"p1": Billing("input_size", "separate"), "p2": Billing(), "p3": None}
        got = costs_by_key(s)
        assert got == pytest.approx({k: BY_SIZE_SEPARATE[k] + 2 * DEFAULT[k] for k in DEFAULT}, rel=1e-12)
        assert sum(got.values()) == pytest.approx(3 * 5.25, rel=1e-12)  # the whole bill of the three pools
        # an override prices every pool alike
        assert costs_by_key(s, split="equal", idle_billing="attribute") == pytest.approx(
            {k: 3 * v for k, v in DEFAULT.items()}, rel=1e-12
        )
        assert costs_by_key(s, split="input_size", idle_billing="separate") == pytest.approx(
            {k: 3 * v for k, v in BY_SIZE_SEPARATE.items()}, rel=1e-12
        )
        rows = {r.key: r for r in s.costs("run")}
        assert (rows[RUN_B].busy_cost, rows[RUN_B].idle_cost) == pytest.approx((0.75 + 2 * 0.5, 2 * 1.25), rel=1e-12)
    # the store's defaults apply to the pool that stored none, and only to it
    with CostStore(store_url, cost_split="input_size", idle_billing="separate") as s:
        got = costs_by_key(s)
        assert got == pytest.approx({k: 2 * BY_SIZE_SEPARATE[k] + DEFAULT[k] for k in DEFAULT}, rel=1e-12)


def test_a_pool_keeps_the_options_it_first_stored(store_url: str) -> None:
    with CostStore(store_url) as s:
        record(s, "p1", Billing("input_size", "separate"))
        record(s, "p1", Billing())  # the same scope again: its first options stay
        assert s.billings() == {"p1": Billing("input_size", "separate")}
        assert costs_by_key(s) == pytest.approx(BY_SIZE_SEPARATE, rel=1e-12)


def test_a_store_from_before_the_options_reads_as_the_defaults(store_url: str) -> None:
    """A version-3 store (no ``pools`` table) upgrades, reads as before, and keeps new pools' options."""
    if store_url.startswith("sqlite") and sqlite3.sqlite_version_info < (3, 35, 0):
        pytest.skip(f"SQLite {sqlite3.sqlite_version} cannot drop a column (3.35 can)")
    with CostStore(store_url, migrations=MIGRATIONS[:3]) as s:
        record(s, "old", None)
        with s.engine.begin() as conn:
            conn.execute(text("DROP TABLE pools"))  # version 3 had none
            conn.execute(text("ALTER TABLE runs DROP COLUMN run_name"))  # nor this column (version 5)
            conn.execute(text("ALTER TABLE runs DROP COLUMN ended"))  # nor this one (version 6)
            conn.execute(text("DROP INDEX ix_batches_worker_end"))  # nor these (version 7)
            conn.execute(text("DROP INDEX ix_worker_idle_worker_start"))
            conn.execute(text("DROP INDEX ix_stage_calls_start_ms"))  # nor this one (version 8)
    with CostStore(store_url) as s:
        assert s.schema_version == len(MIGRATIONS) == 8
        assert s.billings() == {"old": None}
        assert costs_by_key(s) == pytest.approx(DEFAULT, rel=1e-12)  # as before the upgrade
        with s.engine.connect() as conn:
            cols = {c["name"]: c["nullable"] for c in inspect(conn).get_columns("pools")}
        assert cols == {c.name: c.nullable for c in PoolRow.__table__.columns}  # type: ignore[attr-defined]
        record(s, "new", Billing("input_size", "separate"))
        assert s.billings() == {"new": Billing("input_size", "separate"), "old": None}
        assert costs_by_key(s) == pytest.approx({k: DEFAULT[k] + BY_SIZE_SEPARATE[k] for k in DEFAULT}, rel=1e-12)


def statements(engine: Engine, prefix: str) -> list[str]:
    """The statements starting with ``prefix`` that ``engine`` runs from now on (a list that grows)."""
    seen: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def _seen(conn: object, cursor: object, statement: str, *args: object) -> None:
        if statement.lstrip().upper().startswith(prefix):
            seen.append(statement)

    return seen


def flush() -> list[BatchDone]:
    """What a pool's batch listener hands over: one batch of run A, which has not ended yet."""
    return [BatchDone(B1, records_a().calls[:1], "img", "detect", PRICES, (RunStub(RUN_A, "img", T0, 1000.0),))]


def test_a_pool_s_options_are_written_once_per_store_not_per_flush(store_url: str) -> None:
    with CostStore(store_url) as s:
        inserts = statements(s.engine, "INSERT INTO POOLS")
        for _ in range(5):
            s.record_batches(flush(), scope="p1", billing=Billing("input_size", "separate"))
        s.record(records_a(), scope="p1", billing=Billing("input_size", "separate"))
        assert len(inserts) == 1
        s.record_batches(flush(), scope="p2", billing=Billing())  # another pool: its own, once
        s.record_batches(flush(), scope="p2", billing=Billing())
        assert len(inserts) == 2
        assert s.billings() == {"p1": Billing("input_size", "separate"), "p2": Billing()}


def test_a_price_sheet_is_written_once_per_store_not_per_flush(store_url: str) -> None:
    """A flush after the first runs one statement fewer: its sheet's row is stored already."""
    with CostStore(store_url) as s:
        sheets = statements(s.engine, "INSERT INTO PRICE_SHEETS")
        writes = statements(s.engine, "INSERT")
        per_flush = []
        for _ in range(3):
            before = len(writes)
            s.record_batches(flush(), scope="p1", billing=Billing())
            per_flush.append(len(writes) - before)
        s.record(records_a(), scope="p1")
        s.record_run(records_a(), scope="p1")
        s.record_idles([IDLE_W1], PRICES, scope="p1")
        assert len(sheets) == 1
        assert per_flush == [per_flush[0], per_flush[0] - 2, per_flush[0] - 2]  # no pool row, no sheet row
        other = PriceSheet(1.0, {"T4": 2.0})
        s.record_idles([IDLE_W1], other, scope="p1")  # a new sheet: its own row, once
        s.record_idles([IDLE_W1], other, scope="p1")
        assert len(sheets) == 2
        with s.engine.connect() as conn:
            assert len(conn.execute(select(PriceSheetRow.sheet_id)).all()) == 2


def test_a_write_rolled_back_does_not_lose_the_pool_s_options_or_sheet(store_url: str) -> None:
    class Boom(Exception):
        pass

    with CostStore(store_url) as s:

        @event.listens_for(s.engine, "before_cursor_execute")
        def fail_once(conn: object, cursor: object, statement: str, *args: object) -> None:
            if statement.lstrip().upper().startswith("INSERT INTO BATCHES"):  # after the pool's row, same transaction
                event.remove(s.engine, "before_cursor_execute", fail_once)
                raise Boom

        with pytest.raises(Boom):
            s.record_batches(flush(), scope="p1", billing=Billing("input_size", "separate"))
        with s.engine.connect() as conn:
            assert conn.execute(select(PoolRow.scope)).all() == []  # rolled back with the batch
            assert conn.execute(select(PriceSheetRow.sheet_id)).all() == []  # and so was the sheet
        s.record_batches(flush(), scope="p1", billing=Billing("input_size", "separate"))
        with s.engine.connect() as conn:
            assert conn.execute(select(PoolRow.scope)).scalars().all() == ["p1"]
            assert len(conn.execute(select(PriceSheetRow.sheet_id)).all()) == 1  # written by the retry
        assert s.billings() == {"p1": Billing("input_size", "separate")}


def test_a_bad_stored_option_is_one_error_naming_the_pool(store_url: str) -> None:
    with CostStore(store_url) as s:
        record(s, "p1", Billing())
        with s.engine.begin() as conn:
            conn.execute(text("UPDATE pools SET cost_split = 'by_weight'"))
        with pytest.raises(ConfigError, match=r"pool 'p1' in the cost store: cost_split .* got 'by_weight'"):
            s.costs("run")


def test_billing_of_a_pool_and_scopes() -> None:
    class WithSettings:
        settings = ESGSettings(cost_split="input_size", idle_billing="separate")

    assert billing_of(WithSettings()) == Billing("input_size", "separate")
    assert billing_of(object()) is None
    assert (scope_of("3f2a:w1"), scope_of("w1")) == ("3f2a", "")
    with pytest.raises(ConfigError, match="'later'"):
        Billing("equal", "later")  # type: ignore[arg-type]
    assert Billing().overridden(None, "separate") == Billing("equal", "separate")
