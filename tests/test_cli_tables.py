"""The CLI's tables on a narrow console: split into several tables, never a header or value cut short."""

from __future__ import annotations

import io

from rich.console import Console
from typer.testing import CliRunner

from esg_prefect.cli import app
from esg_prefect.cli.simulate import REPORT_COLUMNS, column_groups, print_table


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
