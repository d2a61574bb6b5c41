"""``esg-prefect costs`` on a store holding the worked example: table, CSV and JSON, options, errors."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
from pathlib import Path

import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine
from typer.testing import CliRunner

from esg_prefect.cli import app
from esg_prefect.cli.costs import parse_since
from esg_prefect.exceptions import InvalidInputError
from esg_prefect.model.pricing import PriceSheet
from esg_prefect.store import IDLE_KEY, CostStore
from esg_prefect.store.billing import Billing
from tests.cost_records import (
    EXPECTED_IDLE_LINE,
    EXPECTED_PER_RUN,
    EXPECTED_TOTAL,
    RUN_A,
    RUN_B,
    RUN_C,
    T0,
    all_records,
)

runner = CliRunner()
HEADER = [
    "group_by", "key", "runs", "stage_calls", "slo_met", "slo_missed", "cost", "idle", "busy_cost", "idle_cost", "unit",
    "name",
]  # fmt: skip


@pytest.fixture
def store_path(tmp_path: Path) -> str:
    path = tmp_path / "costs.db"
    with CostStore(str(path)) as store:
        for rec in all_records():
            store.record(rec, deployment="nightly" if rec.run_id != RUN_B else None)
    return str(path)


def invoke(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["costs", *args])
    return result.exit_code, result.output


def test_csv_by_run(store_path: str) -> None:
    code, out = invoke("--url", store_path, "--format", "csv")
    assert code == 0, out
    rows = list(csv.reader(io.StringIO(out)))
    assert rows[0] == HEADER
    assert [[*r[:6], r[7]] for r in rows[1:]] == [
        ["run", RUN_A, "1", "2", "1", "0", "False"],
        ["run", RUN_B, "1", "1", "0", "1", "False"],
        ["run", RUN_C, "1", "2", "0", "1", "False"],
        ["run", IDLE_KEY, "0", "0", "0", "0", "True"],
    ]
    costs = [float(r[6]) for r in rows[1:]]
    expected = [EXPECTED_PER_RUN[RUN_A], EXPECTED_PER_RUN[RUN_B], EXPECTED_PER_RUN[RUN_C], EXPECTED_IDLE_LINE]
    assert costs == pytest.approx(expected, rel=1e-12)
    # busy/idle split and unit: A = 0.9 + 1.45, B = 0.5 + 1.25, C = 0.05 + 0, the idle line (w4) all idle
    split = [(float(r[8]), float(r[9]), r[10]) for r in rows[1:]]
    assert split == [
        (pytest.approx(0.9), pytest.approx(1.45), "$"),
        (pytest.approx(0.5), pytest.approx(1.25), "$"),
        (pytest.approx(0.05), 0.0, "$"),
        (0.0, pytest.approx(1.1), "$"),
    ]


def test_json_by_workflow(store_path: str) -> None:
    code, out = invoke("--url", store_path, "--by", "workflow", "--format", "json")
    assert code == 0, out
    doc = json.loads(out)
    assert doc["group_by"] == "workflow"
    assert [(r["key"], r["runs"], r["slo_met"], r["slo_missed"], r["idle"]) for r in doc["rows"]] == [
        ("img", 2, 1, 1, False),
        ("txt", 1, 0, 1, False),
        (IDLE_KEY, 0, 0, 0, True),
    ]
    img = EXPECTED_PER_RUN[RUN_A] + EXPECTED_PER_RUN[RUN_B]
    assert [r["cost"] for r in doc["rows"]] == pytest.approx([img, EXPECTED_PER_RUN[RUN_C], EXPECTED_IDLE_LINE])
    assert doc["total"] == pytest.approx(EXPECTED_TOTAL, rel=1e-12)
    assert doc["total_split"] == {"busy": pytest.approx(1.45), "idle": pytest.approx(3.8)}
    assert doc["unit"] == "$"
    assert set(doc["rows"][0]) == set(HEADER)


def test_table_by_deployment_is_the_default_format(store_path: str) -> None:
    code, out = invoke("--url", store_path, "--by", "deployment")
    assert code == 0, out
    assert "ESG costs by deployment" in out
    lines = [line.replace("┃", "│") for line in out.splitlines() if "│" in line or "┃" in line]
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in lines]
    assert cells[0] == [
        "deployment", "runs", "stage calls", "SLO met", "SLO missed", "busy incl. cold $", "idle $", "cost $"
    ]  # fmt: skip
    assert cells[1:] == [
        ["(no deployment)", "1", "1", "0", "1", "0.500", "1.25", "1.75"],
        ["nightly", "2", "4", "1", "1", "0.950", "1.45", "2.40"],
        [IDLE_KEY, "", "", "", "", "0", "1.10", "1.10"],
        ["total", "", "", "", "", "1.45", "3.80", "5.25"],
    ]
    assert f"store: sqlite:///{store_path}" in out


def test_by_day_since_and_split(store_path: str) -> None:
    code, out = invoke("--url", store_path, "--by", "day", "--format", "json", "--since", "2024-05-02")
    assert code == 0, out
    rows = json.loads(out)["rows"]
    assert [(r["key"], r["runs"]) for r in rows] == [("2024-05-02", 1), (IDLE_KEY, 0)]
    assert [r["cost"] for r in rows] == pytest.approx([EXPECTED_PER_RUN[RUN_C], EXPECTED_IDLE_LINE], rel=1e-12)
    result = runner.invoke(
        app, ["costs", "--url", store_path, "--format", "json", "--split", "input_size", "--idle-billing", "separate"]
    )
    assert result.exit_code == 0, result.output
    costs = {r["key"]: r["cost"] for r in json.loads(result.stdout)["rows"]}
    assert costs == pytest.approx(BY_SIZE_SEPARATE, rel=1e-12)


BY_SIZE_SEPARATE = {RUN_A: 0.25 + 0.4, RUN_B: 0.75, RUN_C: 0.05, IDLE_KEY: 2.5 + 0.2 + 1.1}
"""The worked example priced with the input-size split (A 1 : B 3 in b1) and idle time on its own line."""


@pytest.fixture
def billed_store(tmp_path: Path) -> str:
    """The worked example recorded by a pool that priced its runs by input size, idle time on its own line."""
    path = tmp_path / "billed.db"
    with CostStore(str(path)) as store:
        for rec in all_records():
            store.record(rec, scope="p1", billing=Billing("input_size", "separate"))
    return str(path)


def test_the_table_writes_money_as_the_artifacts_do_and_says_it_is_rounded(tmp_path: Path) -> None:
    """One money format (tags, summary, table artifact, here): 3 significant digits, positional from 1e-6; a
    column of the table in one notation, with exponents when any of its values needs one."""
    from esg_prefect.model.money import money_str, money_text

    assert [money_text(v) for v in (1.4712e-05, 1.3188e-05, 1.7583e-05, 4.55805e-05)] == [
        "0.0000147",
        "0.0000132",
        "0.0000176",
        "0.0000456",
    ]  # rounded rows of 0.0000455 and a total of 0.0000456: the table says they are rounded
    assert money_str(4.55805e-05) == "$0.0000456" and money_str(9.012e-07, "€") == "€9.01e-7"
    path = tmp_path / "tiny.db"
    with CostStore(str(path)) as store:
        for rec in all_records():  # the worked example at a millionth of its prices
            store.record(dataclasses.replace(rec, prices=PriceSheet(0.5e-6, {"T4": 4.0e-6})))
    code, out = invoke("--url", str(path), "--by", "workflow")
    assert code == 0, out
    cells = {
        c[0]: c[5:] for c in ([x.strip() for x in line.split("│")[1:-1]] for line in out.splitlines() if "│" in line)
    }
    # A millionth of busy 1.4, idle 2.7; txt's 5.00e-8 is below 1e-6, so its columns (busy, cost) are written
    # with exponents all the way down, the total too; the idle column has nothing below 1e-6: positional.
    assert cells["img"] == ["1.40e-6", "0.00000270", "4.10e-6"]  # was 0.00000140 above 5.00e-8
    assert cells["txt"] == ["5.00e-8", "0", "5.00e-8"]
    assert cells["total"] == ["1.45e-6", "0.00000380", "5.25e-6"]
    assert "Costs in $, rounded to 3 significant digits: rows may not add up to the total exactly" in out
    assert "(--format csv or json: full precision)" in out
    code, out = invoke("--url", str(path), "--by", "workflow", "--format", "json")
    assert json.loads(out)["total"] == pytest.approx(EXPECTED_TOTAL * 1e-6, rel=1e-12)  # full precision


def test_costs_are_priced_as_the_pool_priced_them_by_default(billed_store: str) -> None:
    result = runner.invoke(app, ["costs", "--url", billed_store, "--format", "json"])
    assert result.exit_code == 0 and result.stderr == "", result.output
    doc = json.loads(result.stdout)
    assert {r["key"]: r["cost"] for r in doc["rows"]} == pytest.approx(BY_SIZE_SEPARATE, rel=1e-12)
    assert doc["priced_as"] == [{"cost_split": "input_size", "idle_billing": "separate"}]
    code, out = invoke("--url", billed_store)
    assert code == 0, out
    assert "A run's cost: its share of its batches' busy time; the idle line holds all warm idle time" in out
    assert "Priced as each pool priced its runs (its artifacts show the same): input_size split, idle time on" in out
    assert "note:" not in out
    # an override equal to the pool's own changes nothing and says nothing
    result = runner.invoke(app, ["costs", "--url", billed_store, "--format", "csv", "--split", "input_size"])
    assert result.exit_code == 0 and result.stderr == "", result.output


def test_an_override_that_differs_from_the_pool_says_so_in_one_line(billed_store: str) -> None:
    result = runner.invoke(app, ["costs", "--url", billed_store, "--format", "json", "--idle-billing", "attribute"])
    assert result.exit_code == 0, result.output
    assert result.stderr == (
        "note: --idle-billing attribute overrides the pool's own separate idle billing: "
        "these figures differ from its artifacts\n"
    )
    doc = json.loads(result.stdout)  # stdout stays JSON
    by_size = {RUN_A: 0.25 + 0.4 + 0.625 + 0.2, RUN_B: 0.75 + 1.875, RUN_C: 0.05, IDLE_KEY: 1.1}
    assert {r["key"]: r["cost"] for r in doc["rows"]} == pytest.approx(by_size, rel=1e-12)
    assert doc["priced_as"] == [{"cost_split": "input_size", "idle_billing": "attribute"}]
    result = runner.invoke(app, ["costs", "--url", billed_store, "--split", "equal", "--idle-billing", "attribute"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(
        "note: --split equal --idle-billing attribute override the pool's own input_size split and separate idle "
        "billing: these figures differ from its artifacts\n"
    )
    code, out = invoke("--url", billed_store, "--split", "equal")
    assert code == 0, out
    assert out.startswith("note: --split equal overrides the pool's own input_size split: these figures differ")
    assert "Priced with the options given: equal split, idle time on the idle line." in out


def test_the_rows_and_each_pool_s_options_come_from_one_read_of_the_store(billed_store: str) -> None:
    """No second scan of the batches and idle intervals, nor of the pools, for the pricing lines."""
    seen: list[str] = []

    def read(conn: object, cursor: object, statement: str, *args: object) -> None:
        seen.append(" ".join(statement.split()))

    event.listen(Engine, "before_cursor_execute", read)
    try:
        code, out = invoke("--url", billed_store)
    finally:
        event.remove(Engine, "before_cursor_execute", read)
    assert code == 0, out
    assert "Priced as each pool priced its runs (its artifacts show the same): input_size split" in out
    reads = [s for s in seen if s.upper().startswith("SELECT")]
    scans = {t: sum(bool(re.search(rf"\bFROM {t}\b", s)) for s in reads) for t in ("pools", "batches", "worker_idle")}
    assert scans == {"pools": 1, "batches": 1, "worker_idle": 1}, reads


def test_a_store_whose_pools_stored_no_options_says_what_it_read_them_as(store_path: str) -> None:
    code, out = invoke("--url", store_path)
    assert code == 0, out
    assert (
        "1 pool stored no pricing options (written by an older esg-prefect): its records read as equal split, "
        "idle time to the runs before it; if it priced otherwise, give --split and --idle-billing."
    ) in out
    assert "Priced as each pool priced its runs" not in out  # not known of this one
    # its options are not known: an override changes nothing that is known, and says nothing
    result = runner.invoke(app, ["costs", "--url", store_path, "--format", "json", "--idle-billing", "separate"])
    assert result.exit_code == 0 and result.stderr == "", result.output


def test_store_url_from_the_environment(store_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ESG_PREFECT_STORE_URL", f"sqlite:///{store_path}")
    code, out = invoke("--format", "csv", "--by", "workflow")
    assert code == 0, out
    assert [line.split(",")[1] for line in out.splitlines()[1:]] == ["img", "txt", IDLE_KEY]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--by", "stage"], ("--by", "'stage'", "run, workflow, deployment, day")),
        (["--format", "xml"], ("--format", "'xml'", "table, csv, json")),
        (["--since", "last tuesday"], ("--since", "'last tuesday'", "ISO date", "12h")),
        (["--split", "by_weight"], ("--split", "'by_weight'", "equal, input_size")),
        (["--idle-billing", "later"], ("--idle-billing", "'later'", "attribute, separate")),
        (["--limit", "-1"], ("--limit", "-1", "0 (all) or more")),
    ],
)
def test_errors_name_the_bad_value(
    store_path: str, args: list[str], named: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    from esg_prefect.cli import main

    assert main(["costs", "--url", store_path, *args]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and all(n in err for n in named), err


def test_a_missing_store_is_one_line_naming_url(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from esg_prefect.cli import main

    missing = tmp_path / "nothing.db"
    assert main(["costs", "--url", str(missing)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "--url" in err and f"no cost store at {missing}" in err, err
    assert not missing.exists()  # reading never creates a store
    code, out = invoke("--url", str(missing))  # through typer alone: the same refusal, exit 2
    assert code == 2 and "no cost store" in out


def test_a_database_the_store_cannot_use_is_named_like_the_other_options(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from esg_prefect.cli import main

    assert main(["costs", "--url", "mysql://me:secret@db/costs"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "esg-prefect: error: Invalid value for --url: the cost store needs a sqlite:// or postgresql:// URL, "
        "got scheme 'mysql'\n"
    )  # the scheme, not the URL and its password
    monkeypatch.setenv("ESG_PREFECT_STORE_URL", "mysql://a")
    assert main(["costs"]) == 2
    assert capsys.readouterr().err.startswith("esg-prefect: error: Invalid value for $ESG_PREFECT_STORE_URL: ")


def test_an_unreachable_database_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("psycopg")
    from esg_prefect.cli import main

    port = _closed_port()
    assert main(["costs", "--url", f"postgresql://nobody@127.0.0.1:{port}/costs"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and f"127.0.0.1:{port}" in err and "--url" in err, err


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_parse_since() -> None:
    assert parse_since(None) is None
    assert parse_since("2024-05-01") == T0
    assert parse_since("2024-05-01T02:00:00+02:00") == T0
    assert parse_since("90m", now_s=T0 / 1000 + 5400) == T0
    assert parse_since("1w", now_s=T0 / 1000 + 604800) == T0
    with pytest.raises(InvalidInputError, match="'5 days'"):
        parse_since("5 days")


def test_limit_shows_the_last_groups_and_the_total_of_all(store_path: str) -> None:
    code, out = invoke("--url", store_path, "--format", "json", "--limit", "1")
    assert code == 0, out
    doc = json.loads(out)
    assert [r["key"] for r in doc["rows"]] == [RUN_C, IDLE_KEY]  # the last run, then the idle line
    assert doc["total"] == pytest.approx(EXPECTED_TOTAL, rel=1e-12)
    code, out = invoke("--url", store_path, "--limit", "2")
    assert code == 0 and "(1 earlier groups not shown)" in out and RUN_A not in out


def test_the_demo_keeps_its_own_store(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from esg_prefect.examples.demo import demo_store_path
    from esg_prefect.store.engine import default_store_path

    monkeypatch.setenv("PREFECT_HOME", str(tmp_path))
    assert demo_store_path() != default_store_path() and demo_store_path().parent == default_store_path().parent


def test_no_store_yet_at_the_default_place_is_an_empty_account_not_an_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from esg_prefect.cli import main
    from esg_prefect.store.engine import ENV_URL, default_store_path

    monkeypatch.setenv("PREFECT_HOME", str(tmp_path))
    monkeypatch.delenv(ENV_URL, raising=False)
    assert main(["costs"]) == 0
    out = capsys.readouterr().out
    assert "No costs recorded yet" in out and str(default_store_path()) in out and "--url" in out
    assert main(["costs", "--format", "json"]) == 0
    got = capsys.readouterr()
    assert json.loads(got.out)["rows"] == [] and json.loads(got.out)["total"] == 0 and "No costs" in got.err
    assert not default_store_path().exists()  # reading never creates a store
    monkeypatch.setenv(ENV_URL, str(tmp_path / "chosen.db"))  # a store the user chose and that is missing: refused
    assert main(["costs"]) == 2
    assert "no cost store at" in capsys.readouterr().err
