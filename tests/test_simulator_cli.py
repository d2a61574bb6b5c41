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


def test_simulate_set_overrides_settings_and_names_bad_ones(tmp_path: Path) -> None:
    args = ["simulate", "--rate", "60", "--duration", "2", "--warmup", "0.5", "--out", str(tmp_path)]
    sets = ["--set", "keep_alive_by_price=false", "--set", "best_effort_tolerance=0.25", "--set", "percentile=mean"]
    result = CliRunner().invoke(app, [*args, *sets])
    assert result.exit_code == 0, result.output
    settings = json.loads((tmp_path / "case.json").read_text())["settings"]
    assert (settings["keep_alive_by_price"], settings["best_effort_tolerance"], settings["percentile"]) == (
        False,
        0.25,
        "mean",
    )
    for bad, named in [
        ("best_effort_tolerance=-1", "best_effort_tolerance"),
        ("no_such_knob=1", "no_such_knob"),
        ("keep_alive_by_price", "KEY=VALUE"),
    ]:
        result = CliRunner().invoke(app, [*args, "--set", bad])
        assert result.exit_code == 2 and named in result.output, result.output


def test_compare_pruning_ablation_quick(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["compare", "--experiment", "e4", "--quick", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "results.json").read_text())["E4"]
    assert rows[0]["pruning"] == "none"
    assert all(r["max_rel_cost_diff_vs_none"] < 1e-9 for r in rows)  # pruning never changes the plan's cost
    assert (tmp_path / "e4_pruning.png").stat().st_size > 1000
    assert "## E4" in (tmp_path / "tables.md").read_text()


def test_compare_on_a_users_case(tmp_path: Path) -> None:
    from esg_prefect.simulator import standard_case

    path = tmp_path / "mine.json"
    path.write_text(json.dumps(standard_case(rate_per_s=60.0, duration_s=3.0, warmup_s=1.0).to_dict()))
    out = tmp_path / "out"
    args = ["compare", "--case", str(path), "--schedulers", "esg,fast-gshare,triton", "--processes", "1"]
    args += ["--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    assert [r["scheduler"] for r in data["rows"]] == ["esg", "fast-gshare", "triton"]
    assert data["headline"]["best_baseline"] in ("fast-gshare", "triton")
    assert (out / "case.png").exists()
    # A second run of the same comparison reuses the rows it already has.
    lines = (out / "rows.jsonl").read_text().splitlines()
    assert len(lines) == 3
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    assert (out / "rows.jsonl").read_text().splitlines() == lines
    rerun = json.loads((out / "results.json").read_text())
    assert [r["p99_ms"] for r in rerun["rows"]] == [r["p99_ms"] for r in data["rows"]]

    # With other settings (--set) the rows are not reused: each is run again, under its own key.
    flat = CliRunner().invoke(app, [*args, "--set", "keep_alive_by_price=false"])
    assert flat.exit_code == 0, flat.output
    keys = [json.loads(line)["key"] for line in (out / "rows.jsonl").read_text().splitlines()]
    assert len(keys) == 6 and len(set(keys)) == 6
    bad = CliRunner().invoke(app, [*args, "--set", "no_such_knob=1"])
    assert bad.exit_code == 2 and "no_such_knob" in bad.output
