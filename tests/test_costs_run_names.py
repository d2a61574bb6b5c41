"""``esg-prefect costs --by run`` names runs as the Prefect UI does: the store keeps each flow run's name."""

from __future__ import annotations

import csv
import dataclasses
import io
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from esg_prefect.cli import app
from esg_prefect.cli.costs import RUN_NAMES_LINE, run_label
from esg_prefect.integration import recording
from esg_prefect.store import CostStore
from esg_prefect.store.attach import StoreAttachment
from esg_prefect.store.tables import RunRow
from tests.cost_records import RUN_A, RUN_B, RUN_C, all_records, records_a, records_b, records_c


def _store(tmp_path: Path) -> str:
    path = tmp_path / "names.db"
    with CostStore(str(path)) as store:
        for rec in all_records():
            store.record(rec, name="crimson-fox" if rec.run_id == RUN_A else None)
        store.record(records_a(), name=None)  # recorded again without it: the name stays
    return str(path)


def test_the_store_keeps_a_runs_name_and_groups_by_run_with_it(tmp_path: Path) -> None:
    with CostStore(_store(tmp_path)) as store:
        rows = {r.key: r.name for r in store.costs("run") if not r.idle}
        assert rows == {RUN_A: "crimson-fox", RUN_B: None, RUN_C: None}
        assert all(r.name is None for r in store.costs("workflow"))  # a group of runs has no one name


def test_the_table_shows_the_name_and_the_end_of_the_id_and_csv_the_whole_id(tmp_path: Path) -> None:
    url = _store(tmp_path)
    table = CliRunner().invoke(app, ["costs", "--url", url])
    assert table.exit_code == 0, table.output
    first = [line.split("│")[1].strip() for line in table.output.splitlines() if line.startswith("│")]
    assert first[:3] == [f"crimson-fox ({RUN_A[-8:]})", RUN_B, RUN_C]  # without a name: the id, whole
    assert " ".join(RUN_NAMES_LINE.split()) in " ".join(table.output.split())
    assert run_label(RUN_B, None) == RUN_B and run_label(RUN_A, "x") == f"x ({RUN_A[-8:]})"
    as_csv = CliRunner().invoke(app, ["costs", "--url", url, "--format", "csv"])
    rows = list(csv.DictReader(io.StringIO(as_csv.output)))
    assert [(r["key"], r["name"]) for r in rows[:3]] == [(RUN_A, "crimson-fox"), (RUN_B, ""), (RUN_C, "")]
    by_workflow = CliRunner().invoke(app, ["costs", "--url", url, "--by", "workflow"])
    assert by_workflow.exit_code == 0 and "flow run name" not in by_workflow.output


@pytest.fixture
def own_stores(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process's stores, none for this test and closed after it."""
    monkeypatch.setattr(recording, "_stores", {})
    yield
    recording.close_stores()


def test_the_store_takes_the_name_the_runs_calls_carried(tmp_path: Path) -> None:
    """From the run's records; a lookup only for a run whose calls said none, and one that fails keeps the run."""

    def failing(run: str) -> str | None:
        raise RuntimeError("no API")

    with CostStore(str(tmp_path / "attach.db")) as store:
        pool = SimpleNamespace(prices=records_a().prices)
        StoreAttachment(pool, store, name_of=failing)(dataclasses.replace(records_a(), run_name="crimson-fox"))  # type: ignore[arg-type]
        StoreAttachment(pool, store, name_of=lambda run: "from-lookup")(records_b())  # type: ignore[arg-type]
        StoreAttachment(pool, store, name_of=failing)(records_c())  # type: ignore[arg-type]
        with store.engine.connect() as conn:
            names = conn.execute(select(RunRow.run_id, RunRow.run_name)).all()  # type: ignore[call-overload]
    assert sorted(tuple(n) for n in names) == sorted([(RUN_A, "crimson-fox"), (RUN_B, "from-lookup"), (RUN_C, None)])


def test_a_pool_hands_each_run_the_name_its_calls_carried_and_keeps_none_after(own_stores: None) -> None:
    """The in-process path: the name goes with the calls to the run's own pool, nowhere process-wide."""
    from esg_prefect.control.calls import StageCall, WorkflowDecl
    from esg_prefect.control.records import RunRecords
    from esg_prefect.model import PriceSheet
    from esg_prefect.runtime.pool import Pool
    from esg_prefect.runtime.workers import InlineBackend
    from tests.toy_stages import toy_profile

    got: list[RunRecords] = []
    pool = Pool(toy_profile(), PriceSheet(1e-5, {}), backend=InlineBackend())
    pool.add_run_listener(got.append)
    toy = WorkflowDecl("toy", 800)
    try:
        for i, (run, name) in enumerate(((RUN_A, "crimson-fox"), (RUN_B, ""))):
            call = StageCall(f"c{i}", "inc", "tests.toy_stages:inc", toy, run, run, i, run_name=name)
            assert pool.submit(call).result(60).output == i + 1
            pool.end_run(run)
    finally:
        pool.close()  # hands the ended runs to the listener and waits for it
    assert {r.run_id: r.run_name for r in got} == {RUN_A: "crimson-fox", RUN_B: None}
    assert pool._book._name_of_run == {}  # forgotten with the runs' other records


def test_a_run_name_is_shown_as_written_never_read_as_markup(tmp_path: Path) -> None:
    """Run names are a user's text (``flow_run_name=`` templates): ``[/]`` crashed the table, ``[prod]`` vanished."""
    path = tmp_path / "markup.db"
    with CostStore(str(path)) as store:
        for rec in all_records():
            name = {RUN_A: "etl [/] retry", RUN_B: "[prod] nightly"}.get(rec.run_id)
            store.record(rec, name=name)
    table = CliRunner().invoke(app, ["costs", "--url", str(path)])
    assert table.exit_code == 0, table.output
    first = [line.split("│")[1].strip() for line in table.output.splitlines() if line.startswith("│")]
    assert first[:2] == [f"etl [/] retry ({RUN_A[-8:]})", f"[prod] nightly ({RUN_B[-8:]})"]


def test_a_run_through_the_pool_service_is_stored_with_its_name(tmp_path: Path, own_stores: None) -> None:
    """Its calls carried no name over the wire: the service's store listed it by id alone. An older
    client's calls (no ``run_name``) are still served, their run stored without a name."""
    from starlette.testclient import TestClient

    from esg_prefect.control.calls import StageCall, WorkflowDecl
    from esg_prefect.model import PriceSheet
    from esg_prefect.runtime.pool import Pool
    from esg_prefect.runtime.workers import InlineBackend
    from esg_prefect.service.app import PoolService
    from esg_prefect.service.wire import call_body
    from tests.toy_stages import toy_profile

    url = f"sqlite:///{tmp_path / 'service.db'}"
    pool = Pool(toy_profile(), PriceSheet(1e-5, {}), backend=InlineBackend())
    try:
        recording.attach_recorders(pool, artifacts=False, store=url)  # as `esg-prefect pool serve` does
        toy = WorkflowDecl("toy", 800)
        named = {
            **call_body(StageCall("c1", "inc", "tests.toy_stages:inc", toy, RUN_A, RUN_A, 1)),
            "run_name": "crimson-fox",
        }
        older = call_body(StageCall("c2", "inc", "tests.toy_stages:inc", toy, RUN_B, RUN_B, 2))
        older.pop("run_name", None)
        token = "a-token-of-24-characters"
        service = PoolService(pool, ["tests"], token)
        with TestClient(
            service.app(), headers={"Authorization": f"Bearer {token}"}
        ) as http:  # entered: lifespan and background tasks run
            for body in (named, older):
                answer = http.post("/v1/calls", json=body)
                assert answer.status_code == 200, answer.text
            for run in (RUN_A, RUN_B):
                assert http.post(f"/v1/runs/{run}/end").is_success
    finally:
        pool.close()  # hands the ended runs to the store's listener and waits for it
    with CostStore(url) as store:
        assert {r.key: r.name for r in store.costs("run") if not r.idle} == {RUN_A: "crimson-fox", RUN_B: None}


def test_a_long_run_name_is_cut_where_the_call_is_made_and_the_cut_shows(tmp_path: Path, own_stores: None) -> None:
    """A name over 200 characters was cut silently by the pool service (and not at all in process): the
    costs table showed a part as if it were the whole name. The client now keeps 199 and ends it in "…"."""
    from esg_prefect.control.calls import StageCall, WorkflowDecl
    from esg_prefect.integration.stage import _run_name
    from esg_prefect.model import PriceSheet
    from esg_prefect.runtime.pool import Pool
    from esg_prefect.runtime.workers import InlineBackend
    from esg_prefect.service.app import parse_call
    from esg_prefect.service.wire import MAX_RUN_NAME, call_body
    from tests.toy_stages import toy_profile

    def named(name: str) -> str:
        return _run_name(SimpleNamespace(flow_run=SimpleNamespace(name=name)))

    long = "nightly-" + "x" * 300
    assert named(long) == long[: MAX_RUN_NAME - 1] + "…" and len(named(long)) == MAX_RUN_NAME
    assert named("y" * MAX_RUN_NAME) == "y" * MAX_RUN_NAME  # one that fits is kept whole
    assert named("crimson-fox") == "crimson-fox" and _run_name(None) == ""
    toy = WorkflowDecl("toy", 800)
    call = StageCall("c1", "inc", "tests.toy_stages:inc", toy, RUN_A, RUN_A, 1, run_name=named(long))
    assert parse_call(call_body(call), ["tests"]).run_name == named(long)  # the service keeps it as cut
    url = f"sqlite:///{tmp_path / 'long.db'}"
    pool = Pool(toy_profile(), PriceSheet(1e-5, {}), backend=InlineBackend())
    try:
        recording.attach_recorders(pool, artifacts=False, store=url)
        assert pool.submit(call).result(60).output == 2
        pool.end_run(RUN_A)
    finally:
        pool.close()  # hands the ended run to the store's listener and waits for it
    as_csv = CliRunner().invoke(app, ["costs", "--url", url, "--by", "run", "--format", "csv"])
    assert as_csv.exit_code == 0, as_csv.output
    names = {r["key"]: r["name"] for r in csv.DictReader(io.StringIO(as_csv.output))}
    assert names[RUN_A] == "nightly-" + "x" * (MAX_RUN_NAME - 9) + "…"
