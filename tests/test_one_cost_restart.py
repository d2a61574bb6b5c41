"""One cost figure for a flow run that a restarted pool service served in two parts (``docs/decisions/one-cost.md``).

``esg-prefect pool serve`` stopped and started again while a flow run is in
flight: the first instance served the run's first calls and stored them in the
cost store; the second serves the rest, sees the run end and publishes it. Its
artifacts and tag must show the store's figure (both parts, each priced as its
own instance priced it), not its own part, and each run is published once.
Here: two live pools on a clock the test moves, wired as ``pool serve`` wires
them (``attach_recorders`` with one store file), the Prefect API a fake.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from sqlalchemy import event, select, update
from sqlmodel import Session, col
from typer.testing import CliRunner

from esg_prefect.cli import app
from esg_prefect.control.records import RunRecords, RunStub
from esg_prefect.exceptions import ConfigError, PoolClosedError
from esg_prefect.integration import artifacts, recording, run_views
from esg_prefect.integration.run_views import EARLIER, money_text
from esg_prefect.model import PriceSheet
from esg_prefect.model.attribution import BatchItem, BatchRecord, IdleRecord, idle_owners
from esg_prefect.model.config import Config
from esg_prefect.runtime.pool import Pool
from esg_prefect.scheduling import ESGSettings
from esg_prefect.store import IDLE_KEY, CostStore
from esg_prefect.store import queries as Q
from esg_prefect.store import rows as R
from esg_prefect.store.billing import Billing
from esg_prefect.store.earlier import earlier_parts, ended_elsewhere
from esg_prefect.store.tables import BatchRow, IdleRow, PoolRow, RunRow
from tests.test_one_cost import FakeBackend, FakeClient, ManualClock, _results, _t4_profile, _whole_bill
from tests.toy_calls import flow_call


@pytest.fixture
def published(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[list[RunRecords], FakeClient]]:
    """Every run the pools publish, in order, and the fake API they post its artifacts and tags to."""
    client, out = FakeClient(), []
    real = artifacts.publish_run

    def publish_run(records: RunRecords, _client: object = None) -> object:
        out.append(records)
        return real(records, client)  # type: ignore[arg-type]

    monkeypatch.setattr(artifacts, "publish_run", publish_run)
    yield out, client
    recording.close_stores()


def _service_pool(clock: ManualClock, prices: PriceSheet, url: str) -> Pool:
    """A pool wired as ``esg-prefect pool serve`` wires its pool: artifacts and the cost store at ``url``."""
    pool = Pool(_t4_profile(), prices, settings=ESGSettings(wait_for_batch=False),
                backend=FakeBackend(clock, gpu=True), clock=clock)  # type: ignore[arg-type]  # fmt: skip
    recording.attach_recorders(pool, artifacts=True, store=url)
    return pool


def test_a_run_split_by_a_restart_is_published_with_the_store_figure(
    tmp_path: Path, published: tuple[list[RunRecords], FakeClient]
) -> None:
    settled, client = published
    url = f"sqlite:///{tmp_path / 'costs.db'}"
    split, whole_a, whole_b = (str(uuid.uuid4()) for _ in range(3))
    # The first instance: `split` runs its first stage there, `whole_a` all of its run; then Ctrl-C.
    clock_a = ManualClock()
    first = _service_pool(clock_a, PriceSheet(1e-5, {"T4": 1e-4}), url)
    try:
        # One at a time, the clock moved between: split's batch leaves its worker idle (that idle time is its
        # cost), whether or not whole_a's call then runs on the same worker. Submitted together, the two calls
        # shared a batch or not as the pool's loop took them (a loaded machine split them, and then no idle
        # interval need follow split's batch).
        (x,) = _results(clock_a, [first.submit(flow_call("double", split, 0))])
        clock_a.advance(100.0)
        (y,) = _results(clock_a, [first.submit(flow_call("double", whole_a, 1))])
        _results(clock_a, [first.submit(flow_call("inc", whole_a, y.output))])
        first.end_run(whole_a)
        clock_a.advance(2_000.0)  # the workers idle warm: that idle time is part of both runs' costs
    finally:
        first.close()
    assert [r.run_id for r in settled] == [whole_a]  # `split` had not ended: the first instance left it
    # The second instance, with other prices: `split` runs its second stage there and ends; `whole_b` runs whole.
    clock_b = ManualClock(clock_a.t + 30_000.0)
    second = _service_pool(clock_b, PriceSheet(2e-5, {"T4": 3e-4}), url)
    try:
        _results(
            clock_b, [second.submit(flow_call("inc", split, x.output)), second.submit(flow_call("double", whole_b, 7))]
        )
        second.end_run(split)
        second.end_run(whole_b)
        clock_b.advance(3_000.0)
    finally:
        second.close()
    assert sorted(r.run_id for r in settled) == sorted([whole_a, split, whole_b])  # each run published once
    assert {rid: len(v) for rid, v in client.sent().items()} == dict.fromkeys([whole_a, split, whole_b], 2)
    with CostStore(url) as store:
        rows = {r.key: r for r in store.costs("run")}
    idle_line = rows.pop(IDLE_KEY)
    # The runs and the idle line are the two instances' whole bill: nothing counted twice.
    bill = _whole_bill(first)[0] + _whole_bill(second)[0]
    assert math.isclose(sum(r.cost for r in rows.values()) + idle_line.cost, bill, rel_tol=1e-9)
    cli = CliRunner().invoke(app, ["costs", "--url", url, "--by", "run", "--format", "json"])
    assert cli.exit_code == 0, cli.output
    shown = {r["key"]: r["cost"] for r in json.loads(cli.stdout)["rows"]}
    sent = client.sent()
    for rec in settled:
        row = rows[rec.run_id]
        cost = rec.cost()
        assert cost.total == pytest.approx(row.cost, rel=1e-9) == shown[rec.run_id], rec.run_id
        assert (cost.busy, cost.idle) == (pytest.approx(row.busy_cost, rel=1e-9), pytest.approx(row.idle_cost))
        table, summary = sent[rec.run_id]["table"], sent[rec.run_id]["markdown"]
        assert (table[-1]["cost $"], table[-1]["busy $"], table[-1]["idle $"]) == (
            money_text(row.cost),
            money_text(row.busy_cost),
            money_text(row.idle_cost),
        )
        assert f"**Cost**: ${money_text(row.cost)} (busy ${money_text(row.busy_cost)}" in summary
        assert client.tags[rec.run_id][0] == f"esg:${money_text(row.cost)}"
    assert [len(r.earlier) for r in settled] == [int(r.run_id == split) for r in settled]  # whole runs: as before
    rec = next(r for r in settled if r.run_id == split)
    assert rec.cost().busy > 0 and rec.earlier[0].cost().total > 0 and rec.earlier[0].caused_idles
    earlier, later = sent[split]["table"][:2]  # the earlier instance's call first, marked; then this one's
    assert (
        earlier["stage"] == "double"
        and earlier["batch"].endswith(f" {EARLIER}")
        and earlier["worker"].endswith(f" {EARLIER}")
    )
    assert later["stage"] == "inc" and EARLIER not in later["batch"]
    assert (
        "1 stage call of this run was served by another pool instance (read from the cost store)"
        in sent[split]["markdown"]
    )
    twice = dataclasses.replace(rec, earlier=rec.earlier * 2)  # two parts' calls: the plural reads right too
    assert "2 stage calls of this run were served by another pool instance" in run_views.run_summary(twice)


def test_a_run_split_by_a_restart_starts_at_its_first_arrival(
    tmp_path: Path, published: tuple[list[RunRecords], FakeClient]
) -> None:
    """The run's SLO clock starts on the first instance: the artifacts, the tag, the store and the CLI agree.

    The second instance's own records start the run at its first call there; the
    run's row and publication take the earliest arrival the store holds, with the
    latency, SLO outcome and UTC day that follow from it.
    """
    settled, client = published
    url = f"sqlite:///{tmp_path / 'costs.db'}"
    split, whole = (str(uuid.uuid4()) for _ in range(2))
    midnight = 1_700_006_400_000.0  # 2023-11-15 00:00 UTC: the first part is the day before
    clock_a = ManualClock(midnight - 5_000.0)
    first = _service_pool(clock_a, PriceSheet(1e-5, {"T4": 1e-4}), url)
    try:
        x, = _results(clock_a, [first.submit(flow_call("double", split, 1))])  # fmt: skip
        clock_a.advance(1_000.0)  # longer than the run's SLO (TOY: 800 ms) before the restart
    finally:
        first.close()
    assert settled == []
    clock_b = ManualClock(clock_a.t + 30_000.0)
    second = _service_pool(clock_b, PriceSheet(2e-5, {"T4": 3e-4}), url)
    try:
        _results(
            clock_b, [second.submit(flow_call("inc", split, x.output)), second.submit(flow_call("double", whole, 7))]
        )
        second.end_run(split)
        second.end_run(whole)
        clock_b.advance(1_000.0)
    finally:
        second.close()
    rec = {r.run_id: r for r in settled}
    assert rec[split].arrival_ms == midnight - 5_000.0 and rec[split].finish_ms is not None
    latency = rec[split].finish_ms - rec[split].arrival_ms
    assert latency > 30_000.0 > rec[split].slo_ms
    with CostStore(url) as store, Session(store.engine) as s:
        rows = {r.run_id: r for r in s.execute(select(RunRow)).scalars()}
    assert (rows[split].arrival_ms, rows[split].finish_ms) == (rec[split].arrival_ms, rec[split].finish_ms)
    assert (rows[split].slo_met, rows[split].day) == (False, "2023-11-14")
    assert f"**SLO missed** by {latency - 800:.1f} ms: {latency:.1f} ms end to end" in client.sent()[split]["markdown"]
    assert client.tags[split][1] == "esg:slo-missed"
    # A run the second instance served whole starts there, as before.
    assert rows[whole].arrival_ms == rec[whole].arrival_ms >= clock_a.t + 30_000.0
    assert (rows[whole].slo_met, rows[whole].day, client.tags[whole][1]) == (True, "2023-11-15", "esg:slo-met")
    cli = CliRunner().invoke(app, ["costs", "--url", url, "--by", "run", "--format", "json"])
    assert cli.exit_code == 0, cli.output
    shown = {r["key"]: (r["slo_met"], r["slo_missed"]) for r in json.loads(cli.stdout)["rows"]}
    assert (shown[split], shown[whole]) == ((0, 1), (1, 0))
    cli = CliRunner().invoke(app, ["costs", "--url", url, "--by", "day", "--format", "json"])
    assert cli.exit_code == 0, cli.output
    days = {r["key"]: (r["runs"], r["slo_missed"]) for r in json.loads(cli.stdout)["rows"]}
    assert days["2023-11-14"] == (1, 1) and days["2023-11-15"] == (1, 0)


# ---- the read behind the parts: bounded to the run's neighbourhood, same figure ----------------------------------

T0 = 1_700_000_000_000.0
_CFG = Config(1, 1, 0.5)


def _batch(bid: str, worker: str, run: str, start: float, end: float) -> BatchRecord:
    return BatchRecord(bid, worker, (BatchItem(f"{bid}-req", run),), _CFG, "T4", T0 + start, T0 + end)


def _idle(worker: str, start: float, end: float) -> IdleRecord:
    return IdleRecord(worker, 1, 0.5, "T4", T0 + start, T0 + end)


def _worker_history(worker: str, tag: str, run: str, run_at: Sequence[int], n: int) -> list[BatchRecord]:
    """``n`` back-to-back 10 ms batches on ``worker`` (5 ms apart), those at ``run_at`` the run's, others another's."""
    return [
        _batch(f"{tag}{k}", worker, run if k in run_at else "other", 100.0 + 15.0 * k, 110.0 + 15.0 * k)
        for k in range(n)
    ]


def _gaps(batches: Sequence[BatchRecord]) -> list[IdleRecord]:
    """The idle interval between each batch of one worker and the next (by end)."""
    ordered = sorted(batches, key=lambda b: b.end_ms)
    return [
        IdleRecord(a.worker_id, 1, 0.5, "T4", a.end_ms, b.start_ms)
        for a, b in itertools.pairwise(ordered)
        if b.start_ms > a.end_ms
    ]


def test_earlier_parts_read_only_the_run_s_neighbourhood_with_the_store_s_figure(store_url: str) -> None:
    """The parts' caused idle time is decided among the batches around the run's, not each worker's history.

    Each earlier worker has hundreds of other batches and idle intervals before and
    after the run's. The parts equal the store's own figure for the run (every batch
    and interval of the store attributed) and the idle intervals a full read gives
    the run's batches; far fewer rows are read. Covered: a lead (pre-warm) interval
    owned by the run's first batch of a worker (w2) and one owned by another run's
    batch before the run's (w1, w3: the one batch read before the window); a batch
    of another run ending with the run's (the interval after goes to it); a second
    earlier scope with its own prices and options. On SQLite and PostgreSQL.
    """
    run, n = "R", 400
    a1_w1 = _worker_history("w1", "x", run, (150, 151, 300), n)
    a1_w1.append(_batch("tie", "w1", "other", 100.0 + 15.0 * 151 + 4.0, 110.0 + 15.0 * 151))  # ends with R's
    a1_w2 = _worker_history("w2", "y", run, (0,), n)
    a1_w3 = _worker_history("w3", "z", run, (n - 1,), n)
    a2_w1 = _worker_history("w1", "v", run, (7,), 50)
    lead = [_idle("w1", 0.0, 100.0), _idle("w2", 0.0, 100.0), _idle("w3", 20.0, 100.0)]
    trailing = [_idle("w1", 1e6, 1e6 + 500.0), _idle("w3", 1e6, 1e6 + 500.0)]  # after each worker's last batch
    a1_idles = lead + _gaps(a1_w1) + _gaps(a1_w2) + _gaps(a1_w3) + trailing
    a2_idles = [_idle("w1", 0.0, 100.0), *_gaps(a2_w1)]
    scopes = {
        "a1": (a1_w1 + a1_w2 + a1_w3, a1_idles, PriceSheet(1e-5, {"T4": 1e-4}), Billing("equal", "attribute")),
        "a2": (a2_w1, a2_idles, PriceSheet(2e-5, {"T4": 3e-4}), Billing("input_size", "attribute")),
    }
    with CostStore(store_url) as store:
        for sc, (batches, idles, prices, billing) in scopes.items():
            for rid in (run, "other"):
                mine = tuple(b for b in batches if b.items[0].run_id == rid)
                rec = RunRecords(rid, "toy", (), mine, T0, T0 + 1e5, 800.0, prices, billing.cost_split,
                                 new_idles=tuple(idles) if rid == run else ())  # fmt: skip
                store.record(rec, scope=sc, billing=billing)
        loaded: list[object] = []

        def on_load(target: object, _context: object) -> None:
            loaded.append(target)

        for model in (BatchRow, IdleRow):
            event.listen(model, "load", on_load)
        try:
            mine_now = RunRecords(run, "toy", (), (), T0 + 2e6, T0 + 2e6 + 10.0, 800.0, PriceSheet(1e-5, {}), "equal")
            parts = earlier_parts(store, mine_now, "b")
        finally:
            for model in (BatchRow, IdleRow):
                event.remove(model, "load", on_load)
        store_cost = {r.key: r for r in store.costs("run")}[run]
        with Session(store.engine) as s:
            all_batches = list(s.execute(select(BatchRow).order_by(BatchRow.start_ms, BatchRow.batch_id)).scalars())
            all_idles = list(s.execute(select(IdleRow).order_by(IdleRow.start_ms, IdleRow.idle_id)).scalars())
            items = Q.items_of(s, [b.batch_id for b in all_batches])
    assert [len(p.batches) for p in parts] == [5, 1]  # a1 (earliest first), then a2
    got = sum(p.cost().total for p in parts)
    assert got == pytest.approx(store_cost.cost, rel=1e-12) and store_cost.idle_cost > 0
    assert sum(p.cost().idle for p in parts) == pytest.approx(store_cost.idle_cost, rel=1e-12)
    # The intervals a full read of every batch and interval gives the run's batches.
    records = [R.batch_record(b, items[b.batch_id]) for b in all_batches]
    full = {
        (i.worker_id, i.start_ms)
        for i, owner in idle_owners(records, [R.idle_record(i) for i in all_idles])
        if owner is not None and owner.items[0].run_id == run
    }
    assert {(i.worker_id, i.start_ms) for p in parts for i in p.caused_idles} == full
    assert ("a1:w2", T0) in full and ("a1:w1", T0) not in full and ("a1:w3", T0 + 20.0) not in full
    assert ("a1:w3", T0 + 1e6) in full and ("a1:w1", T0 + 1e6) not in full  # w3's last batch is the run's
    # Bounded: a few rows around the run's batches, not the 1250 batches and as many intervals stored.
    assert len(all_batches) > 1200 and len(all_idles) > 1200 and len(loaded) < 30, len(loaded)


def test_a_bad_stored_option_of_an_earlier_pool_is_named(store_url: str) -> None:
    """An earlier pool's options are read as the store reads them: a bad stored value names its pool."""
    prices = PriceSheet(1e-5, {"T4": 1e-4})
    with CostStore(store_url) as store:
        rec = RunRecords("R", "toy", (), (_batch("b1", "w1", "R", 0.0, 10.0),), T0, T0 + 10.0, 800.0, prices, "equal")
        store.record(rec, scope="a1", billing=Billing())
        with store.engine.begin() as conn:
            conn.execute(update(PoolRow).where(PoolRow.scope == "a1").values(cost_split="bogus"))
        later = RunRecords("R", "toy", (), (), T0 + 1e3, T0 + 2e3, 800.0, prices, "equal")
        with pytest.raises(ConfigError, match=r"^pool 'a1' in the cost store: cost_split must be .*'bogus'$") as exc:
            earlier_parts(store, later, "b")
        with pytest.raises(ConfigError) as by_store:
            store.costs("run")
        assert str(exc.value) == str(by_store.value)


def test_a_run_whose_last_call_ran_before_a_restart_is_published_at_its_end(
    tmp_path: Path, published: tuple[list[RunRecords], FakeClient]
) -> None:
    """All of a run's calls ran on the first instance; its end reaches the second: published there, once.

    The second instance holds no call of the run. It finds the run's parts in the
    store and publishes them as it publishes a run spanning the restart: the figure
    is the store's, the run's row gets its finish and SLO outcome. An end of a run
    no instance served, and the run's end posted again, publish nothing.
    """
    settled, client = published
    url = f"sqlite:///{tmp_path / 'costs.db'}"
    done_early, whole_b, unseen = (str(uuid.uuid4()) for _ in range(3))
    clock_a = ManualClock()
    first = _service_pool(clock_a, PriceSheet(1e-5, {"T4": 1e-4}), url)
    try:
        (x,) = _results(clock_a, [first.submit(flow_call("double", done_early, 1))])
        _results(clock_a, [first.submit(flow_call("inc", done_early, x.output))])
        clock_a.advance(2_000.0)  # its worker idles warm: part of its cost
    finally:
        first.close()
    assert settled == []  # it had not ended
    with CostStore(url) as store, Session(store.engine) as s:
        provisional = s.get(RunRow, done_early)
        assert provisional is not None and (provisional.finish_ms, provisional.slo_met) == (None, False)
        started = provisional.arrival_ms
    clock_b = ManualClock(clock_a.t + 30_000.0)
    second = _service_pool(clock_b, PriceSheet(2e-5, {"T4": 3e-4}), url)
    try:
        _results(clock_b, [second.submit(flow_call("double", whole_b, 7))])
        for run in (done_early, unseen, whole_b, done_early):  # the run's end posted twice
            second.end_run(run)
        clock_b.advance(1_000.0)
    finally:
        second.close()
    assert sorted(r.run_id for r in settled) == sorted([done_early, whole_b])
    sent = client.sent()
    assert sorted(sent) == sorted([done_early, whole_b]) and all(len(v) == 2 for v in sent.values())
    rec = next(r for r in settled if r.run_id == done_early)
    assert rec.calls == () and rec.batches == () and len(rec.earlier) == 1 and rec.settled
    assert rec.arrival_ms == started and rec.finish_ms is not None and started < rec.finish_ms <= clock_a.t - 2_000.0
    with CostStore(url) as store, Session(store.engine) as s:
        row = s.get(RunRow, done_early)
        costs = {r.key: r for r in store.costs("run")}
        assert s.get(RunRow, unseen) is None
    assert row is not None and (row.arrival_ms, row.finish_ms) == (rec.arrival_ms, rec.finish_ms)
    assert row.slo_met and row.finish_ms - row.arrival_ms <= 800.0 and row.workflow == "toy"
    cost = rec.cost()
    assert cost.total == pytest.approx(costs[done_early].cost, rel=1e-9) and cost.idle > 0
    assert (cost.busy, cost.idle) == (
        pytest.approx(costs[done_early].busy_cost, rel=1e-9),
        pytest.approx(costs[done_early].idle_cost, rel=1e-9),
    )
    idle_line = costs.pop(IDLE_KEY)
    bill = _whole_bill(first)[0] + _whole_bill(second)[0]
    assert math.isclose(sum(r.cost for r in costs.values()) + idle_line.cost, bill, rel_tol=1e-9)
    table, summary = sent[done_early]["table"], sent[done_early]["markdown"]
    assert [r["stage"] for r in table[:-1]] == ["double", "inc"] and all(EARLIER in r["batch"] for r in table[:-1])
    assert table[-1]["cost $"] == money_text(costs[done_early].cost)
    assert "2 stage calls of this run were served by another pool instance" in summary
    assert "**SLO met**" in summary
    assert client.tags[done_early] == [f"esg:${money_text(costs[done_early].cost)}", "esg:slo-met"]
    cli = CliRunner().invoke(app, ["costs", "--url", url, "--by", "run", "--format", "json"])
    assert cli.exit_code == 0, cli.output
    shown = {r["key"]: r for r in json.loads(cli.stdout)["rows"]}
    assert shown[done_early]["cost"] == costs[done_early].cost and shown[done_early]["slo_met"] == 1


def test_ended_elsewhere_finds_only_runs_other_pools_served_and_not_yet_ended(store_url: str) -> None:
    """The lookup behind an end the pool holds nothing of: one indexed read for a run the store never saw.

    A run whose end was written (with a finish, or with none: a call failed), or with
    batches of the looking pool (it served the run and ended it itself), is not found either.
    """
    prices = PriceSheet(1e-5, {"T4": 1e-4})
    runs = (("early", "a1"), ("both", "a1"), ("both", "b"), ("ended", "a1"), ("failed", "a1"))
    with CostStore(store_url) as store:
        for run, scope in runs:
            bid = f"{run}-{scope}"
            rec = RunRecords(run, "toy", (), (_batch(bid, "w1", run, 0.0, 10.0),), T0, None, 800.0, prices, "equal")
            store.record(rec, scope=scope, billing=Billing())
        with store.engine.begin() as conn:  # provisional rows, as record_batches writes them before a run's end
            conn.execute(update(RunRow).where(col(RunRow.run_id).in_(["early", "both"])).values(ended=False))
            conn.execute(update(RunRow).where(RunRow.run_id == "ended").values(finish_ms=T0 + 10.0))
        statements: list[str] = []

        def count(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
            if statement.lstrip().upper().startswith("SELECT"):  # not the BEGIN SQLite's engine sends
                statements.append(statement)

        event.listen(store.engine, "before_cursor_execute", count)
        try:
            assert ended_elsewhere(store, "nobody", "b", prices, "equal", "attribute") is None
            assert len(statements) == 1 and "WHERE runs.run_id" in statements[0], statements
            assert ended_elsewhere(store, "ended", "b", prices, "equal", "attribute") is None
            assert ended_elsewhere(store, "failed", "b", prices, "equal", "attribute") is None  # ended, no finish
            assert ended_elsewhere(store, "both", "b", prices, "equal", "attribute") is None
            found = ended_elsewhere(store, "early", "b", prices, "equal", "attribute")
        finally:
            event.remove(store.engine, "before_cursor_execute", count)
    assert found is not None and found.settled and found.calls == () and found.batches == ()
    assert [p.batches[0].batch_id for p in found.earlier] == ["a1:early-a1"]
    assert (found.workflow, found.slo_ms, found.arrival_ms) == ("toy", 800.0, T0)


def test_a_run_whose_calls_only_queued_before_a_restart_starts_at_its_first_arrival(
    tmp_path: Path, published: tuple[list[RunRecords], FakeClient]
) -> None:
    """The first instance stored no batch of the run (its call still queued when it stopped): its start survives.

    The calls carry no arrival of their own (a flow's carry its start, and both
    instances see that one): the run started when its first call reached the
    first instance. That instance keeps the start under a provisional row when it
    closes; the second publishes and stores the run from there, SLO missed.
    """
    settled, client = published
    url = f"sqlite:///{tmp_path / 'costs.db'}"
    run = str(uuid.uuid4())
    clock_a = ManualClock()
    first = _service_pool(clock_a, PriceSheet(1e-5, {"T4": 1e-4}), url)
    started = clock_a.t
    try:
        first.pause()  # the call queues and never runs here
        queued = first.submit(flow_call("double", run, 1))
        # Queued: the snapshot is taken on the pool's loop after the call's admission (FIFO), not before.
        assert first.snapshot().queue_depths == {"toy/double": 1}
        clock_a.advance(500.0)
    finally:
        first.close()
    assert isinstance(queued.exception(10.0), PoolClosedError) and settled == []
    with CostStore(url) as store, Session(store.engine) as s:
        provisional = s.get(RunRow, run)
        assert provisional is not None and (provisional.arrival_ms, provisional.finish_ms) == (started, None)
        assert s.execute(select(BatchRow)).first() is None  # no batch: only the start was kept
    clock_b = ManualClock(clock_a.t + 30_000.0)
    second = _service_pool(clock_b, PriceSheet(2e-5, {"T4": 3e-4}), url)
    try:
        (x,) = _results(clock_b, [second.submit(flow_call("double", run, 1))])  # the client posts it again
        _results(clock_b, [second.submit(flow_call("inc", run, x.output))])
        second.end_run(run)
        clock_b.advance(1_000.0)
    finally:
        second.close()
    (rec,) = settled
    assert rec.arrival_ms == started and rec.earlier == () and rec.finish_ms is not None
    latency = rec.finish_ms - started
    assert latency > 30_000.0
    with CostStore(url) as store, Session(store.engine) as s:
        row = s.get(RunRow, run)
    assert row is not None and (row.arrival_ms, row.finish_ms, row.slo_met) == (started, rec.finish_ms, False)
    assert f"**SLO missed** by {latency - 800:.1f} ms" in client.sent()[run]["markdown"]
    assert client.tags[run][1] == "esg:slo-missed"


def test_open_runs_keep_their_earliest_start(store_url: str) -> None:
    """A closing pool's open runs: a new run gets a provisional row, a later provisional start is lowered.

    A finished row keeps its start (its SLO outcome was decided from it).
    """
    prices = PriceSheet(1e-5, {"T4": 1e-4})
    day = 86_400_000.0
    with CostStore(store_url) as store:
        for run, finish in (("later", None), ("ended", T0 + day + 10.0)):
            rec = RunRecords(run, "toy", (), (_batch(run, "w1", run, day, day + 10.0),), T0 + day, finish, 800.0,
                             prices, "equal")  # fmt: skip
            store.record(rec, scope="a1", billing=Billing())
        with store.engine.begin() as conn:  # provisional, as record_batches writes it before the run's end
            conn.execute(update(RunRow).where(RunRow.run_id == "later").values(ended=False))
        stubs = [RunStub(r, "toy", T0, 800.0, "a name") for r in ("later", "ended", "new")]
        store.record_open_runs(stubs, scope="a2", billing=Billing(), deployments={"new": "nightly"})
        with Session(store.engine) as s:
            rows = {r.run_id: r for r in s.execute(select(RunRow)).scalars()}
        listed = {r.key: r for r in store.costs("run")}
    assert (listed["new"].cost, listed["new"].slo_missed) == (0.0, 1)  # a run that never came back: listed
    assert {k: (r.arrival_ms, r.day, r.finish_ms) for k, r in rows.items()} == {
        "later": (T0, R.utc_day(T0), None),
        "ended": (T0 + day, R.utc_day(T0 + day), T0 + day + 10.0),
        "new": (T0, R.utc_day(T0), None),
    }
    assert (rows["new"].deployment, rows["new"].run_name, rows["new"].slo_met) == ("nightly", "a name", False)
