"""A user's mistake on the command line is one line naming the bad value and what is accepted, exit code 2.

Every command is covered: a bad value, an unknown name, a missing file (a
Prefect API, pool service or database that does not answer: test_cli_unreachable.py).
The commands run in this process through :func:`esg_prefect.cli.main`, the flow
scripts as subprocesses; none of the refusals starts a simulation, a server or a pool.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from esg_prefect.cli import main
from tests.prefect_server import free_port

REPO = Path(__file__).resolve().parents[1]
UNSET_TOKEN = "ESG_PREFECT_TEST_TOKEN_NEVER_SET"


def _one_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        # simulate: the value and the accepted range or names
        (["simulate", "--scheduler", "nonexistent", "--duration", "1"], ("'nonexistent'", "known: esg")),
        (["simulate", "--rate", "-5", "--duration", "1"], ("--rate", "-5.0", "finite number > 0")),
        (["simulate", "--rate", "abc"], ("--rate", "'abc'", "valid number")),
        (["simulate", "--duration", "-1"], ("--duration", "-1.0", "finite number > 0")),
        (["simulate", "--warmup", "-1"], ("--warmup", "-1.0", "finite number >= 0")),
        (["simulate", "--warmup", "100"], ("--warmup", "must be below --duration (60 s), got 100")),
        (["simulate", "--duration", "1e9"], ("--duration", "3e+11 requests", "at most 1e+08")),
        (["simulate", "--tightness", "0"], ("--tightness", "0.0", "finite number > 0")),
        (["simulate", "--case", "/nonexistent.json"], ("--case", "'/nonexistent.json'", "case JSON file")),
        (["simulate", "--trace", "nope", "--duration", "1"], ("--trace", "'nope'", "azure_functions_2019", "csv:")),
        (
            ["simulate", "--profile", "nonexistent", "--duration", "1"],
            ("--profile", "'nonexistent'", "nvidia_gpu", "nor a file"),
        ),
        (["simulate", "--set", "keep_alive_by_price"], ("--set", "KEY=VALUE", "'keep_alive_by_price'")),
        (["simulate", "--set", "no_such_knob=1"], ("--set", "no_such_knob", "known")),
        (["simulate", "--set", "config_space=abc"], ("--set", "config_space", '{"batches": [1, 2, 4]', "'abc'")),
        (["simulate", "--set", 'config_space={"batch": [1]}'], ("--set", "config_space", "(bad: batch)")),
        (["simulate", "--set", "idle_vcpus=yes"], ("--set", "got 'yes'", "JSON or a Python literal: true/True")),
        # demo
        (["demo", "--rate", "-1"], ("--rate must be a finite number > 0 (requests per second), got -1.0",)),
        (["demo", "--rate", "0"], ("--rate must be a finite number > 0", "got 0.0")),
        (["demo", "--rate", "nan"], ("--rate must be a finite number > 0", "got nan")),
        (["demo", "--rate", "0.01"], ("--rate 0.01 would spread 120 requests over 3.33 h", ">= 0.0333 here")),
        (["demo", "--trace", "nope"], ("unknown trace 'nope'", "known")),
        (["demo", "--requests", "0"], ("--requests must be at least 1, got 0",)),
        (["demo", "--runs-shown", "-2"], ("--runs-shown must be 0 or more, got -2",)),
        (["demo", "--backend", "gpu"], ("'gpu'", "'process' or 'inline'")),
        (["demo", "--seed", "-1"], ("--seed", "greater than or equal to 0", "'-1'")),
        (["simulate", "--seed", "-1"], ("--seed", "greater than or equal to 0", "'-1'")),
        # compare
        (["compare", "--experiment", "e9"], ("--experiment", "e9", "known: e1")),
        (["compare", "--loads", "150,abc"], ("--loads", "'150,abc'", "> 0")),
        (["compare", "--seeds", "0"], ("--seeds", "0", "at least 1")),
        (["compare", "--processes", "-1"], ("--processes", "-1", "0 (one per CPU) or more")),
        (["compare", "--schedulers", "esg,nope"], ("--schedulers", "'nope'", "known: esg")),
        (
            ["compare", "--schedulers", ""],
            ("Invalid value for --schedulers: give at least one scheduler name, got ''",),
        ),
        (["compare", "--schedulers= , "], ("--schedulers: give at least one scheduler name", "got ' , '")),
        (["compare", "--case", "/nonexistent.json"], ("--case", "'/nonexistent.json'", "case JSON file")),
        (["compare", "--experiment", "e1", "--quick", "--set", "no_such_knob=1"], ("--set", "no_such_knob")),
        # costs (more in tests/test_costs_cli.py)
        (["costs", "--limit", "-1"], ("--limit", "-1", "0 (all) or more")),
        (["costs", "--url", "/nonexistent/costs.db"], ("--url", "/nonexistent/costs.db", "SQLite file")),
        # profile
        (["profile", "--vcpus", "0"], ("--vcpus", "'0'", ">= 1")),
        (["profile", "--batches", "x"], ("--batches", "'x'", "integers")),
        (["profile", "--quick", "--batches", "0"], ("--batches", "'0'", "integers >= 1")),
        (["profile", "--quick", "--batches", "1,4"], ("--quick is the smoke test", "none of --batches")),
        (["profile", "--max-attempts", "0"], ("--max-attempts", ">= 1", "got 0")),
        (["profile", "--utilisation", "0"], ("--utilisation", "(0, 1.5]", "0.0")),
        (["profile", "--co-runners", "0"], ("--co-runners", "at least 1", "got 0")),
        (["profile", "--trace", "nope"], ("--trace", "'nope'", "azure_llm_conv")),
        (["profile", "--fit-sizes", "/nonexistent.csv"], ("--fit-sizes", "'/nonexistent.csv'", "samples CSV")),
        (["profile", "--stalls", "/nonexistent.csv"], ("--stalls", "'/nonexistent.csv'", "stall-breakdown CSV")),
        # pool serve: refused before any worker, pool or server starts
        (["pool", "serve", "--allow", "x", "--port", "-1"], ("--port", "-1", "0 to 65535")),
        (["pool", "serve", "--allow", "x", "--backend", "gpu"], ("--backend", "'gpu'", "'process', 'inline' or 'ray'")),
        (["pool", "serve", "--allow", "x", "--scheduler", "nope"], ("--scheduler", "'nope'", "known: esg")),
        (["pool", "serve", "--allow", "x", "--profile", "/nonexistent.csv"], ("--profile", "/nonexistent.csv", "CSV")),
        (["pool", "serve", "--allow", "x", "--results-ttl-s", "0"], ("--results-ttl-s", "0.0", "> 0")),
        (["pool", "serve", "--allow", "x", "--max-pending", "0"], ("--max-pending", "got 0", "at least 1")),
        (["pool", "serve", "--allow", "x", "--log-level", "loud"], ("--log-level", "got 'loud'", "info")),
        (
            ["pool", "serve", "--allow", "x", "--host", "0.0.0.0", "--token-env", UNSET_TOKEN],
            ("--host", "'0.0.0.0'", f"${UNSET_TOKEN} (--token-env) is not set"),
        ),
        (
            ["pool", "serve", "--allow", "x", "--ssl-certfile", "/none.pem", "--ssl-keyfile", "/none.pem"],
            ("--ssl-certfile", "'/none.pem'", "PEM file"),
        ),
        (["pool", "serve"], ("Missing option", "--allow")),
        (["pool", "serve", "--allow", "x", "--store", "mysql://a"], ("--store", "scheme 'mysql'")),
        (["pool", "serve", "--allow", ""], ("--allow", "give a module prefix", "got ''")),
        (["pool", "serve", "--allow", "tests", "--allow", " "], ("--allow", "got ' '")),
        (["pool", "serve", "--allow", "x", "--hung-batch-s", "-1"], ("--hung-batch-s", "-1", "0: no limit")),
        (["pool", "serve", "--allow", "x", "--set", "keep_alive_s=-3"], ("--set", "keep_alive_s", "-3")),
        (["pool", "serve", "--allow", "x", "--set", "no_such_knob=1"], ("--set", "no_such_knob", "known")),
        # a shipped profile of other stages for the standard case: was "no profile covers stage 'resnet50' on 'T4'"
        (["simulate", "--profile", "examples_cpu"], ("'examples_cpu'", "no T4 timings", "resnet50", "--case")),
        # was "gpu_shares must be in (0, 1], got [2.0]", naming no option
        (["profile", "--gpu-shares", "0.5,2", "--quick"], ("--gpu-shares", "(0, 1]", "got '0.5,2'")),
        # schedulers
        (["schedulers", "--json", "--markdown"], ("--json", "--markdown", "one of them")),
    ],
)
def test_bad_values_are_one_line_and_exit_2(
    argv: list[str], named: tuple[str, ...], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(UNSET_TOKEN, raising=False)
    assert main(argv) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("esg-prefect: error:"), line
    assert all(n in line for n in named), line


@pytest.mark.parametrize(
    ("content", "named"),
    [
        (None, ("cannot read", "IsADirectoryError", "case JSON file")),
        ("{not json", ("is not JSON", "line 1", "case JSON file")),
        ("[1, 2]", ("holds a JSON list, not an object",)),
        ('{"name": "x"}', ("is not a valid case", "missing the key")),
        ('{"name": "x", "flavour": 1}', ("is not a valid case", "unknown case keys ['flavour']")),
        ('{"name": "x", "workflows": "abc"}', ("the case's 'workflows' must be a list, got str 'abc'",)),
        ('{"name": "x", "cluster": [5]}', ("the case's 'cluster[0]' must be an object, got int 5",)),
        ('{"name": "x", "prices": []}', ("the case's 'prices' must be an object, got list []",)),
        ('{"name": "x", "seed": 1.5}', ("the case's 'seed' must be an integer >= 0, got float 1.5",)),
        ('{"name": "x", "seed": -1}', ("the case's 'seed' must be an integer >= 0, got int -1",)),
        ('{"name": "x", "seed": true}', ("the case's 'seed' must be an integer >= 0, got bool True",)),
        ('{"name": "x", "seed": null}', ("the case's 'seed' must be an integer >= 0, got NoneType None",)),
        ('{"name": "x", "seed": [1]}', ("the case's 'seed' must be an integer >= 0, got list [1]",)),
        ('{"name": "x", "seed": "3"}', ("the case's 'seed' must be an integer >= 0, got str '3'",)),
    ],
)
@pytest.mark.parametrize("command", ["simulate", "compare"])
def test_a_bad_case_file_is_one_line_naming_it(
    command: str,
    content: str | None,
    named: tuple[str, ...],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "case.json"
    if content is None:
        path.mkdir()
    else:
        path.write_text(content)
    assert main([command, "--case", str(path), "--out", str(tmp_path / "out")]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "--case" in line and repr(str(path)) in line and all(n in line for n in named), line
    assert not (tmp_path / "out").exists()  # refused before anything was written


def _wf(**changes: object) -> dict[str, object]:
    return {"name": "w", "stages": ["a", "b"], "edges": [["a", "b"]], "slo_ms": 200, **changes}


@pytest.mark.parametrize(
    ("change", "named"),
    [
        # each was read on: a string as its letters ("T4": GPUs 'T' and '4'), a price key
        # misspelt ignored, the others a Python error (a traceback, or "not enough values to unpack")
        ({"cluster": [{"name": "n", "vcpus": 4, "gpus": "T4"}]}, "'cluster[0].gpus' must be a list, got str 'T4'"),
        ({"workflows": [_wf(stages="ab")]}, "'workflows[0].stages' must be a list, got str 'ab'"),
        ({"workflows": [_wf(edges="a->b")]}, "'workflows[0].edges' must be a list, got str 'a->b'"),
        ({"workflows": [_wf(edges=["ab"])]}, "'workflows[0].edges' must hold [upstream, downstream] pairs, got 'ab'"),
        ({"workflows": [{"name": "w", "stages": ["a"], "edges": []}]}, "'workflows[0]' is missing the key 'slo_ms'"),
        ({"prices": {"price_per_vcpu_s": 1e-5, "price_per_gpu_s": {}, "price_per_vcpu": 1}}, "['price_per_vcpu']"),
        ({"prices": {"price_per_vcpu_s": 1e-5, "price_per_gpu_s": [1]}}, "'prices.price_per_gpu_s' must be an object"),
        ({"prices": {"price_per_vcpu_s": 1e-5}}, "'prices' is missing the key 'price_per_gpu_s'"),
        ({"workload": {"rate_per_s": 3}}, "'workload' is missing the key 'trace'"),
        ({"profile": 3}, "'profile' must be a non-empty string, got int 3"),
        ({"name": ""}, "'name' must be a non-empty string, got str ''"),
    ],
)
def test_a_case_file_part_of_the_wrong_shape_is_named(
    change: dict[str, object], named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from esg_prefect.simulator import standard_case

    path = tmp_path / "case.json"
    path.write_text(json.dumps({**standard_case(duration_s=2.0).to_dict(), **change}))
    assert main(["simulate", "--case", str(path)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "--case" in line and "is not a valid case" in line and named in line, line


@pytest.mark.parametrize(
    ("weights", "named"),
    [
        # the first three were refused only as the arrivals were drawn, without naming --case
        ("[1.0]", "weights has 1 values for 3 workflows (one per workflow, in the case's order: ['image-classify',"),
        ("[0, 0, 0]", "weights must have a positive sum (some workflow must get requests), got [0.0, 0.0, 0.0]"),
        ("[1, 1, Infinity]", "weights must be a list of finite numbers >= 0, one per workflow"),
        ("[1, 1, NaN]", "weights must be a list of finite numbers >= 0, one per workflow"),
        ("[-1, 1, 1]", "weights must be a list of finite numbers >= 0, one per workflow"),
    ],
)
@pytest.mark.parametrize("command", ["simulate", "compare"])
def test_a_case_files_bad_weights_are_refused_as_the_case_is_loaded(
    command: str, weights: str, named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from esg_prefect.simulator import standard_case

    path = tmp_path / "case.json"
    text = json.dumps(standard_case(duration_s=2.0).to_dict())  # Infinity and NaN as Python's json reads them
    assert '"weights": null' in text
    path.write_text(text.replace('"weights": null', f'"weights": {weights}'))
    assert main([command, "--case", str(path), "--out", str(tmp_path / "out")]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "--case" in line and "is not a valid case: workload: " in line and named in line, line
    assert not (tmp_path / "out").exists()


def test_a_case_file_with_an_unknown_scheduler_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from esg_prefect.simulator import standard_case

    path = tmp_path / "case.json"
    path.write_text(json.dumps({**standard_case(duration_s=2.0).to_dict(), "scheduler": "nope"}))
    assert main(["simulate", "--case", str(path)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "--case" in line and "'nope'" in line and "known: esg" in line


def test_a_case_files_relative_trace_is_read_beside_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from esg_prefect.simulator import standard_case

    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "arrivals.csv").write_text("arrival_s\n" + "\n".join(f"{i * 0.05:.2f}" for i in range(40)) + "\n")
    case = standard_case(trace="csv:arrivals.csv", rate_per_s=20.0, duration_s=2.0, warmup_s=0.5).to_dict()
    (folder / "case.json").write_text(json.dumps(case))
    monkeypatch.chdir(tmp_path)  # elsewhere: the trace is not in the working directory
    assert main(["simulate", "--case", "mine/case.json", "--json"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["overall"]["count"] > 0


@pytest.mark.parametrize("how", ["simulate --trace", "simulate --case", "compare --case"])
def test_a_csv_trace_with_all_arrivals_at_one_time_is_one_line_naming_it(
    how: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from esg_prefect.simulator import standard_case

    same = tmp_path / "same.csv"
    same.write_text("arrival_s\n1\n1\n1\n")  # a span of 0 s: no rate to replay it at
    case = tmp_path / "case.json"
    case.write_text(json.dumps(standard_case(trace=f"csv:{same}", rate_per_s=5.0, duration_s=2.0).to_dict()))
    argv = {
        "simulate --trace": ["simulate", "--duration", "2", "--trace", f"csv:{same}"],
        "simulate --case": ["simulate", "--case", str(case)],
        "compare --case": ["compare", "--case", str(case), "--schedulers", "esg,triton", "--out", str(tmp_path / "o")],
    }[how]
    assert main(argv) == 2
    line = _one_line(capsys.readouterr().err)
    assert line == f"esg-prefect: error: {same}: all 3 arrivals are at 1 s; a trace needs arrivals at two or more times"


def test_a_case_files_negative_start_s_is_refused_before_any_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from esg_prefect.simulator import standard_case

    trace = tmp_path / "mine.csv"
    trace.write_text("arrival_s\n0\n1\n")
    data = standard_case(trace=f"csv:{trace}", rate_per_s=5.0, duration_s=2.0).to_dict()
    data["workload"]["start_s"] = -5
    (tmp_path / "case.json").write_text(json.dumps(data))
    assert main(["simulate", "--case", str(tmp_path / "case.json")]) == 2
    line = _one_line(capsys.readouterr().err)  # no "note: your trace ... replayed" above it
    assert "--case" in line and "workload: start_s must be a finite number >= 0, got -5" in line, line


def test_profile_of_a_stage_without_its_samples_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["profile", "-t", "tests.toy_stages:inc", "--quick", "--no-store", "--out-dir", str(tmp_path)]
    assert main(argv) == 2  # not a ParameterBindError traceback from calling the stage's task
    assert _one_line(capsys.readouterr().err) == (
        "esg-prefect: error: 'tests.toy_stages:inc' is a stage; give its samples: 'module:stage@module:samples' "
        "('tests.toy_stages:inc@<module>:<samples>', samples(rng, n) returning n inputs)"
    )


def test_profile_of_a_target_that_does_not_import_is_one_line_with_no_blank_above(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Raised under the progress bar, the error came after an empty line: rich's bar, stopped on a console
    that is not a terminal, prints one."""
    argv = ["profile", "-t", "no_module_xyz:x", "--quick", "--no-store", "--out-dir", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("esg-prefect: error: cannot import module 'no_module_xyz' of target"), repr(err)
    assert err.count("\n") == 1, repr(err)


def test_fit_sizes_on_a_profile_csv_names_the_missing_columns_and_the_file_it_wants(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "mine.csv"  # a latency profile, not its _samples.csv
    path.write_text("stage,hardware,batch,vcpus,gpu_share,mean_ms,p95_ms,cold_start_ms\nx,cpu,1,1,0,5,6,100\n")
    assert main(["profile", "--fit-sizes", str(path)]) == 2
    assert _one_line(capsys.readouterr().err) == (
        f"esg-prefect: error: Invalid value for --fit-sizes: {path}: missing columns ['latency_ms', 'total_size']; "
        "give a samples CSV (<name>_samples.csv, one row per timed call, written by esg-prefect profile); "
        "its header: ['stage', 'hardware', 'batch', 'vcpus', 'gpu_share', 'mean_ms', 'p95_ms', 'cold_start_ms']"
    )


@pytest.mark.parametrize(
    ("column", "value", "says"),
    [
        ("batch", "2.5", "an integer"),
        ("vcpus", "two", "an integer"),
        ("gpu_share", "half", "a number"),
        ("total_size", "big", "a number"),
        ("latency_ms", "5ms", "a number"),
    ],
)
def test_fit_sizes_names_the_column_of_a_bad_config_value(
    column: str, value: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It said only "invalid literal for int() with base 10: '2.5'", naming neither the column nor the table."""
    row = {"stage": "x", "hardware": "cpu", "batch": "1", "vcpus": "1", "gpu_share": "0", "total_size": "3"}
    row["latency_ms"] = "5"
    row[column] = value
    path = tmp_path / "mine_samples.csv"
    path.write_text(",".join(row) + "\n" + ",".join(row.values()) + "\n")
    assert main(["profile", "--fit-sizes", str(path)]) == 2
    assert _one_line(capsys.readouterr().err) == (
        f"esg-prefect: error: Invalid value for --fit-sizes: {path} line 2: {column} must be {says}, got {value!r}"
    )


def test_profile_warns_in_one_line_of_vcpus_beyond_the_machines(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import esg_prefect.cli.profile as profile_cli

    runs: list[tuple[int, ...]] = []
    monkeypatch.setattr(profile_cli, "_run_cli", lambda **kw: runs.append(kw["vcpus"]))  # no measuring
    monkeypatch.setattr(profile_cli.os, "cpu_count", lambda: 2)
    assert main(["profile", "--vcpus", "1,16,64"]) == 0
    assert _one_line(capsys.readouterr().err) == (
        "esg-prefect: warning: --vcpus 16,64 exceeds this machine's 2 CPUs: those rows time 64 threads "
        "sharing 2 cores, not a 64-vCPU worker"
    )
    assert main(["profile", "--vcpus", "1,2"]) == 0
    assert capsys.readouterr().err == ""
    assert runs == [(1, 16, 64), (1, 2)]  # warned, not refused


def test_pool_serve_takes_a_shipped_profile_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    port = str(free_port())
    # Past the profile, the next check fails: a results file in a folder that does not exist.
    bad_db = str(tmp_path / "no" / "such" / "results.db")
    argv = ["pool", "serve", "--allow", "x", "--port", port, "--profile", "nvidia_gpu", "--results-db", bad_db]
    assert main(argv) == 2
    assert "--results-db" in _one_line(capsys.readouterr().err)  # the profile was taken
    assert main(["pool", "serve", "--allow", "x", "--port", port, "--profile", "nvidia"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "--profile" in line and "'nvidia'" in line and "shipped profile's name (examples_cpu, nvidia_gpu, " in line


def test_standard_case_options_beside_a_case_file_are_refused_not_ignored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from esg_prefect.simulator import standard_case

    path = tmp_path / "case.json"
    path.write_text(json.dumps(standard_case(duration_s=2.0).to_dict()))
    assert main(["simulate", "--case", str(path), "--rate", "5", "--tightness", "3"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "--rate, --tightness: for the standard case only" in line and "workload.rate_per_s" in line
    assert main(["simulate", "--case", str(path), "--seed", "3", "--json"]) == 0  # what a case file can take


@pytest.mark.parametrize("command", [["simulate", "--duration", "2"], ["compare", "--experiment", "e1", "--quick"]])
def test_an_output_path_that_is_a_file_is_refused_before_any_run(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import esg_prefect.simulator as sim

    afile = tmp_path / "afile"
    afile.write_text("kept")
    calls: list[object] = []
    monkeypatch.setattr(sim, "simulate", lambda *a, **k: calls.append(a))
    assert main([*command, "--out", str(afile)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "--out" in line and repr(str(afile)) in line and "is a file" in line, line
    assert calls == [] and afile.read_text() == "kept"


@pytest.mark.parametrize(
    ("extra", "named"),
    [(["--experiment", "e3"], "--experiment"), (["--loads", "150"], "--loads"), (["--quick"], "--quick")],
)
def test_compare_refuses_experiment_options_beside_a_case(
    extra: list[str], named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from esg_prefect.simulator import standard_case

    path = tmp_path / "case.json"
    path.write_text(json.dumps(standard_case(duration_s=2.0).to_dict()))
    assert main(["compare", "--case", str(path), *extra, "--out", str(tmp_path / "out")]) == 2
    line = _one_line(capsys.readouterr().err)
    assert named in line and "only for experiments E1-E7" in line, line
    assert not (tmp_path / "out").exists()


def test_usage_errors_are_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schedulers", "--nope"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "No such option: --nope" in line and "esg-prefect schedulers --help" in line


def test_no_arguments_show_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2  # typer's convention for no_args_is_help
    out = capsys.readouterr()
    assert "simulate" in out.out + out.err and "error" not in out.err


def test_a_good_command_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schedulers"]) == 0
    assert "esg" in capsys.readouterr().out


def test_a_refused_demo_leaves_this_process_as_it_was(capsys: pytest.CaptureFixture[str]) -> None:
    # The demo quiets Prefect through the environment: a bad value must be refused before that,
    # or a test process that ran the command would lose Prefect's run logs afterwards.
    before = dict(os.environ)
    for argv in (["demo", "--requests", "0"], ["demo", "--rate", "-1"], ["demo", "--trace", "nope"]):
        assert main(argv) == 2
    assert dict(os.environ) == before


@pytest.mark.parametrize("script", sorted(p.name for p in (REPO / "flows").glob("*.py")))
def test_flow_scripts_refuse_a_bad_request_count_in_one_line(script: str) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "flows" / script), "--requests", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 2
    line = _one_line(done.stderr)
    assert "--requests must be at least 1, got 0" in line


@pytest.mark.parametrize("target", ["refuses_on_import:stage@refuses_on_import:samples", "refuses_on_import:targets"])
def test_profile_says_a_targets_module_refused_something_as_it_was_imported(
    target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """It said only "no profile file 'profile'": the module had built ESGTaskRunner(profile=sys.argv[1])."""
    (tmp_path / "refuses_on_import.py").write_text(
        "from esg_prefect.exceptions import InvalidInputError\nraise InvalidInputError(\"no profile file 'profile'\")\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["profile", "-t", target, "--quick", "--no-store", "--out-dir", str(tmp_path)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("esg-prefect: error: importing module 'refuses_on_import' of "), line
    assert line.endswith("failed: no profile file 'profile'"), line
