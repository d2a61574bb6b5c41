"""The README's first command, ``esg-prefect demo``, at a small scale: every request answered, costs that add up."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from esg_prefect.examples import demo
from esg_prefect.examples.demo import DemoRun, cost_ratio_line, verdict_line


def test_cost_ratio_line_compares_busy_time_and_total_separately() -> None:
    esg = DemoRun("esg", (), 1.0, cost_total=8.0, cost_busy=2.0)
    threadpool = DemoRun("threadpool", (), 1.0, cost_total=4.0, cost_busy=4.0)
    line = cost_ratio_line(esg, threadpool)
    assert "= 2.00 on the calls' busy time" in line
    assert "0.50 with ESG's warm idle workers billed" in line


def test_cost_ratio_line_without_esg_cost_says_so() -> None:
    esg = DemoRun("esg", (), 1.0, cost_total=0.0, cost_busy=0.0)
    threadpool = DemoRun("threadpool", (), 1.0, cost_total=4.0, cost_busy=4.0)
    assert cost_ratio_line(esg, threadpool).count("n/a") == 2


def test_demo_arrivals_come_from_the_trace_at_the_rate() -> None:
    arrivals = demo.demo_arrivals(60, 3.0, 0, "azure_functions_2019")
    assert len(arrivals) == 60
    times = [t for t, _ in arrivals]
    assert times == sorted(times)
    assert {wf for _, wf in arrivals} <= {"image", "text", "video"}
    span_s = (times[-1] - times[0]) / 1000.0
    assert 60 / 3.0 * 0.5 < span_s < 60 / 3.0 * 2.0  # about the requested rate, with the trace's own burstiness


@pytest.fixture
def restore_prefect_quiet() -> Iterator[None]:
    """The demo quiets Prefect for its process (environment, run loggers): undo that for the tests after it."""
    env = dict(os.environ)
    names = ("prefect", "prefect.flow_runs", "prefect.task_runs")
    levels = {n: logging.getLogger(n).level for n in names}
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(env)
        for n, level in levels.items():
            logging.getLogger(n).setLevel(level)


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness", "restore_prefect_quiet")
def test_demo_command_runs_both_runners_and_prints_costs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from esg_prefect.cli import app

    monkeypatch.setattr(demo, "demo_store_path", lambda: tmp_path / "demo-costs.db")  # not the user's PREFECT_HOME

    result = CliRunner().invoke(app, ["demo", "--requests", "6", "--rate", "3", "--backend", "inline"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert re.search(r"esg: 6/6 requests ok", out), out
    assert re.search(r"threadpool: 6/6 requests ok", out), out
    m = re.search(r"cost ratio threadpool / esg = ([0-9.]+) on the calls' busy time.*?; ([0-9.]+) with", out, re.S)
    assert m, out
    busy_ratio, total_ratio = float(m.group(1)), float(m.group(2))
    assert busy_ratio > 0 and total_ratio > 0
    # Idle keep-alive only adds to ESG's bill, so the ratio with it billed is never the larger one.
    assert total_ratio <= busy_ratio
    assert "Cost of ESG's flow runs" in out
    assert re.search(r"ESG ran \d+ batches; \d+ of them mixed calls of several flow runs", out), out
    assert re.search(r"ESG met \d+% of SLOs against the thread pool's \d+%", out), out
    assert "calibration" not in out  # --rate given: no calibration
    # The tables fit 100 columns; the one line that may not is a command to copy, with the store's path.
    assert max(len(line) for line in out.splitlines() if not line.startswith("  esg-prefect costs")) <= 100


def test_stages_outside_a_pool_run_where_the_user_says_else_on_a_visible_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from esg_prefect.integration.stage import local_device

    monkeypatch.delenv("ESG_PREFECT_LOCAL_DEVICE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert local_device() == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert local_device() == "cuda"
    monkeypatch.setenv("ESG_PREFECT_LOCAL_DEVICE", "cpu")
    assert local_device() == "cpu"


def test_a_local_call_on_a_gpu_is_billed_the_whole_gpu_too(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from esg_prefect.exceptions import PriceError
    from esg_prefect.integration import stage
    from esg_prefect.model.pricing import PriceSheet

    prices = PriceSheet.default()
    threads = torch.get_num_threads()
    monkeypatch.setattr(stage, "local_device", lambda: "cpu")
    assert demo.local_price_per_s(prices) == pytest.approx(threads * prices.price_per_vcpu_s)
    monkeypatch.setattr(stage, "local_device", lambda: "cuda")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda _d=None: "NVIDIA H100 80GB HBM3")
    expected = threads * prices.price_per_vcpu_s + 6.98 / 3600.0
    assert demo.local_price_per_s(prices) == pytest.approx(expected)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda _d=None: "NVIDIA Quadro Z9")
    with pytest.raises(PriceError, match="Quadro-Z9"):
        demo.local_price_per_s(prices)


def test_calibration_rate_is_a_fraction_of_cores_over_cpu_per_request(monkeypatch: pytest.MonkeyPatch) -> None:
    from esg_prefect.examples import calibration

    cpu = iter([10.0, 13.0])  # 3 CPU-s over the 6 requests served
    monkeypatch.setattr(calibration, "process_tree_cpu_s", lambda pids: next(cpu))
    served: list[tuple[int, str]] = []
    cal = calibration.calibrate(lambda i, wf: served.append((i, wf)), ("a", "b", "c"), rounds=2, fraction=0.8, cores=4)
    assert served == [(-100, "a"), (-101, "b"), (-102, "c"), (-103, "a"), (-104, "b"), (-105, "c")]
    assert cal.cpu_s_per_request == pytest.approx(0.5)
    assert cal.capacity_per_s == pytest.approx(8.0)  # 4 cores / 0.5 CPU-s
    assert cal.rate_per_s == pytest.approx(6.4)
    line = cal.describe()
    assert "0.50 CPU-s each" in line and "8.00 requests/s" in line and "6.40/s" in line and "--rate" in line


@pytest.mark.parametrize(("rounds", "fraction", "bad"), [(0, 0.9, "rounds"), (1, 0.0, "fraction"), (1, 1.5, "1.5")])
def test_calibration_refuses_bad_settings(rounds: int, fraction: float, bad: str) -> None:
    from esg_prefect.examples import calibration
    from esg_prefect.exceptions import InvalidInputError

    with pytest.raises(InvalidInputError, match=bad):
        calibration.calibrate(lambda i, wf: None, ("a",), rounds=rounds, fraction=fraction)


def test_a_busy_machine_is_named_before_the_demo(monkeypatch: pytest.MonkeyPatch) -> None:
    from esg_prefect.examples import calibration

    monkeypatch.setattr(os, "getloadavg", lambda: (5.5, 1.0, 1.0))
    warning = calibration.busy_machine_warning(cores=2)
    assert warning is not None and "load average 5.5 on 2 cores" in warning
    monkeypatch.setattr(os, "getloadavg", lambda: (1.5, 1.0, 1.0))
    assert calibration.busy_machine_warning(cores=2) is None


def test_the_verdict_compares_slo_met_and_cost_per_request() -> None:
    from esg_prefect.examples.driver import RequestOutcome

    def run(name: str, latencies: list[float], cost: float) -> DemoRun:
        outs = tuple(RequestOutcome(i, "text", 0.0, ms, True) for i, ms in enumerate(latencies))
        return DemoRun(name, outs, 1.0, cost, cost_busy=cost)

    esg = run("esg", [100.0, 200.0, 300.0, 9000.0], 4.0)  # 3 of 4 within text's 1.5 s SLO; 1.0 per request
    threads = run("threadpool", [100.0, 9000.0, 9000.0, 9000.0], 6.0)  # 1 of 4; 1.5 per request
    assert esg.slo_met == pytest.approx(0.75) and esg.cost_per_request == pytest.approx(1.0)
    line = verdict_line(esg, threads)
    assert "ESG met 75% of SLOs against the thread pool's 25% (more)" in line
    assert "1.50x cheaper per request (ESG billed for its workers' vCPUs while they compute" in line
    assert "1.50x dearer" in verdict_line(threads, esg)


def test_the_result_tables_read_whole_at_80_columns() -> None:
    from rich.console import Console

    from esg_prefect.cli.demo import _print_results
    from esg_prefect.examples.driver import RequestOutcome
    from esg_prefect.model.attribution import RunCost

    outs = tuple(RequestOutcome(i, wf, 0.0, 1234.5, True) for i, wf in enumerate(("image", "text", "video") * 3))
    per_run = tuple(
        (f"0f{i:06d}-aaaa-bbbb-cccc-dddddddddddd", o.workflow, RunCost(1.2345e-06, 3.4567e-05, "$"))
        for i, o in enumerate(outs)
    )
    esg = DemoRun("esg", outs, 10.0, 3.2e-4, None, per_run, 1.1e-5, "$", 40, 7)
    threads = DemoRun("threadpool", outs, 10.0, 1.9e-4, cost_busy=1.9e-4)
    console = Console(width=80, record=True, force_terminal=False)
    _print_results(console, [esg, threads], runs_shown=3)
    text = console.export_text()
    assert "…" not in text  # nothing cut
    assert "ESG ran 40 batches; 7 of them mixed calls of several flow runs" in text
    assert "$/run" in text and "cost $" in text  # every cost with its unit
    flat = " ".join(text.split())  # lines wrap at 80
    assert "esg: 9/9 requests ok" in flat and "whole bill $0.000320 ($0.0000356/request)" in flat
    assert "calls billed $0.000190" in flat  # the thread pool: its calls' own time
    assert "0.00000123 │ 0.0000346 │ 0.0000358" in flat  # a run's busy, idle and cost, as its artifacts write them


def test_a_cost_per_run_of_a_few_millionths_reads_whole_at_80_columns() -> None:
    """The demo's usual ESG cost per run (a few 1e-6, ten characters positional) is not cut to ``0.000003…``."""
    from rich.console import Console

    from esg_prefect.cli.demo import _print_results
    from esg_prefect.examples.driver import RequestOutcome
    from esg_prefect.model.attribution import RunCost

    outs = tuple(RequestOutcome(i, wf, 0.0, 1234.5, True) for i, wf in enumerate(("image", "text", "video") * 3))
    per_run = tuple((f"0f{i:06d}-aaaa", o.workflow, RunCost(1.2345e-06, 2.1e-06, "$")) for i, o in enumerate(outs))
    esg = DemoRun("esg", outs, 10.0, 3.0e-5, None, per_run, 1.1e-5, "$", 40, 7)
    threads = DemoRun("threadpool", outs, 10.0, 1.9e-4, cost_busy=1.9e-4)
    console = Console(width=80, record=True, force_terminal=False)
    _print_results(console, [esg, threads], runs_shown=3)
    text = console.export_text()
    assert "…" not in text
    assert "0.00000333" in text and "0.0000211" in text  # ESG's and the thread pool's $/run, whole


def test_the_demo_s_money_columns_keep_one_notation_across_1e_6() -> None:
    """A run's busy share of 5.86e-7 under another's of 1.07e-6: that column is written with exponents throughout
    (it read 0.00000107 above 5.86e-7); the idle and cost columns, all from 1e-6 up, stay positional. The $/run
    column of the pipeline table decides on its own values: video's 6.47e-7 puts image's 3.56e-5 in exponents."""
    from rich.console import Console

    from esg_prefect.cli.demo import _print_results
    from esg_prefect.examples.driver import RequestOutcome
    from esg_prefect.model.attribution import RunCost

    outs = tuple(RequestOutcome(i, wf, 0.0, 1234.5, True) for i, wf in enumerate(("image", *["video"] * 4)))
    per_run = (
        ("0f000000-aaaa-bbbb-cccc-dddddddddddd", "image", RunCost(1.0712e-06, 3.4567e-05, "$")),
        ("0f000001-aaaa-bbbb-cccc-dddddddddddd", "video", RunCost(5.861e-07, 2.0e-06, "$")),
    )
    esg = DemoRun("esg", outs, 10.0, 3.2e-4, None, per_run, 1.1e-5, "$", 40, 7)
    console = Console(width=200, record=True, force_terminal=False)
    _print_results(console, [esg], runs_shown=2)
    text = console.export_text()
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines() if line.startswith("│")]
    assert [c[-1] for c in cells if c[1] == "esg"] == ["3.56e-5", "6.47e-7"]  # $/run, per pipeline
    assert [c[2:] for c in cells if c[0].startswith("0f")] == [
        ["1.07e-6", "0.0000346", "0.0000356"],
        ["5.86e-7", "0.00000200", "0.00000259"],
    ]


@pytest.mark.parametrize("terminal", [False, True])
def test_the_demo_s_bars_are_off_where_the_output_is_not_a_terminal(
    monkeypatch: pytest.MonkeyPatch, terminal: bool
) -> None:
    """A pipe or a log gets no bar (it got each pass's finished bar, bar characters and all); a terminal keeps
    each pass's finished bar, as before. The runners are faked: each warms up, then finishes its three requests."""
    import io

    from rich.console import Console

    from esg_prefect.cli.demo import _run

    def fake_runner(arrivals: list[tuple[float, str]], on_done: Any, *_: object, on_warm: Any, **__: object) -> str:
        on_warm()
        for arrival in arrivals:
            on_done(arrival)
        return "ran"

    monkeypatch.setattr(demo, "run_esg", fake_runner)
    monkeypatch.setattr(demo, "run_threadpool", fake_runner)
    out = io.StringIO()
    console = Console(file=out, width=100, force_terminal=terminal)
    arrivals = [(0.0, "image"), (10.0, "text"), (20.0, "video")]
    assert [_run(console, label, arrivals, "inline") for label in ("esg", "threadpool")] == ["ran", "ran"]
    if terminal:
        finished = [line for line in out.getvalue().splitlines() if "3/3" in line]
        assert any("esg" in line for line in finished) and any("threadpool" in line for line in finished)
    else:
        assert out.getvalue() == ""


def test_the_temporary_apis_logging_config_is_prefects_with_sqlalchemy_quiet() -> None:
    """The file the demo points the temporary API at: Prefect's own config, read by Prefect, SQLAlchemy at CRITICAL."""
    from prefect.logging.configuration import DEFAULT_LOGGING_SETTINGS_PATH, load_logging_config

    from esg_prefect.examples.demo import quiet_sqlalchemy_logging

    path = quiet_sqlalchemy_logging()
    assert path.stat().st_mode & 0o077 == 0  # no other user may read or plant it: Prefect runs what it names
    assert path != quiet_sqlalchemy_logging()  # a new name each time, none to foresee
    ours, prefects = load_logging_config(path), load_logging_config(DEFAULT_LOGGING_SETTINGS_PATH)
    assert ours["loggers"].pop("sqlalchemy") == {"level": "CRITICAL"}
    assert ours == prefects  # nothing else changed, Prefect's settings filled in as in its own file
