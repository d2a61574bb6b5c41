"""``esg-prefect demo``: pooled example pipelines with costs, then the same under Prefect's default runner."""

from __future__ import annotations

import math
import os
from typing import Any

import typer

from esg_prefect.exceptions import InvalidInputError
from esg_prefect.integration.api_check import check_prefect_api

WIDTH = 100
"""The demo's tables fit this many columns, and stay readable at 80."""


MAX_WINDOW_S = 3600.0
"""The longest arrival window the demo accepts: it runs in real time."""


def check_rate(rate: float, requests: int) -> None:
    """Refuse a ``--rate`` that is not a positive number, or that spreads the requests over more than an hour.

    Raises:
        InvalidInputError: naming the value.
    """
    if not (math.isfinite(rate) and rate > 0):
        raise InvalidInputError(f"--rate must be a finite number > 0 (requests per second), got {rate!r}")
    if requests / rate > MAX_WINDOW_S:
        raise InvalidInputError(
            f"--rate {rate:g} would spread {requests} requests over {requests / rate / 3600:.3g} h; the demo runs in "
            f"real time, so it takes rates that fit them in an hour (>= {requests / MAX_WINDOW_S:.3g} here)"
        )


def register(app: typer.Typer) -> None:
    """Add the ``demo`` command."""

    @app.command("demo")
    def demo(
        requests: int = typer.Option(120, help="Flow runs (requests) to start."),
        rate: float | None = typer.Option(
            None, help="Mean arrival rate, requests per second; default: calibrated to this machine."
        ),
        trace: str = typer.Option("azure_functions_2019", help="Arrival trace (see esg_prefect.workload)."),
        seed: int = typer.Option(0, min=0, help="Seed of the arrivals and inputs."),
        compare: bool = typer.Option(True, help="Also run the workload under Prefect's ThreadPoolTaskRunner."),
        backend: str = typer.Option("process", help="Workers: 'process' (worker processes) or 'inline' (threads)."),
        runs_shown: int = typer.Option(8, help="Flow runs listed with their cost."),
    ) -> None:
        """Run many concurrent flow runs of the example pipelines through ESG, and print SLO, batches and costs."""
        from rich.console import Console

        from esg_prefect.examples import calibration
        from esg_prefect.examples import demo as d

        # Every bad value is refused before quiet_prefect() changes this process's environment.
        if backend not in ("process", "inline"):
            raise InvalidInputError(f"--backend must be 'process' or 'inline', got {backend!r}")
        if requests < 1:
            raise InvalidInputError(f"--requests must be at least 1, got {requests}")
        if runs_shown < 0:
            raise InvalidInputError(f"--runs-shown must be 0 or more, got {runs_shown}")
        if rate is not None:
            check_rate(rate, requests)
        check_prefect_api(os.environ.get("PREFECT_API_URL"))
        d.demo_arrivals(requests, rate if rate is not None else 1.0, seed, trace)  # refuses a bad rate or trace

        console = Console(width=min(Console().width, WIDTH))
        busy = calibration.busy_machine_warning()
        if busy:
            console.print(f"[yellow]note:[/] {busy}", highlight=False)
        d.quiet_prefect()  # before prefect is imported: it reads its settings once

        from esg_prefect.examples.pipelines import SLO_MS

        console.print(
            f"[bold]esg-prefect demo[/]: {requests} requests of the image, text and video pipelines, arriving as in "
            f"the {trace} trace; end-to-end SLOs " + ", ".join(f"{n} {ms / 1000:g} s" for n, ms in SLO_MS.items()),
            highlight=False,
        )
        starting = "starting Prefect"
        if not os.environ.get("PREFECT_API_URL"):
            starting += " (a temporary API on an in-memory database: about 20 s)"
        with console.status(starting):
            d.warm_prefect()
        if rate is None:
            with console.status("calibrating: a few requests one at a time under Prefect's thread pool"):
                call = d.threadpool_call()
                with d.latency_settings():
                    d.warm_requests(call)
                    cal = calibration.calibrate(call, ("image", "text", "video"))
            rate = cal.rate_per_s
            console.print(cal.describe(), highlight=False)
        arrivals = d.demo_arrivals(requests, rate, seed, trace)
        runs = [_run(console, label, arrivals, backend) for label in (("esg", "threadpool") if compare else ("esg",))]
        _print_results(console, runs, runs_shown)


def _run(console: Any, label: str, arrivals: list[tuple[float, str]], backend: str) -> Any:
    """One runner's pass, with a progress bar that says when the unmeasured warm-up ends (none where the
    output is not a terminal, as for the other commands' bars)."""
    from esg_prefect.cli.progress import progress_bar
    from esg_prefect.examples import demo as d

    warm = "warm-up, not measured: one request per pipeline loads the models" + (
        " and starts workers" if label == "esg" else ""
    )
    with progress_bar(console, transient=False) as progress:
        bar = progress.add_task(f"[bold]{label}: {warm}", total=len(arrivals))

        def measured() -> None:
            progress.update(bar, description=f"[bold]{label:>10}")
            progress.reset(bar)

        def done(_: object) -> None:
            progress.advance(bar)

        if label == "esg":
            return d.run_esg(arrivals, done, backend, on_warm=measured)
        return d.run_threadpool(arrivals, done, on_warm=measured)


def _sec(ms: float) -> str:
    return f"{ms / 1000:.2f}"


def _print_results(console: Any, runs: list[Any], runs_shown: int) -> None:
    """The per-workflow table, ESG's batches and per-run costs, then the verdict lines."""
    from rich.table import Table

    from esg_prefect.examples import demo as d
    from esg_prefect.examples.catalog import PIPELINES
    from esg_prefect.examples.driver import percentile
    from esg_prefect.examples.pipelines import SLO_MS
    from esg_prefect.model.money import money_column, money_str

    unit = runs[0].cost_unit
    # Short headers and no padding at the edges: the table reads whole at 80 columns, with a cost of a
    # few millionths positional (ten characters).
    table = Table(
        title="Per pipeline: SLO met, latency from arrival to the flow's return, cost per run", pad_edge=False
    )
    for col in ("flow", "runner", "runs", "SLO s", "met", "p50 s", "p95 s", "batch", f"{unit}/run"):
        table.add_column(col, justify="left" if col in ("flow", "runner") else "right", no_wrap=True)
    rows: list[tuple[str, ...]] = []
    costs: list[float] = []  # the cost column, written in one notation once all its values are known
    for wf in PIPELINES:
        for run in runs:
            outs = [o for o in run.outcomes if o.workflow == wf]
            if not outs:
                continue
            lat = [o.latency_ms for o in outs if o.ok]
            hit = sum(1 for o in outs if o.ok and o.latency_ms <= SLO_MS[wf]) / len(outs)
            mean_batch = "-"
            if run.report is not None and wf in {g.name for g in run.report.workflows}:
                mean_batch = f"{run.report.workflow(wf).mean_batch_size:.1f}"
            wf_cost = sum(c.total for _, w, c in run.per_run_cost if w == wf) if run.per_run_cost else None
            costs.append(wf_cost / len(outs) if wf_cost is not None else run.cost_per_request)
            cells = (str(len(outs)), f"{SLO_MS[wf] / 1000:g}", f"{hit:.0%}")
            rows.append((wf, run.runner, *cells, _sec(percentile(lat, 50)), _sec(percentile(lat, 95)), mean_batch))
    for row, cost in zip(rows, money_column(costs), strict=True):
        table.add_row(*row, cost)
    console.print(table)
    esg = runs[0]
    if esg.report is not None:
        hist = Table(title="ESG's batches per stage")
        for col in ("pipeline/stage", "calls", "mean batch", "queue wait ms", "run ms (with cold starts)"):
            hist.add_column(col, justify="left" if col == "pipeline/stage" else "right")
        for st in esg.report.stages:
            hist.add_row(f"{st.workflow}/{st.stage}", str(st.jobs), f"{st.mean_batch_size:.1f}", f"{st.queue_ms:.0f}",
                         f"{st.exec_ms + st.cold_start_ms:.0f}")  # fmt: skip
        console.print(hist)
    if esg.per_run_cost and runs_shown:
        runs_table = Table(
            title=f"Cost of ESG's flow runs ({min(runs_shown, len(esg.per_run_cost))} of {len(esg.per_run_cost)}): "
            "busy time of its batches plus the idle time they caused, as its Prefect artifacts show"
        )
        runs_table.add_column("flow run")
        runs_table.add_column("pipeline")
        for name in (f"busy {unit}", f"idle {unit}", f"cost {unit}"):
            runs_table.add_column(name, justify="right")
        shown = esg.per_run_cost[:runs_shown]
        columns = [money_column([getattr(c, k) for _, _, c in shown]) for k in ("busy", "idle", "total")]
        for (rid, wf, _), *money in zip(shown, *columns, strict=True):
            runs_table.add_row(rid[:8], wf, *money)
        console.print(runs_table)
    for run in runs:
        ok = sum(o.ok for o in run.outcomes)
        console.print(
            f"{run.runner:>10}: {ok}/{len(run.outcomes)} requests ok in {run.wall_s:.1f} s "
            f"({ok / run.wall_s:.2f} requests/s), SLO met {run.slo_met:.0%}, "
            f"{'whole bill' if run.runner == 'esg' else 'calls billed'} {money_str(run.cost_total, unit)} "
            f"({money_str(run.cost_per_request, unit)}/request)",
            highlight=False,
        )
    if esg.batches:
        console.print(
            f"ESG ran {esg.batches} batches; {esg.mixed_batches} of them mixed calls of several flow runs",
            highlight=False,
        )
    if len(runs) == 2 and runs[0].cost_total > 0:
        console.print(d.verdict_line(runs[0], runs[1]), highlight=False)
        console.print(d.cost_ratio_line(runs[0], runs[1]), highlight=False)
    console.print(
        "ESG's runs are in the demo's own cost store, with its warm-up runs (one per pipeline, before"
        " the measured workload, and not in the figures above); to list them:",
        highlight=False,
    )
    console.print(
        f"  esg-prefect costs --url {d.demo_store_path()}",
        soft_wrap=True,  # a command to copy: never wrapped
        markup=False,
        highlight=False,
    )
