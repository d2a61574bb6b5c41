"""The CLI's tables on a narrow console: split into several tables, never a header or value cut short."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from esg_prefect.cli import app
from esg_prefect.cli.simulate import REPORT_COLUMNS
from esg_prefect.cli.tables import column_groups, header, print_table


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
        assert f" {header(c)} " in text and f" {c}-value " in text
    assert text.count("image-classify") == text.count(" report (")  # the key column leads every table
    assert " report (1/" in text


def test_simulate_on_a_narrow_terminal_cuts_nothing_short() -> None:
    result = CliRunner().invoke(
        app, ["simulate", "-s", "fast-gshare", "--rate", "40", "--duration", "2", "--warmup", "1"], terminal_width=80
    )
    assert result.exit_code == 0, result.output
    assert "…" not in result.output
    assert "slo_hit_rate" in result.output and "whole bill $/req" in result.output


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
    assert "\n| all | 1.52e-7 | 0.00000280 | 0 | 1.52e-07 |\n" in markdown_table(rows, columns)


def test_a_money_column_keeps_one_notation_across_1e_6() -> None:
    """A column with a value below 1e-6 is written with exponents all the way down (was ``0.00000107`` above
    ``5.86e-7``); a column with none stays positional; each keeps three significant digits. The Markdown too."""
    from esg_prefect.cli.tables import markdown_table
    from esg_prefect.model.money import money_column

    assert money_column([1.0712e-06, 5.861e-07, 0.0, 0.00123]) == ["1.07e-6", "5.86e-7", "0", "1.23e-3"]
    assert money_column([1.0712e-06, 0.00015, 2.15], "$") == ["$0.00000107", "$0.000150", "$2.15"]
    assert money_column([]) == []
    columns = ("workflow", "cost_per_request", "batch_cost_per_request")
    rows = [
        {"workflow": "a", "cost_per_request": 1.0712e-06, "batch_cost_per_request": 2.5e-06},
        {"workflow": "b", "cost_per_request": 5.861e-07, "batch_cost_per_request": None},
        {"workflow": "all", "cost_per_request": 8.2e-07, "batch_cost_per_request": 1.5e-06},
    ]
    out = io.StringIO()
    print_table(Console(file=out, width=200), "t", rows, columns)
    assert _body_cells(out.getvalue()) == [
        ["a", "1.07e-6", "0.00000250"],
        ["b", "5.86e-7", "-"],
        ["all", "8.20e-7", "0.00000150"],
    ]
    assert "| a | 1.07e-6 | 0.00000250 |\n| b | 5.86e-7 | - |\n| all | 8.20e-7 | 0.00000150 |" in markdown_table(
        rows, columns
    )


def test_simulate_and_its_summary_write_money_in_the_one_format(tmp_path: Path) -> None:
    import json

    from esg_prefect.model.money import money_column, money_exponent, money_text

    args = ["simulate", "-s", "fast-gshare", "--rate", "40", "--duration", "2", "--warmup", "1", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "250"})  # one table, not split
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "report.json").read_text())  # the file: full precision
    overall = report["overall"]
    first = result.output.split("where the time goes")[0]
    row = next(r for r in _body_cells(first) if r[0] == "all")
    for column in ("cost_per_request", "batch_cost_per_request"):  # in the notation of the column's values
        column_values = [w[column] for w in report["workflows"].values()] + [overall[column]]
        assert row[REPORT_COLUMNS.index(column)] == money_text(overall[column], money_exponent(column_values))
    whole = money_column([overall["cost_total"]], "$")[0]
    assert f"Cost after the warm-up: {whole}, " in " ".join(result.output.split())


def test_cost_headers_say_whether_busy_includes_cold_starts_and_a_line_says_what_each_holds() -> None:
    """simulate's busy (batch_cost_per_request) includes cold starts, compare's (busy_per_request) does not:
    their headers differ, and the line under each table names every cost column's meaning and key."""
    from esg_prefect.cli.compare import RUN_COLUMNS
    from esg_prefect.cli.tables import cost_legend, markdown_table

    assert header("batch_cost_per_request") == "busy incl. cold $/req"
    assert header("busy_per_request") == "busy excl. cold $/req"
    assert header("cold_per_request") == "cold starts $/req" and header("idle_per_request") == "idle $/req"
    assert header("cost_per_request") == "whole bill $/req" and header("p99_ms") == "p99_ms"
    rows = [{c: 1.5e-6 for c in RUN_COLUMNS} | {"scheduler": "esg"}]
    out = io.StringIO()
    print_table(Console(file=out, width=80), "case", rows, RUN_COLUMNS)
    text = out.getvalue()
    legend = cost_legend(RUN_COLUMNS)
    assert legend is not None and " ".join(legend.split()) in " ".join(text.split())
    assert text.rindex("┘") < text.index("Costs (3 significant digits)")  # under the (last) table
    for key in ("cost_per_request", "busy_per_request", "idle_per_request", "cold_per_request"):
        assert f"{header(key)} = " in legend and f"({key})" in legend
    assert "busy excl. cold $/req = the batches less their workers' cold starts" in legend
    assert "busy incl." not in legend  # no column of that kind here
    assert markdown_table(rows, RUN_COLUMNS).endswith("\n\n" + legend)
    assert cost_legend(("scheduler", "p99_ms")) is None
    plain = io.StringIO()
    print_table(Console(file=plain, width=80), "e3", [{"space": "a", "p99_ms": 1.0}], ("space", "p99_ms"))
    assert "Costs" not in plain.getvalue()  # no cost column: no legend


def test_a_line_says_cold_starts_counts_the_warm_up_and_pre_warms_the_costs_leave_out() -> None:
    """compare's cold_starts column read as the cold starts the cost columns bill: a case showed ESG with
    6 cold starts and a cold-start cost of 0, all six in the warm-up, and nothing under the table said so."""
    from esg_prefect.cli.compare import RUN_COLUMNS
    from esg_prefect.cli.tables import markdown_table

    rows = [{c: 1.5e-6 for c in RUN_COLUMNS} | {"scheduler": "esg", "cold_starts": 6}]
    out = io.StringIO()
    print_table(Console(file=out, width=80), "case", rows, RUN_COLUMNS)
    said = "cold_starts = workers started over the whole run, warm-up and pre-warmed ones included"
    assert said in " ".join(out.getvalue().split())
    assert said in markdown_table(rows, RUN_COLUMNS)
    plain = io.StringIO()
    print_table(Console(file=plain, width=80), "e3", [{"space": "a", "p99_ms": 1.0}], ("space", "p99_ms"))
    assert "cold_starts =" not in plain.getvalue()


def test_simulate_splits_the_whole_bill_as_compare_does() -> None:
    from esg_prefect.cli.bill_plot import bill_split
    from esg_prefect.cli.simulate import summary_line
    from esg_prefect.model.money import money_str
    from esg_prefect.simulator import simulate, standard_case

    case = standard_case("triton", rate_per_s=60.0, duration_s=4.0, warmup_s=1.0)  # triton: cold starts on the path
    run = simulate(case)
    n = run.report.overall.count
    part = bill_split(run, case)
    assert part["cold_per_request"] > 0
    line = summary_line(run, case, wall_s=1.0)
    assert (
        f"Cost after the warm-up: {money_str(run.report.overall.cost_total)}, the whole bill: busy excl. cold "
        f"{money_str(part['busy_per_request'] * n)} + idle {money_str(part['idle_per_request'] * n)} + cold starts "
        f"{money_str(part['cold_per_request'] * n)} (the table's busy incl. cold = busy excl. cold + cold starts)."
    ) in line


def test_simulate_prints_the_bill_s_totals_and_compare_s_rows_are_them_per_request() -> None:
    from esg_prefect.cli.bill_plot import bill_split, bill_totals
    from esg_prefect.cli.simulate import bill_note
    from esg_prefect.model.money import money_column
    from esg_prefect.simulator import simulate, standard_case

    case = standard_case("triton", rate_per_s=60.0, duration_s=3.0, warmup_s=1.0)  # triton: cold starts on the path
    run = simulate(case)
    total = bill_totals(run, case)
    assert total["cold_start"] > 0 and total["busy"] > 0 and total["idle"] > 0
    report = run.report
    assert sum(total.values()) == pytest.approx(report.busy_cost + report.idle_cost, rel=1e-12)
    n = report.overall.count
    assert bill_split(run, case) == {  # exactly: one derivation of the parts
        "busy_per_request": total["busy"] / n,
        "idle_per_request": total["idle"] / n,
        "cold_per_request": total["cold_start"] / n,
    }
    whole, busy, idle, cold = money_column(
        [report.overall.cost_total, total["busy"], total["idle"], total["cold_start"]], "$"
    )
    assert f"{whole}, the whole bill: busy excl. cold {busy} + idle {idle} + cold starts {cold} " in bill_note(
        run, case
    )


def test_compare_prints_and_writes_the_cost_headers_and_their_legend(tmp_path: Path) -> None:
    import json

    from esg_prefect.simulator import standard_case

    path = tmp_path / "case.json"
    path.write_text(json.dumps(standard_case(rate_per_s=40.0, duration_s=2.0, warmup_s=0.5).to_dict()))
    out = tmp_path / "out"
    args = ["compare", "--case", str(path), "--schedulers", "triton", "--processes", "1", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    flat = " ".join(result.output.replace("│", " ").split())
    for name in ("whole bill $/req", "busy excl. cold $/req", "idle $/req", "cold starts $/req"):
        assert name in flat
    assert "busy excl. cold $/req = the batches less their workers' cold starts (busy_per_request)" in flat
    tables = (out / "tables.md").read_text()
    assert "| busy excl. cold $/req |" in tables and "(busy_per_request)" in tables
    row = json.loads((out / "results.json").read_text())["rows"][0]
    assert {"busy_per_request", "idle_per_request", "cold_per_request", "cost_per_request"} <= set(row)  # keys kept
