"""The CLI's tables on a narrow console: split into several tables, never a header or value cut short."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

from esg_prefect.cli import app
from esg_prefect.cli.simulate import REPORT_COLUMNS
from esg_prefect.cli.tables import column_groups, print_table


def test_column_groups_fit_the_room_and_repeat_the_keys() -> None:
    # widths + 3 each, + 1 per table: key 10 -> 14; 20 -> 23 more; 30 -> 33 more
    assert column_groups([10, 20, 30], 100) == [[0, 1, 2]]
    assert column_groups([10, 20, 30], 70) == [[0, 1, 2]]  # 14 + 23 + 33 = 70: fits exactly
    assert column_groups([10, 20, 30], 69) == [[0, 1], [0, 2]]
    assert column_groups([5, 5, 40, 6], 40, keys=2) == [[0, 1, 2], [0, 1, 3]]  # 40 alone overflows: own table
    assert column_groups([8], 80) == [[0]]
    assert column_groups([], 80) == [[]]


def test_print_table_on_80_columns_shows_every_header_and_value_whole() -> None:
    rows = [
        {c: f"{c}-value" for c in REPORT_COLUMNS},
        {c: 0.123456 for c in REPORT_COLUMNS} | {"workflow": "image-classify"},
    ]
    out = io.StringIO()
    print_table(Console(file=out, width=80), "report", rows, REPORT_COLUMNS)
    text = out.getvalue()
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "…" not in text
    for c in REPORT_COLUMNS:
        assert f" {c} " in text and f" {c}-value " in text
    assert text.count("image-classify") == text.count(" report (")  # the key column leads every table
    assert " report (1/" in text


def test_simulate_on_a_narrow_terminal_cuts_nothing_short() -> None:
    result = CliRunner().invoke(
        app, ["simulate", "-s", "fast-gshare", "--rate", "40", "--duration", "2", "--warmup", "1"], terminal_width=80
    )
    assert result.exit_code == 0, result.output
    assert "…" not in result.output
    assert "slo_hit_rate" in result.output and "cost_per_request" in result.output


def _body_cells(text: str) -> list[list[str]]:
    """The body rows of rich tables in ``text``, as lists of stripped cells (headers use other borders)."""
    return [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines() if line.startswith("│")]


def test_tables_write_costs_as_every_other_surface_does() -> None:
    """A money column reads as the artifacts, tags and `costs` write money, not as Python formats a float."""
    from esg_prefect.cli.tables import markdown_table

    columns = ("workflow", "cost_per_request", "batch_cost_per_request", "busy_per_request", "mean_batch")
    rows = [
        {"workflow": "all", "cost_per_request": 1.52e-07, "batch_cost_per_request": 2.8e-06}
        | {"busy_per_request": 0.0, "mean_batch": 1.52e-07},
    ]
    out = io.StringIO()
    print_table(Console(file=out, width=200), "t", rows, columns)
    # was 1.52e-07 and 2.8e-06; a figure that is not money keeps its own format
    assert _body_cells(out.getvalue()) == [["all", "1.52e-7", "0.00000280", "0", "1.52e-07"]]
    assert markdown_table(rows, columns).splitlines()[-1] == "| all | 1.52e-7 | 0.00000280 | 0 | 1.52e-07 |"


def test_simulate_and_its_summary_write_money_in_the_one_format(tmp_path: Path) -> None:
    import json

    from esg_prefect.model.money import money_str, money_text

    args = ["simulate", "-s", "fast-gshare", "--rate", "40", "--duration", "2", "--warmup", "1", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "250"})  # one table, not split
    assert result.exit_code == 0, result.output
    overall = json.loads((tmp_path / "report.json").read_text())["overall"]  # the file: full precision
    first = result.output.split("where the time goes")[0]
    row = next(r for r in _body_cells(first) if r[0] == "all")
    assert row[REPORT_COLUMNS.index("cost_per_request")] == money_text(overall["cost_per_request"])
    assert row[REPORT_COLUMNS.index("batch_cost_per_request")] == money_text(overall["batch_cost_per_request"])
    assert f"Cost after the warm-up: {money_str(overall['cost_total'])} " in " ".join(result.output.split())
