"""``esg-prefect simulate`` and ``compare``: they run, print tables and write their files."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from esg_prefect.cli import app


def test_simulate_writes_case_and_report(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        ["simulate", "-s", "fast-gshare", "--rate", "60", "--duration", "3", "--warmup", "1", "--out", str(tmp_path)],
    )
    assert result.exit_code == 0, result.output
    assert "requests simulated" in result.output
    report = json.loads((tmp_path / "report.json").read_text())
    case = json.loads((tmp_path / "case.json").read_text())
    assert case["scheduler"] == "fast-gshare" and report["overall"]["count"] > 0


def test_simulate_runs_a_case_file(tmp_path: Path) -> None:
    from esg_prefect.simulator import standard_case

    path = tmp_path / "case.json"
    path.write_text(json.dumps(standard_case("triton", rate_per_s=40.0, duration_s=2.0, warmup_s=0.5).to_dict()))
    result = CliRunner().invoke(app, ["simulate", "--case", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout[result.stdout.index("{") :])["overall"]["count"] > 0


def test_compare_pruning_ablation_quick(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["compare", "--experiment", "e4", "--quick", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "results.json").read_text())["E4"]
    assert rows[0]["pruning"] == "none"
    assert all(r["max_rel_cost_diff_vs_none"] < 1e-9 for r in rows)  # pruning never changes the plan's cost
    assert (tmp_path / "e4_pruning.png").stat().st_size > 1000
    assert "## E4" in (tmp_path / "tables.md").read_text()
