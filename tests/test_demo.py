"""The README's first command, ``esg-prefect demo``, at a small scale: every request answered, costs that add up."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from esg_prefect.examples import demo
from esg_prefect.examples.demo import DemoRun, cost_ratio_line


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
def test_demo_command_runs_both_runners_and_prints_costs() -> None:
    from esg_prefect.cli import app

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
    assert "Cost per flow run" in out


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
