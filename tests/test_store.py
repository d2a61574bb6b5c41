"""The cost store: records from a real pool, the billing invariant, idempotent upserts, migrations, group-bys.

Every store test runs on SQLite in tmp_path and, where PostgreSQL's server
binaries are installed, on a throwaway PostgreSQL cluster started per module by
tests/conftest.py's ``store_url`` (``initdb`` in a temp folder, ``pg_ctl start``
on a free port bound to 127.0.0.1, stopped at the end). CI installs them with
``scripts/install_postgres.sh``. Migrations: tests/test_store_migrations.py.
"""

from __future__ import annotations

import concurrent.futures
import math
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import func, select

from esg_prefect.control.calls import StageCall, StageResult, WorkflowDecl
from esg_prefect.control.records import RunRecords
from esg_prefect.exceptions import ConfigError, InvalidInputError
from esg_prefect.model import PriceSheet, attribute_costs
from esg_prefect.runtime.pool import Pool
from esg_prefect.runtime.pool_records import final_records
from esg_prefect.runtime.workers import InlineBackend
from esg_prefect.scheduling import ESGSettings
from esg_prefect.store import (
    IDLE_KEY,
    NO_DEPLOYMENT,
    CostStore,
    attach_store,
    default_store_path,
    resolve_url,
)
from esg_prefect.store.migrations import MIGRATIONS
from esg_prefect.store.tables import BatchItemRow, BatchRow, IdleRow, PriceSheetRow, RunRow, StageCallRow
from tests.cost_records import (
    DAY,
    EXPECTED_IDLE_LINE,
    EXPECTED_PER_RUN,
    EXPECTED_TOTAL,
    RUN_A,
    RUN_B,
    RUN_C,
    T0,
    T4_PRICES,
    T4InlineBackend,
    all_records,
    records_a,
    records_b,
    t4_toy_profile,
)
from tests.toy_calls import flow_call
from tests.toy_stages import toy_profile


@pytest.fixture
def store(store_url: str) -> Iterator[CostStore]:
    s = CostStore(store_url)
    yield s
    s.close()


def count(store: CostStore, model: type) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(model)).scalar_one())


def costs_by_key(store: CostStore, group_by: str = "run", **kw: object) -> dict[str, float]:
    return {r.key: r.cost for r in store.costs(group_by, **kw)}  # type: ignore[arg-type]


def record_all(store: CostStore, scope: str = "") -> None:
    for rec in all_records():
        store.record(rec, scope=scope, deployment={RUN_A: "nightly", RUN_C: "nightly"}.get(rec.run_id))


# ---- the worked example ------------------------------------------------------------------------


def test_worked_example_per_run_and_the_idle_line(store: CostStore) -> None:
    record_all(store)
    rows = store.costs("run")
    assert [r.key for r in rows] == [RUN_A, RUN_B, RUN_C, IDLE_KEY]  # arrival order, idle line last
    for r in rows[:-1]:
        assert r.cost == pytest.approx(EXPECTED_PER_RUN[r.key], rel=1e-12)
    assert rows[-1].cost == pytest.approx(EXPECTED_IDLE_LINE, rel=1e-12) and rows[-1].idle
    assert sum(r.cost for r in rows) == pytest.approx(EXPECTED_TOTAL, rel=1e-12)
    a, b, c = rows[:3]
    assert (a.runs, a.stage_calls, a.slo_met, a.slo_missed) == (1, 2, 1, 0)
    assert (b.runs, b.stage_calls, b.slo_met, b.slo_missed) == (1, 1, 0, 1)
    assert (c.runs, c.stage_calls, c.slo_met, c.slo_missed) == (1, 2, 0, 1)  # never finished: a miss


def test_group_by_workflow_deployment_day(store: CostStore) -> None:
    record_all(store)
    img, txt = EXPECTED_PER_RUN[RUN_A] + EXPECTED_PER_RUN[RUN_B], EXPECTED_PER_RUN[RUN_C]
    wf = store.costs("workflow")
    assert [(r.key, r.runs, r.slo_met, r.slo_missed) for r in wf] == [
        ("img", 2, 1, 1),
        ("txt", 1, 0, 1),
        (IDLE_KEY, 0, 0, 0),
    ]
    assert [r.cost for r in wf] == pytest.approx([img, txt, EXPECTED_IDLE_LINE], rel=1e-12)
    dep = costs_by_key(store, "deployment")
    assert list(dep) == [NO_DEPLOYMENT, "nightly", IDLE_KEY]
    assert dep[NO_DEPLOYMENT] == pytest.approx(EXPECTED_PER_RUN[RUN_B], rel=1e-12)
    assert dep["nightly"] == pytest.approx(EXPECTED_PER_RUN[RUN_A] + EXPECTED_PER_RUN[RUN_C], rel=1e-12)
    day = costs_by_key(store, "day")
    assert list(day) == ["2024-05-01", "2024-05-02", IDLE_KEY]
    assert [day["2024-05-01"], day["2024-05-02"]] == pytest.approx([img, txt], rel=1e-12)


def test_split_and_idle_billing_settings_are_honoured(store: CostStore) -> None:
    record_all(store)
    # input sizes 1 (A) and 3 (B) in b1: b1's 1.0 and w1's idle 2.5 split 1:3; b2 (0.4) and w2's idle (0.2) A's
    by_size = costs_by_key(store, split="input_size")
    assert by_size[RUN_A] == pytest.approx(0.25 + 0.4 + 0.625 + 0.2, rel=1e-12)
    assert by_size[RUN_B] == pytest.approx(0.75 + 1.875, rel=1e-12)
    separate = costs_by_key(store, idle_billing="separate")
    assert [separate[RUN_A], separate[RUN_B], separate[RUN_C]] == pytest.approx([0.9, 0.5, 0.05], rel=1e-12)
    assert separate[IDLE_KEY] == pytest.approx(2.5 + 0.2 + 1.1, rel=1e-12)  # w1, w2, w4 (its load included)
    assert sum(separate.values()) == pytest.approx(EXPECTED_TOTAL, rel=1e-12)
    with pytest.raises(ConfigError, match="'by_weight'"):
        store.costs("run", split="by_weight")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="'stage'"):
        store.costs("stage")


def test_since_is_a_window_on_time(store: CostStore) -> None:
    record_all(store)
    second_day = datetime(2024, 5, 2, tzinfo=UTC)
    # w4's idle interval (its load included) starts at T0+1d: in the window, on the idle line
    assert costs_by_key(store, since=second_day) == pytest.approx({RUN_C: 0.05, IDLE_KEY: 1.1}, rel=1e-12)
    assert costs_by_key(store, since=T0 + DAY) == costs_by_key(store, since=second_day)
    assert costs_by_key(store, since=datetime(2024, 5, 2)) == costs_by_key(store, since=second_day)  # naive = UTC
    # from T0+600: b2 started before (left out); w1's idle started at 500 (left out); w2's idle (700) and
    # its batch b2 (500) -> no batch in the window before it: the idle line
    win = costs_by_key(store, since=T0 + 600)
    assert win == pytest.approx({RUN_C: 0.05, IDLE_KEY: 0.2 + 1.1}, rel=1e-12)
    with pytest.raises(InvalidInputError, match="'yesterday'"):
        store.costs("run", since="yesterday")  # type: ignore[arg-type]


# ---- idempotency -------------------------------------------------------------------------------


def test_upserts_are_idempotent(store: CostStore) -> None:
    record_all(store)
    before = {
        m.__name__: count(store, m) for m in (RunRow, StageCallRow, BatchRow, BatchItemRow, IdleRow, PriceSheetRow)
    }
    assert before == {
        "RunRow": 3,
        "StageCallRow": 5,
        "BatchRow": 3,
        "BatchItemRow": 4,
        "IdleRow": 3,
        "PriceSheetRow": 1,
    }
    costs = store.costs("run")
    record_all(store)  # a listener called twice
    store.record(records_b())  # b1 arrives again, with B
    after = {
        m.__name__: count(store, m) for m in (RunRow, StageCallRow, BatchRow, BatchItemRow, IdleRow, PriceSheetRow)
    }
    assert after == before
    assert store.costs("run") == costs


def test_a_known_deployment_is_not_erased(store: CostStore) -> None:
    def deployment_of_a() -> str | None:
        with store.engine.connect() as conn:
            return conn.execute(select(RunRow.deployment).where(RunRow.run_id == RUN_A)).scalar_one()  # type: ignore[arg-type]

    store.record(records_a(), deployment="nightly")
    store.record(records_a(), deployment=None)
    assert deployment_of_a() == "nightly"
    store.record(records_a(), deployment="weekly")
    assert deployment_of_a() == "weekly"
    # B shares b1 with A but has not ended: billed, grouped without a deployment until it is recorded
    assert list(costs_by_key(store, "deployment")) == [NO_DEPLOYMENT, "weekly", IDLE_KEY]


def test_scopes_keep_pools_apart(store: CostStore) -> None:
    """Two pools both number their first batch b1: scoped ids never collide."""
    record_all(store, scope="p1")
    record_all(store, scope="p2")  # same local ids, other pool; same runs re-recorded
    assert count(store, BatchRow) == 6 and count(store, IdleRow) == 6
    with store.engine.connect() as conn:
        ids = sorted(conn.execute(select(BatchRow.batch_id)).scalars())  # type: ignore[call-overload]
    assert ids == ["p1:b1", "p1:b2", "p1:b3", "p2:b1", "p2:b2", "p2:b3"]
    assert costs_by_key(store)[RUN_A] == pytest.approx(2 * EXPECTED_PER_RUN[RUN_A], rel=1e-12)


def test_open_idle_interval_is_replaced_by_its_longer_copy(store: CostStore) -> None:
    from esg_prefect.model.attribution import IdleRecord

    record_all(store)
    # w9 holds a quarter of a T4 (1.0 per s idle): open for 1 s, then closed after 3 s
    store.record_idles([IdleRecord("w9", 1, 0.25, "T4", T0, T0 + 1000)], PriceSheet(0.5, {"T4": 4.0}))
    store.record_idles([IdleRecord("w9", 1, 0.25, "T4", T0, T0 + 3000)], PriceSheet(0.5, {"T4": 4.0}))
    assert count(store, IdleRow) == 4
    assert costs_by_key(store)[IDLE_KEY] == pytest.approx(EXPECTED_IDLE_LINE + 3.0, rel=1e-12)


def test_price_sheets_are_kept_per_batch(store: CostStore) -> None:
    """A pool with other prices: its batches are billed with its sheet, not the first one stored."""
    store.record(records_a())
    dear = records_a()
    dear = RunRecords(
        "other-run", dear.workflow, (), dear.batches, dear.arrival_ms, dear.finish_ms, dear.slo_ms,
        PriceSheet(1.0, {"T4": 8.0}), "equal", (),
    )  # fmt: skip
    store.record(dear, scope="dear")
    assert count(store, PriceSheetRow) == 2
    got = costs_by_key(store, idle_billing="separate")
    assert got[RUN_A] == pytest.approx(0.9 + 1.8, rel=1e-12)  # its share of b1 (0.5), b2 (0.4) at both prices
    assert got["other-run"] == pytest.approx(0.0)  # it has no items in those batches


def test_concurrent_writers(store: CostStore) -> None:
    """Pools of one process share a store: writes from several threads all land."""
    recs = all_records()

    def write(i: int) -> None:
        for rec in recs:
            store.record(rec, scope=f"t{i}")

    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        list(ex.map(write, range(4)))
    assert count(store, BatchRow) == 12
    assert sum(costs_by_key(store).values()) == pytest.approx(4 * EXPECTED_TOTAL, rel=1e-12)


SHIPPED = len(MIGRATIONS)
"""The schema version this esg-prefect ships (the table classes describe it)."""


# ---- where the store lives ---------------------------------------------------------------------


def test_urls(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ESG_PREFECT_STORE_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "ph"))
    assert default_store_path() == tmp_path / "ph" / "esg_prefect" / "costs.db"
    assert resolve_url(None) == f"sqlite:///{tmp_path / 'ph' / 'esg_prefect' / 'costs.db'}"
    monkeypatch.delenv("PREFECT_HOME")
    assert default_store_path() == Path("~/.prefect/esg_prefect/costs.db").expanduser()
    monkeypatch.setenv("ESG_PREFECT_STORE_URL", "postgres://u:pw@h/db")
    assert resolve_url(None) == "postgresql+psycopg://u:pw@h/db"
    assert resolve_url("postgresql+asyncpg://u@h/db") == "postgresql+psycopg://u@h/db"  # Prefect-style URL
    assert resolve_url(str(tmp_path / "x.db")) == f"sqlite:///{tmp_path / 'x.db'}"
    with pytest.raises(ConfigError, match="'mysql'"):
        resolve_url("mysql://h/db")
    with pytest.raises(ConfigError, match="no cost store at"):
        CostStore(str(tmp_path / "missing.db"), create=False)
    with CostStore(str(tmp_path / "sub" / "dir" / "c.db")) as s:  # folders made on first use
        assert s.schema_version == SHIPPED and "sub/dir/c.db" in repr(s)
    from esg_prefect.store.engine import safe_url

    assert safe_url("postgresql+psycopg://u:secret@h/db") == "postgresql+psycopg://u:***@h/db"
    with pytest.raises(ConfigError) as err:  # a URL SQLAlchemy cannot read: its password is masked still
        CostStore("postgresql://u:secret@h:badport/db")
    assert "secret" not in str(err.value) and "u:***@h" in str(err.value)
    assert (tmp_path / "sub" / "dir" / "c.db").stat().st_mode & 0o077 == 0  # a new store is the owner's alone


# ---- real runs from a pool --------------------------------------------------------------------


def _run_flows(pool: Pool, runs: list[str]) -> None:
    """Each run: double then inc, like a flow; then end the run."""
    firsts = {r: pool.submit(flow_call("double", r, i)) for i, r in enumerate(runs)}
    seconds = {r: pool.submit(flow_call("inc", r, f.result(30).output)) for r, f in firsts.items()}
    for r, f in seconds.items():
        assert isinstance(f.result(30), StageResult)
        pool.end_run(r)


def test_real_pool_runs_keep_the_invariant(store: CostStore) -> None:
    """Per-run costs plus the idle line equal every worker second the pool billed, times its price.

    Busy seconds at the worker's whole rate, idle seconds at its GPU share's (its vCPUs during a
    pre-warm load): the workers hold shares of a T4, so their idle time costs something.
    """
    prices = T4_PRICES
    backend = T4InlineBackend(vcpus=2)
    pool = Pool(t4_toy_profile(), prices, backend=backend, settings=ESGSettings(keep_alive_s=60.0))
    ended: list[RunRecords] = []
    all_ended = threading.Event()
    n_runs = 12
    try:
        attachment = attach_store(pool, store)

        def seen(rec: RunRecords) -> None:  # called after the store's listener, on the same thread
            ended.append(rec)
            if len(ended) == n_runs:
                all_ended.set()

        pool.add_run_listener(seen)
        runs = [f"run-{i}" for i in range(n_runs)]
        for wave in (runs[:6], runs[6:]):  # two waves: warm workers idle in between, then are reused
            _run_flows(pool, wave)
        assert all_ended.wait(120)
        attachment.flush()  # the idle time after the last run ended, open intervals included
        flushed = count(store, IdleRow)
        snap = pool.snapshot()
        store.record_idles(snap.idles, prices, scope=attachment.scope)  # again: the same rows
        assert count(store, IdleRow) == flushed == len(snap.idles)
    finally:
        pool.close()  # the store writes the idle intervals the close ended: their closed copies
    final = final_records(pool)
    assert final is not None
    batches, idles = final
    assert count(store, IdleRow) == len(idles) == flushed  # longer copies replaced the open intervals
    assert batches and any(len(b.items) > 1 for b in batches)
    assert all(b.hardware == "T4" and b.config.gpu_share > 0 for b in batches)
    idle_time_cost = sum(  # the GPU share all along, the vCPUs only while a pre-warm load ran
        (
            i.gpu_share * prices.gpu_price_s(i.hardware) * (i.end_ms - i.start_ms)
            + i.vcpus * prices.price_per_vcpu_s * i.loading_ms
        )
        / 1000.0
        for i in idles
    )
    assert idle_time_cost > 0  # the invariant covers idle time
    worker_time_cost = sum(prices.batch_cost(b.config, b.hardware, b.duration_ms) for b in batches) + idle_time_cost
    for billing in ("attribute", "separate"):
        rows = store.costs("run", idle_billing=billing)  # type: ignore[arg-type]
        assert math.isclose(sum(r.cost for r in rows), worker_time_cost, rel_tol=1e-9), billing
        expected = attribute_costs(batches, idles, prices, "equal", billing)  # type: ignore[arg-type]
        got = {r.key: r.cost for r in rows if not r.idle}
        assert got == pytest.approx(expected.per_run, rel=1e-9)
        assert rows[-1].cost == pytest.approx(expected.idle_unattributed, rel=1e-9, abs=1e-18)
    # what was stored is what the pool did
    assert count(store, BatchRow) == len(batches)
    assert count(store, BatchItemRow) == sum(len(b.items) for b in batches) == 2 * n_runs
    assert count(store, StageCallRow) == 2 * n_runs and count(store, RunRow) == n_runs
    busy = {r.key: r.cost for r in store.costs("run", idle_billing="separate") if not r.idle}
    for rec in ended:
        assert busy[rec.run_id] == pytest.approx(rec.busy_cost(), rel=1e-9)
    with store.engine.connect() as conn:
        ok = conn.execute(select(StageCallRow.ok, StageCallRow.batch_id, StageCallRow.worker_id)).all()  # type: ignore[call-overload]
    assert all(o for o, _, _ in ok) and all(b.startswith(f"{attachment.scope}:b") for _, b, _ in ok)
    assert all(w.startswith(f"{attachment.scope}:w") for _, _, w in ok)
    assert all(r.slo_met + r.slo_missed == 1 for r in store.costs("run") if not r.idle)
    assert idles  # the invariant covered idle time too


NAMES = ("crimson-fox", "swinging-turkey")  # the flow runs' names, as their calls carry them


def test_batches_are_stored_as_they_complete_so_a_killed_pool_loses_no_finished_batch(store: CostStore) -> None:
    """A pool killed mid-run (its runs never end) has still stored every batch it finished, each once."""
    import time

    prices = PriceSheet(1e-5, {})
    pool = Pool(toy_profile(), prices, backend=InlineBackend())
    remembered = {"run0": "nightly"}  # as recording.deployment_name: it answers once per run
    attach_store(pool, store, deployment_of=lambda run_id: remembered.pop(run_id, None))
    decl = WorkflowDecl("toy", 800, (("double", "inc"),))
    try:
        futs = [
            pool.submit(
                StageCall(
                    f"k{i}", "inc", "tests.toy_stages:inc", decl, f"q{i}", f"run{i % 2}", i, run_name=NAMES[i % 2]
                )
            )
            for i in range(12)
        ]
        assert [f.result(60).output for f in futs] == [i + 1 for i in range(12)]
        snap = pool.snapshot()
        give_up = time.monotonic() + 60  # the listener thread writes them: wait for it, on a condition
        while count(store, StageCallRow) < 12 and time.monotonic() < give_up:
            time.sleep(0.05)
        # No run has ended: everything below was written batch by batch (the runs as provisional rows).
        with store.engine.connect() as conn:
            finished = conn.execute(select(RunRow.run_id, RunRow.finish_ms, RunRow.run_name, RunRow.deployment)).all()  # type: ignore[call-overload]
        # Named as their calls named them, filed under their deployment: a run whose process dies is still listed.
        assert sorted(finished) == [("run0", None, NAMES[0], "nightly"), ("run1", None, NAMES[1], None)]
        assert count(store, StageCallRow) == 12 and count(store, BatchRow) == len(snap.batches)
        assert count(store, BatchItemRow) == sum(len(b.items) for b in snap.batches) == 12
        busy = sum(prices.batch_cost(b.config, b.hardware, b.duration_ms) for b in snap.batches)
        by_run = costs_by_key(store, idle_billing="separate")
        assert by_run.keys() >= {"run0", "run1"} and by_run["run0"] > 0 and by_run["run1"] > 0
        assert by_run["run0"] + by_run["run1"] == pytest.approx(busy, rel=1e-9)
        pool.end_run("run0")  # the run's records, stored again when it ends, add no row but the run's own

        def run0_finished() -> bool:
            with store.engine.connect() as conn:
                row = conn.execute(select(RunRow.finish_ms).where(RunRow.run_id == "run0")).scalar_one()  # type: ignore[call-overload]
            return row is not None

        give_up = time.monotonic() + 60
        while not run0_finished() and time.monotonic() < give_up:
            time.sleep(0.05)
        assert run0_finished() and count(store, RunRow) == 2
        with store.engine.connect() as conn:  # the lookup answered with the first batch: the name stays
            assert conn.execute(select(RunRow.deployment).where(RunRow.run_id == "run0")).scalar_one() == "nightly"  # type: ignore[call-overload]
        assert count(store, BatchRow) == len(snap.batches) and count(store, BatchItemRow) == 12
        assert costs_by_key(store, idle_billing="separate")["run0"] == pytest.approx(by_run["run0"], rel=1e-9)
    finally:
        pool.close()
