"""``esg-prefect simulate`` and ``compare``: they run, print tables and write their files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
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


def test_simulate_says_when_it_caps_the_warm_up(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["simulate", "-s", "fast-gshare", "--rate", "60", "--duration", "2", "--warmup", "1.5", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert "note: the warm-up is at most half the run: 1 s, not 1.5" in result.stderr
    assert json.loads(result.stdout[result.stdout.index("{") :])["overall"]["count"] > 0


def test_simulate_says_once_when_the_queues_hold_seconds_of_arrivals(tmp_path: Path) -> None:
    from esg_prefect.simulator import ClusterSpec, NodeSpec, WorkloadSpec, tiny_case

    # 800 requests/s on one T4: the queues hold over 2,000 calls by the end, past 2 s of arrivals (1,600).
    case = tiny_case("fast-gshare").with_(
        cluster=ClusterSpec((NodeSpec("n0", 8, ("T4",)),)), workload=WorkloadSpec("poisson", 800.0), duration_s=3.0
    )
    path = tmp_path / "case.json"
    path.write_text(json.dumps(case.to_dict()))
    result = CliRunner().invoke(app, ["simulate", "--case", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert result.stderr.count("calls are queued, over 2 s of arrivals") == 1
    assert "--set shed_after_slo=3" in result.stderr
    shed = CliRunner().invoke(app, ["simulate", "--case", str(path), "--json", "--set", "shed_after_slo=3"])
    assert shed.exit_code == 0, shed.output
    assert "calls are queued" not in shed.stderr  # shedding on: no note
    light = CliRunner().invoke(app, ["simulate", "-s", "fast-gshare", "--rate", "60", "--duration", "2", "--json"])
    assert light.exit_code == 0 and "calls are queued" not in light.stderr


def test_simulate_runs_a_case_file(tmp_path: Path) -> None:
    from esg_prefect.simulator import standard_case

    path = tmp_path / "case.json"
    path.write_text(json.dumps(standard_case("triton", rate_per_s=40.0, duration_s=2.0, warmup_s=0.5).to_dict()))
    result = CliRunner().invoke(app, ["simulate", "--case", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout[result.stdout.index("{") :])["overall"]["count"] > 0


def test_simulate_keeps_a_case_files_seed_and_scheduler_unless_given(tmp_path: Path) -> None:
    from esg_prefect.simulator import simulate, standard_case

    case = standard_case("triton", rate_per_s=40.0, duration_s=2.0, warmup_s=0.5, seed=7)
    path = tmp_path / "case.json"
    path.write_text(json.dumps(case.to_dict()))

    def run(*args: str) -> tuple[str, dict[str, Any]]:
        result = CliRunner().invoke(app, ["simulate", "--case", str(path), "--out", str(tmp_path / "out"), *args])
        assert result.exit_code == 0, result.output
        return result.output, json.loads((tmp_path / "out" / "report.json").read_text())

    output, report = run()  # the case's own seed and scheduler, as simulate(case) runs it
    assert "triton: standard case, seed 7" in output
    assert report["busy_cost"] == simulate(case).report.busy_cost
    output, report = run("--seed", "0", "-s", "esg")  # given: they override the case's, esg included
    assert "esg: standard case, seed 0" in output
    assert report["busy_cost"] == simulate(case.with_(scheduler="esg"), 0).report.busy_cost
    assert json.loads((tmp_path / "out" / "case.json").read_text())["seed"] == 0  # case.json says what ran


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


def test_set_reads_python_literals_as_the_schedulers_table_prints_defaults() -> None:
    """`esg-prefect schedulers` and docs/settings.md print True, 'frontier', {'batches': [...]}: copied into
    --set, they are read as what they say (was: "idle_vcpus must be a bool, got 'True'")."""
    from esg_prefect.cli.args import parse_settings
    from esg_prefect.scheduling import ESGSettings

    pairs = ["idle_vcpus=True", "wait_for_batch=False", "heuristic='min_cost'", "percentile=mean"]
    pairs += ["config_space={'batches': [1, 2]}", "tick_ms=2.5", "corun_table=/x/y.csv", 'search_horizon="workflow"']
    s = parse_settings(ESGSettings(), pairs)
    assert (s.idle_vcpus, s.wait_for_batch, s.heuristic, s.percentile) == (True, False, "min_cost", "mean")
    assert s.config_space.batches == (1, 2) and s.tick_ms == 2.5
    assert (s.corun_table, s.search_horizon) == ("/x/y.csv", "workflow")
    with pytest.raises(typer.BadParameter) as exc:
        parse_settings(ESGSettings(), ["idle_vcpus=yes"])
    assert "idle_vcpus must be a bool, got 'yes'" in exc.value.message
    assert "JSON or a Python literal: true/True" in exc.value.message  # how a value is read
    with pytest.raises(typer.BadParameter) as exc:
        parse_settings(ESGSettings(), ["no_such_knob=True"])
    assert "no_such_knob" in exc.value.message and "Python literal" not in exc.value.message  # the key is wrong


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


def test_compare_on_a_case_runs_from_the_cases_own_seed(tmp_path: Path) -> None:
    from esg_prefect.simulator import simulate, standard_case

    case = standard_case(rate_per_s=40.0, duration_s=2.0, warmup_s=0.5, seed=7)
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(case.to_dict()))
    out = tmp_path / "out"
    args = ["compare", "--case", str(path), "--schedulers", "esg,triton,esg", "--seeds", "2", "--processes", "1"]
    result = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    # seeds from the case's 7; esg named twice runs once
    assert [(r["scheduler"], r["seed"]) for r in data["rows"]] == [("esg", 7), ("esg", 8), ("triton", 7), ("triton", 8)]
    esg7 = simulate(case.with_(scheduler="esg"), 7).report.overall
    assert data["rows"][0]["cost_per_request"] == esg7.cost_per_request  # what simulate --case runs
    assert "headline" in data  # over the rows of the first seed, 7
    # the rows of one scheduler were told apart by nothing; the headline did not say which seed it compares
    assert "| scheduler | seed | slo_hit_rate |" in (out / "tables.md").read_text()
    assert "| esg | 8 | " in (out / "tables.md").read_text()
    assert "Below: the runs of seed 7 only" in " ".join(result.output.split())


def test_a_case_file_simulate_writes_runs_from_its_own_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from esg_prefect.cli.case_file import case_dict_in
    from esg_prefect.model.profile_source import PROFILE_DIR
    from esg_prefect.simulator import standard_case

    (tmp_path / "mycase").mkdir()
    (tmp_path / "mycase" / "mine.csv").write_text((PROFILE_DIR / "nvidia_gpu.csv").read_text())
    (tmp_path / "arrivals.csv").write_text("arrival_s\n" + "\n".join(f"{i * 0.05:.2f}" for i in range(40)) + "\n")
    monkeypatch.chdir(tmp_path)
    args = ["--profile", "mycase/mine.csv", "--trace", "csv:arrivals.csv", "--rate", "20", "--duration", "2"]
    result = CliRunner().invoke(app, ["simulate", *args, "--warmup", "0.5", "--out", "mycase", "--json"])
    assert result.exit_code == 0, result.output
    written = json.loads((tmp_path / "mycase" / "case.json").read_text())
    # the profile under --out relative to it; the trace outside it absolute
    assert written["profile"] == "mine.csv"
    assert written["workload"]["trace"] == f"csv:{(tmp_path / 'arrivals.csv').resolve()}"
    assert case_dict_in(standard_case(), tmp_path)["profile"] == "nvidia_gpu"  # a packaged name is kept as it is
    for cwd, case_json in ((tmp_path / "mycase", "case.json"), (tmp_path.parent, str(tmp_path / "mycase/case.json"))):
        monkeypatch.chdir(cwd)  # cd DIR && esg-prefect simulate --case case.json, and from elsewhere
        again = CliRunner().invoke(app, ["simulate", "--case", case_json, "--json"])
        assert again.exit_code == 0, again.output
        assert json.loads(again.stdout[again.stdout.index("{") :])["overall"]["count"] > 0


def test_the_at_risk_line_says_what_it_counts_and_cannot_contradict_the_table() -> None:
    # Issue #22: "76 for at-risk dispatches" next to an at_risk column of zeros. The worker starts are
    # counted over the whole run, the table's requests after the warm-up: the line now gives both
    # request counts, so a start for a best-effort dispatch always has its request(s) next to it.
    from esg_prefect.cli.simulate import summary_line
    from esg_prefect.simulator import simulate, standard_case

    case = standard_case(rate_per_s=60.0, duration_s=6.0, warmup_s=3.0, seed=1)  # a seed with none after it
    run = simulate(case)
    line = summary_line(run, case, wall_s=1.0)
    whole_run = sum(1 for r in run.requests if r.at_risk)
    table = run.report.overall.at_risk
    assert run.at_risk_cold_starts > 0 and table == 0  # the situation: best-effort starts in the warm-up
    assert f"{run.cold_starts} ({run.prewarm_starts} pre-warmed, {run.at_risk_cold_starts} for best-effort" in line
    assert f"(at_risk): {whole_run} over the whole run, {table} after the 3 s warm-up (the table)" in line
    assert whole_run >= 1 and whole_run >= table  # each such start dispatched at least one request's stage
    assert "\n" not in line


def test_compare_rows_carry_the_whole_bill_and_run_row_matches_run_spec() -> None:
    from esg_prefect.cli.bill_plot import BILL
    from esg_prefect.cli.compare import run_row
    from esg_prefect.simulator import experiments as ex
    from esg_prefect.simulator import standard_case

    for scheduler in ("esg", "triton"):
        spec = ex.RunSpec("case", standard_case(scheduler, rate_per_s=60.0, duration_s=4.0, warmup_s=1.0), 0)
        row, reference = run_row(spec), ex.run_spec(spec)
        assert {k: v for k, v in row.items() if k not in BILL} == reference  # same row, bill added
        parts = [row[k] for k in BILL]
        assert all(p >= 0 for p in parts)
        assert sum(parts) == pytest.approx(row["cost_per_request"], rel=1e-9)  # busy + idle + cold = whole bill
        assert row["busy_per_request"] + row["cold_per_request"] == pytest.approx(
            row["batch_cost_per_request"], rel=1e-9
        )
    assert row["cold_per_request"] > 0  # triton starts workers on the requests' path


def test_the_rows_bill_columns_are_the_pools_bill_parts_by_their_row_names() -> None:
    from esg_prefect.cli.bill_plot import BILL, bill_columns
    from esg_prefect.control.totals import BILL_PARTS

    # One column per part of the pool's bill (its totals, its Prometheus labels), in the plot's stacking order.
    row = bill_columns({"busy": 1.0, "cold_start": 3.0, "idle": 2.0})
    assert row == {"busy_per_request": 1.0, "idle_per_request": 2.0, "cold_per_request": 3.0}
    assert tuple(row) == BILL and len(BILL) == len(BILL_PARTS)
    with pytest.raises(ValueError, match="the bill's parts are busy, cold_start, idle; got busy, cold"):
        bill_columns({"busy": 1.0, "cold": 3.0})


def test_the_bill_plot_stacks_three_parts_with_its_legend_outside_the_bars() -> None:
    from esg_prefect.cli.bill_plot import bill_figure

    rows = [
        {"scheduler": s, "load": load, "slo_hit_rate": 0.9, "busy_per_request": b, "idle_per_request": i}
        | {"cold_per_request": c, "seed": seed}
        for load in (150.0, 300.0)
        for s, b, i, c in (("esg", 1e-6, 2e-6, 0.0), ("triton", 3e-6, 1e-6, 1e-6))
        for seed in (0, 1)
    ]
    fig = bill_figure(rows, "load", "test")
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        legend = fig.legends[0].get_window_extent(renderer)
        assert [t.get_text() for t in fig.legends[0].get_texts()] == [
            "busy excl. cold starts (batches)",
            "idle (kept warm, pre-warm loads included)",
            "cold starts",
        ]
        axes = fig.axes
        assert len(axes) == 4  # SLO and bill, per load
        for ax in axes:
            assert not legend.overlaps(ax.get_window_extent(renderer))
        bill_ax = next(ax for ax in axes if ax.get_ylabel() == "$ per million requests")  # the first load's
        tops = {}
        for bar in bill_ax.patches:
            x = round(bar.get_x(), 6)
            tops[x] = max(tops.get(x, 0.0), bar.get_y() + bar.get_height())
        assert sorted(round(t, 6) for t in tops.values()) == [3.0, 5.0]  # esg 1+2+0, triton 3+1+1 ($/M)
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def _triton_run_of_a_saved_case(tmp_path: Path) -> tuple[Path, Path, Any]:
    """A small standard case saved as ``mine.json``, an empty ``out`` folder, and the triton run's spec."""
    from esg_prefect.simulator import experiments as ex
    from esg_prefect.simulator import standard_case

    case = standard_case(rate_per_s=60.0, duration_s=3.0, warmup_s=1.0)
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(case.to_dict()))
    out = tmp_path / "out"
    out.mkdir()
    return path, out, ex.RunSpec("case", case.with_(scheduler="triton"), 0, (("case", case.name),))


def test_compare_prints_runs_by_name_and_reruns_rows_without_the_bill(tmp_path: Path) -> None:
    from esg_prefect.cli.compare import spec_key, spec_label
    from esg_prefect.simulator import experiments as ex

    path, out, spec = _triton_run_of_a_saved_case(tmp_path)
    stale = {"key": spec_key(spec), "scheduler": "triton", "seed": 0, "p99_ms": -1.0}  # a row of an older version
    (out / "rows.jsonl").write_text(json.dumps(stale) + "\n")
    args = ["compare", "--case", str(path), "--schedulers", "triton", "--processes", "1", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "done case standard: triton, seed 0" in result.output
    assert spec_key(spec) not in result.output and "|" not in result.output.replace("│", "")  # no internal keys
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert rows[0]["p99_ms"] > 0 and rows[0]["cold_per_request"] >= 0  # run again, not the stale row
    assert (out / "case.png").stat().st_size > 1000
    assert spec_label(ex.load_specs(("esg",), (300.0,), (1,))[0]) == "E1 at 300 requests/s: esg, seed 1"


def test_compare_reruns_a_case_of_the_same_name_with_another_rate_and_says_what_it_reuses(tmp_path: Path) -> None:
    from esg_prefect.simulator import standard_case

    out = tmp_path / "out"
    rates = {}
    for rate in (40.0, 120.0, 120.0):
        path = tmp_path / f"case{rate:g}.json"
        path.write_text(json.dumps(standard_case(rate_per_s=rate, duration_s=3.0, warmup_s=1.0).to_dict()))
        args = ["compare", "--case", str(path), "--schedulers", "triton", "--processes", "1", "--out", str(out)]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        rows = json.loads((out / "results.json").read_text())["rows"]
        assert len(rows) == 1
        rates.setdefault(rate, []).append((rows[0]["requests"], "reusing 1 of 1 runs" in result.output))
    # Both cases are named "standard": the second rate is simulated, not read from the first one's rows.
    assert rates[40.0][0][1] is False and rates[120.0][0][1] is False
    assert rates[120.0][0][0] > 2 * rates[40.0][0][0]
    assert rates[120.0][1] == (rates[120.0][0][0], True)  # the same case again: its row reused, and said so
    again = CliRunner().invoke(app, [*args, "--fresh"])  # --fresh: run again (a scheduler's code changed, say)
    assert again.exit_code == 0 and "reusing" not in again.output and "done case standard: triton" in again.output


def test_a_run_s_key_follows_the_contents_of_its_trace_and_profile_files(tmp_path: Path) -> None:
    from esg_prefect.cli.compare import spec_key
    from esg_prefect.cli.rows_file import file_digests
    from esg_prefect.model.profile_source import profile_path
    from esg_prefect.simulator import experiments as ex
    from esg_prefect.simulator import standard_case

    trace, profile = tmp_path / "arrivals.csv", tmp_path / "mine.csv"
    trace.write_text("arrival_s\n" + "\n".join(f"{i * 0.05:.2f}" for i in range(40)) + "\n")
    profile.write_bytes(profile_path("nvidia_gpu").read_bytes())
    case = standard_case("triton", trace=f"csv:{trace}", profile=str(profile), rate_per_s=20.0, duration_s=2.0)
    spec = ex.RunSpec("case", case, 0, (("case", case.name),))
    first = spec_key(spec)
    assert spec_key(spec) == first  # the same files: the same run
    assert spec_key(spec, file_digests([str(trace), str(profile)])) == first  # digests read once, by the caller
    trace.write_text("arrival_s\n" + "\n".join(f"{i * 0.10:.2f}" for i in range(40)) + "\n")  # same path
    second = spec_key(spec)
    assert second != first
    profile.write_text(profile.read_text() + "\n")
    assert len({first, second, spec_key(spec)}) == 3
    assert file_digests([str(tmp_path / "gone.csv")]) == {str(tmp_path / "gone.csv"): "unreadable"}


def test_compare_runs_a_case_again_after_its_trace_file_is_edited_in_place(tmp_path: Path) -> None:
    from esg_prefect.simulator import standard_case

    trace = tmp_path / "arrivals.csv"
    trace.write_text("arrival_s\n" + "\n".join(f"{i * 0.05:.2f}" for i in range(40)) + "\n")
    case = standard_case(trace="csv:arrivals.csv", rate_per_s=20.0, duration_s=2.0, warmup_s=0.5).to_dict()
    case["workload"]["start_s"] = 0  # the file's own times, from its first row
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(case))
    out = tmp_path / "out"
    args = ["compare", "--case", str(path), "--schedulers", "triton", "--processes", "1", "--out", str(out)]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0 and "reusing" not in first.output, first.output
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and "reusing 1 of 1 runs" in again.output, again.output
    trace.write_text("arrival_s\n" + "\n".join(f"{i * 0.025:.3f}" for i in range(80)) + "\n")  # in place
    edited = CliRunner().invoke(app, args)  # not answered from the old file's row
    assert edited.exit_code == 0, edited.output
    assert "reusing" not in edited.output and "(80 rows" in edited.output and "done case" in edited.output


def test_compare_runs_again_rows_computed_by_other_code_and_says_so_in_one_line(tmp_path: Path) -> None:
    """A kept row of the same run (same key, whole-bill fields and all) but another code stamp, as after an upgrade,
    is not reused: it runs again, one line says why, and the file keeps only rows this code may reuse."""
    from esg_prefect.cli.compare import spec_key
    from esg_prefect.cli.rows_file import code_stamp

    path, out, spec = _triton_run_of_a_saved_case(tmp_path)
    bill = dict.fromkeys(("busy_per_request", "idle_per_request", "cold_per_request"), 1.0)
    old = {"key": spec_key(spec), "scheduler": "triton", "seed": 0, "p99_ms": -1.0, **bill, "code": "0.0.1+0123456789"}
    other = {**old, "key": "another run", "code": "0.0.1+0123456789"}  # not asked for now: dropped, not named
    (out / "rows.jsonl").write_text(json.dumps(old) + "\n" + json.dumps(other) + "\n")
    args = ["compare", "--case", str(path), "--schedulers", "triton", "--processes", "1", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    flat = " ".join(result.output.split())
    said = (
        f"not reusing 1 run(s) in {out / 'rows.jsonl'}: computed by 0.0.1+0123456789, not by this code "
        f"(esg-prefect {code_stamp()}); running them again"
    )
    assert "".join(said.split()) in "".join(flat.split())  # rich may break a long path inside a word
    assert "reusing 1 of 1" not in flat and "done case standard: triton, seed 0" in flat
    assert json.loads((out / "results.json").read_text())["rows"][0]["p99_ms"] > 0  # run again
    kept = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert [(r["key"], r["code"]) for r in kept] == [(spec_key(spec), code_stamp())]
    again = CliRunner().invoke(app, args)  # the same code: reused, nothing to say about old rows
    assert again.exit_code == 0 and "reusing 1 of 1 runs" in again.output and "not reusing" not in again.output


def test_the_code_stamp_follows_the_package_s_code_and_data_not_its_caches(tmp_path: Path) -> None:
    import esg_prefect
    from esg_prefect.cli.rows_file import code_stamp, package_digest

    (tmp_path / "data").mkdir()
    (tmp_path / "__pycache__").mkdir()
    files = {"core.py": "X = 1\n", "data/profile.csv": "a,b\n1,2\n", "README.md": "doc", "__pycache__/core.pyc": "c"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    first = package_digest(tmp_path)
    (tmp_path / "README.md").write_text("other doc")
    (tmp_path / "__pycache__" / "core.pyc").write_text("other cache")
    assert package_digest(tmp_path) == first  # neither computes a row
    (tmp_path / "core.py").write_text("X = 2\n")
    second = package_digest(tmp_path)
    (tmp_path / "data" / "profile.csv").write_text("a,b\n1,3\n")
    assert len({first, second, package_digest(tmp_path)}) == 3
    assert code_stamp().startswith(f"{esg_prefect.__version__}+") and code_stamp() == code_stamp()


def test_a_case_gpu_type_no_stage_is_profiled_on_is_named(tmp_path: Path) -> None:
    from esg_prefect.simulator import standard_case

    data = standard_case(rate_per_s=30.0, duration_s=2.0, warmup_s=0.5).to_dict()
    data["cluster"][-1]["gpus"] = ["a100", "a100"]  # misspelt: the profile says "A100"
    path = tmp_path / "case.json"
    path.write_text(json.dumps(data))
    result = CliRunner().invoke(app, ["simulate", "--case", str(path)])
    assert result.exit_code == 0, result.output
    assert "no stage of this case has a latency profile on a100" in " ".join(result.output.split())
    assert "A100, T4, V100" in result.output
    plain = standard_case(rate_per_s=30.0, duration_s=2.0, warmup_s=0.5)
    assert plain.unused_gpu_types() == [] and plain.with_(cluster=replace_gpus(plain.cluster)).unused_gpu_types() == [
        "X9000"
    ]


def replace_gpus(cluster: Any) -> Any:
    from dataclasses import replace

    first = cluster.nodes[0]
    return replace(cluster, nodes=(replace(first, gpus=("X9000", *first.gpus[1:])), *cluster.nodes[1:]))


def test_simulate_help_names_every_trace_the_version_prints() -> None:
    from esg_prefect import __version__
    from esg_prefect.workload.arrivals import trace_names

    raw = CliRunner().invoke(app, ["simulate", "--help"], terminal_width=200).output
    help_text = " ".join(raw.replace("│", " ").split())  # rich's panel borders where lines wrap
    assert all(name in help_text for name in trace_names()), help_text
    assert "(default 20, at most half the run)" in help_text
    version = CliRunner().invoke(app, ["--version"])
    assert version.exit_code == 0 and version.output.strip() == f"esg-prefect {__version__}"


def test_compare_says_who_wins_in_words() -> None:
    from esg_prefect.cli.verdict import verdict

    rows = [
        {"scheduler": "esg", "cost_per_request": 6.0e-8, "slo_hit_rate": 0.995, "p99_ms": 47.6},
        {"scheduler": "esg-fastest", "cost_per_request": 1.0e-9, "slo_hit_rate": 1.0, "p99_ms": 1.0},
        {"scheduler": "infless", "cost_per_request": 1.3e-9, "slo_hit_rate": 1.0, "p99_ms": 101.0},
        {"scheduler": "fast-gshare", "cost_per_request": 1.38e-9, "slo_hit_rate": 1.0, "p99_ms": 1.8},
    ]
    lines = verdict(rows)
    assert lines[0] == "Cheapest on the whole bill (busy + idle + cold starts): esg-fastest, $1.00e-9 per request."
    assert (
        lines[1]
        == "Most SLOs met: 3 schedulers at 100.00%; the cheapest of them: esg-fastest, at $1.00e-9 per request."
    )
    assert lines[2] == "Lowest p99 latency: esg-fastest, 1.0 ms."
    # ESG's ablations are not baselines; the best baseline meets the most SLOs, then is the cheaper
    assert lines[3].startswith("ESG against the baseline meeting the most SLOs (infless, the cheapest of 2 at 100.00%)")
    assert ": 46.15x dearer on the whole bill" in lines[3]
    assert "SLO hit rate -0.50 points (99.50% vs 100.00%), p99 47.6 vs 101.0 ms." in lines[3]
    cheaper = verdict([{**rows[0], "cost_per_request": 1.0e-9}, rows[2]])
    assert "1.30x cheaper on the whole bill" in cheaper[3]
    assert verdict([]) == []


def test_the_sentences_say_when_schedulers_tie_and_which_one_is_named() -> None:
    """Five schedulers at 100 % read "Most SLOs met: triton, 100.00%", as if triton alone met the most."""
    from esg_prefect.cli.verdict import verdict

    def row(name: str, cost: float, p99: float) -> dict[str, object]:
        return {"scheduler": name, "cost_per_request": cost, "slo_hit_rate": 1.0, "p99_ms": p99}

    rows = [row("esg", 3e-7, 50.0), row("triton", 1e-7, 50.0), row("infless", 2e-7, 60.0), row("batch", 4e-7, 40.0)]
    lines = verdict(rows)
    assert lines[0] == "Cheapest on the whole bill (busy + idle + cold starts): triton, $1.00e-7 per request."
    assert lines[1] == "Most SLOs met: 4 schedulers at 100.00%; the cheapest of them: triton, at $1.00e-7 per request."
    assert lines[2] == "Lowest p99 latency: batch, 40.0 ms."
    assert lines[3].startswith("ESG against the baseline meeting the most SLOs (triton, the cheapest of 3 at 100.00%):")
    same_bill = verdict([row("triton", 1e-7, 50.0), row("batch", 1e-7, 40.0)])[0]
    assert same_bill.endswith(": 2 schedulers at $1.00e-7 per request; first by name: batch.")
    assert verdict(rows[:3])[2] == "Lowest p99 latency: 2 schedulers at 50.0 ms; first by name: esg."


def test_compare_schedulers_are_named_once_and_an_empty_list_is_not_the_default() -> None:
    from esg_prefect.cli.compare import _scheduler_list
    from esg_prefect.simulator.experiments import DEFAULT_SCHEDULERS

    assert _scheduler_list("esg, triton,esg,,triton") == ("esg", "triton")
    assert _scheduler_list("") == DEFAULT_SCHEDULERS  # the option left out
    with pytest.raises(typer.BadParameter, match="give at least one scheduler name"):
        _scheduler_list(" , ", given=True)


def test_the_headline_says_which_way_its_cost_ratios_read(tmp_path: Path) -> None:
    from esg_prefect.cli.compare import RATIO_NOTE
    from esg_prefect.simulator import standard_case

    path = tmp_path / "mine.json"
    path.write_text(json.dumps(standard_case(rate_per_s=40.0, duration_s=2.0, warmup_s=0.5).to_dict()))
    out = tmp_path / "out"
    args = ["compare", "--case", str(path), "--schedulers", "esg,triton", "--processes", "1", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert RATIO_NOTE == (
        "cost ratios are best baseline / ESG: above 1, ESG is cheaper "
        "(cost_ratio: batches alone; cost_ratio_with_idle: the whole bill)"
    )
    lines = result.output.splitlines()
    table_end = max(i for i, line in enumerate(lines) if "ESG vs the best baseline" in line)
    assert RATIO_NOTE in lines[table_end:]  # under the headline table, before the sentences
    assert RATIO_NOTE in (out / "tables.md").read_text()
    head = json.loads((out / "results.json").read_text())["headline"]
    assert {"cost_ratio", "cost_ratio_with_idle"} <= set(head)  # the keys bench scripts read stay


def test_headline_and_sentences_name_the_same_best_baseline() -> None:
    """A tie on SLO hits goes to the cheaper whole bill, a user's scheduler counts, ablations do not."""
    from esg_prefect.cli.verdict import verdict
    from esg_prefect.simulator.experiments import best_baseline, headline

    def row(name: str, whole: float, busy: float, slo: float = 1.0) -> dict[str, object]:
        return {
            "scheduler": name,
            "cost_per_request": whole,
            "batch_cost_per_request": busy,
            "slo_hit_rate": slo,
            "p99_ms": 10.0,
        }

    # fast-gshare is cheaper on busy time, mine on the whole bill: the whole bill decides
    rows = [
        row("esg", 2.0e-6, 1.0e-6),
        row("esg-fastest", 1.0e-7, 1.0e-7),
        row("fast-gshare", 4.0e-6, 0.5e-6),
        row("mine", 3.0e-6, 0.9e-6),
        row("triton", 1.0e-7, 1.0e-7, slo=0.99),
    ]
    best = best_baseline(rows)
    assert best is not None and best["scheduler"] == "mine"
    head = headline(rows)
    assert head["best_baseline"] == "mine" and head["cost_ratio_with_idle"] == 1.5
    assert "the most SLOs (mine, the cheapest of 2 at 100.00%): 1.50x cheaper" in verdict(rows)[3]
    # named candidates only, as bench/scale.py passes them
    assert headline(rows, baselines=["fast-gshare"])["best_baseline"] == "fast-gshare"
    assert best_baseline(rows[:2]) is None
    with pytest.raises(ValueError, match="no baseline among the schedulers"):
        headline(rows[:2])


def test_compare_writes_into_a_folder_of_its_own_in_the_working_folder_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not bench/out/compare, a path of this repository that a user's working folder does not have."""
    from esg_prefect.simulator import standard_case

    path = tmp_path / "case.json"
    path.write_text(json.dumps(standard_case(rate_per_s=40.0, duration_s=2.0, warmup_s=0.5).to_dict()))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["compare", "--case", "case.json", "--schedulers", "triton", "--processes", "1"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "esg-compare" / "results.json").is_file() and not (tmp_path / "bench").exists()
    help_text = " ".join(CliRunner().invoke(app, ["compare", "--help"]).output.replace("│", " ").split())
    assert "(default: ./esg-compare in the working folder)" in help_text


def test_a_case_s_noisy_profile_is_named_before_it_is_planned_with(tmp_path: Path) -> None:
    """The profiler warns of rows timed beside other processes (``quiet`` 0) or that take less time at a bigger
    batch, but only as it writes them: a user's case then planned with them silently (a noisy profile made ESG
    the dearest scheduler on a user's CPU case, docs/decisions/whole-bill.md section 15)."""
    header = "stage,hardware,batch,vcpus,gpu_share,mean_ms,p95_ms,cold_start_ms,quiet\n"
    rows = ["m,cpu,1,1,0,4.0,5.0,200,0\n", "m,cpu,2,1,0,1.0,1.2,200,1\n", "m,cpu,4,1,0,1.8,2.0,200,1\n"]
    (tmp_path / "mine.csv").write_text(header + "".join(rows))
    case = {
        "name": "mine",
        "workflows": [{"name": "w", "stages": ["m"], "edges": [], "slo_ms": 500}],
        "profile": "mine.csv",
        "prices": {"price_per_vcpu_s": 1e-5, "price_per_gpu_s": {}},
        "cluster": [{"name": "n0", "vcpus": 2, "gpus": []}],
        "workload": {"trace": "poisson", "rate_per_s": 10},
        "duration_s": 2,
        "warmup_s": 0.5,
        "scheduler": "esg",
    }
    path = tmp_path / "case.json"
    path.write_text(json.dumps(case))
    result = CliRunner().invoke(app, ["simulate", "--case", str(path)], terminal_width=400)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "mine.csv: m: 1 of 3 points not quiet (cpu/1vcpu b1); time falls as the batch grows" in said
    assert "(cpu/1vcpu b1 4 ms -> b2 1 ms)" in said and "profile again on a quieter machine" in said
    (tmp_path / "mine.csv").write_text(header + "m,cpu,1,1,0,1.0,1.2,200,1\nm,cpu,2,1,0,1.5,1.8,200,1\n")
    quiet = CliRunner().invoke(app, ["simulate", "--case", str(path)], terminal_width=400)
    assert quiet.exit_code == 0 and "profile again" not in quiet.output


def test_a_case_slo_likely_in_seconds_is_warned_of_in_one_line_and_runs(tmp_path: Path) -> None:
    """``slo_ms: 0.5`` meant as half a second: Pipeline's rule and hint (seconds_slo_hint), not an error."""
    from esg_prefect.simulator import standard_case

    data = standard_case(rate_per_s=30.0, duration_s=2.0, warmup_s=0.5).to_dict()
    data["workflows"][0]["slo_ms"] = 0.5
    name = data["workflows"][0]["name"]
    path = tmp_path / "case.json"
    path.write_text(json.dumps(data))
    result = CliRunner().invoke(app, ["simulate", "--case", str(path)], terminal_width=80)
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if "slo_ms" in line]
    assert lines == [
        f"warning: workflow {name!r}: slo_ms=0.5 is 0.5 ms; slo_ms is in milliseconds: for 0.5 s write "
        "slo_ms=500 (the case runs as written)"
    ]
    data["workflows"][0]["slo_ms"] = 10  # the threshold: as Pipeline, no warning
    path.write_text(json.dumps(data))
    result = CliRunner().invoke(app, ["simulate", "--case", str(path)])
    assert result.exit_code == 0 and "slo_ms" not in result.output, result.output
