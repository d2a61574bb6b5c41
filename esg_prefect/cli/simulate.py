"""``esg-prefect simulate``: one case in the simulator, from the command line, and its report.

It runs the standard case (changed by options) or a case JSON file, under a
progress bar, and prints the report's tables and a summary line. Every option
is checked before the progress bar starts, so that a bad value is the only
line printed. The checks and ``--set`` are :mod:`esg_prefect.cli.args`, the
progress bar and the wall clock :mod:`esg_prefect.cli.progress` (shared with
the other commands); the tables are :mod:`esg_prefect.cli.tables`, reading a
case file :mod:`esg_prefect.cli.case_file`. This module reads the wall clock
(to time decisions and the simulator's speed); the simulator it drives does not.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from esg_prefect.cli.args import check_number, check_profile, check_scheduler, check_trace, make_out_dir, with_settings
from esg_prefect.cli.bill_plot import bill_totals
from esg_prefect.cli.case_file import (
    CASE_KEYS,
    case_dict_in,
    given_options,
    load_case,
    note_case,
    note_csv_replay,
    note_noisy_profile,
)
from esg_prefect.cli.progress import WallClock, progress_bar
from esg_prefect.cli.tables import print_table

if TYPE_CHECKING:
    from esg_prefect.control.core import Core
    from esg_prefect.simulator.case import Case
    from esg_prefect.simulator.controller import Controller


REPORT_COLUMNS = (
    "workflow",
    "requests",
    "failed",
    "slo_hit_rate",
    "p50_ms",
    "p99_ms",
    "cost_per_request",
    "batch_cost_per_request",
    "mean_batch",
    "decision_p50_ms",
    "decision_p99_ms",
    "at_risk",
)


def summary_line(run: Any, case: Any, wall_s: float) -> str:
    """The line under ``simulate``'s tables: speed, worker starts, best-effort dispatches and the bill.

    Worker starts are counted over the whole run, warm-up included, while the
    table's ``at_risk`` counts requests of the report's window (after the
    warm-up); so the line gives the best-effort (at-risk) requests over the
    whole run too, next to the worker starts they caused, and says which
    figure the table shows: the counts cannot seem to contradict each other.
    """
    report = run.report
    n = len(run.requests)
    speed = n / wall_s if wall_s > 0 else float("inf")
    in_decide = sum(run.decide_ms) / 1000.0
    at_risk_all = sum(1 for r in run.requests if r.at_risk)
    return (
        f"{n} requests simulated in {wall_s:.1f} s ({speed:.0f} requests/s; {in_decide:.1f} s inside the "
        f"scheduler's decide over {run.rounds} rounds). Workers started over the whole run, warm-up included: "
        f"{run.cold_starts} ({run.prewarm_starts} pre-warmed, {run.at_risk_cold_starts} for best-effort dispatches, "
        f"which no plan fitted in the slack). Requests with a best-effort stage (at_risk): {at_risk_all} over the "
        f"whole run, {report.overall.at_risk} after the {case.warmup_s:g} s warm-up (the table). "
        + bill_note(run, case)
        + _overhead_note(case)
    )


def bill_note(run: Any, case: Any) -> str:
    """The whole bill after the warm-up, split as ``compare``'s rows split it: busy excl. cold + idle + cold starts.

    The table's rows carry busy with cold starts included (the report's, per
    workflow); cold starts are split out for the whole run only, here.
    """
    from esg_prefect.model.attribution import COST_UNIT
    from esg_prefect.model.money import money_column

    part = bill_totals(run, case)
    whole, busy, idle, cold = money_column(
        [run.report.overall.cost_total, part["busy"], part["idle"], part["cold_start"]], COST_UNIT
    )
    return (
        f"Cost after the warm-up: {whole}, the whole bill: busy excl. cold {busy} + idle {idle} + cold starts "
        f"{cold} (the table's busy incl. cold = busy excl. cold + cold starts). "
    )


def _overhead_note(case: Case) -> str:
    """What the latencies include of the orchestrator's own time (docs/simulator.md)."""
    sim = case.sim
    if sim.run_overhead_ms or sim.call_overhead_ms:
        return (
            f"Latencies include the orchestrator's overheads set in the case: {sim.run_overhead_ms:g} ms before a "
            f"request's first calls, {sim.call_overhead_ms:g} ms before each call."
        )
    return (
        "Latencies run from a request's arrival at the pool: Prefect's own overheads are not in them "
        "(sim.run_overhead_ms and sim.call_overhead_ms model them: docs/simulator.md)."
    )


BACKLOG_S = 2.0
"""Queued calls worth this many seconds of the case's arrivals (and at least ``BACKLOG_MIN``) mean the cluster is far
past capacity: the run slows as the queues grow, and ``simulate`` says so once, with the knob that bounds them."""
BACKLOG_MIN = 500


class BacklogHint:
    """Watches a run's queues from its progress callback; prints one note if they hold seconds of arrivals."""

    def __init__(self, case: Case, console: Console) -> None:
        self.console = console
        self.limit = max(BACKLOG_MIN, BACKLOG_S * case.workload.rate_per_s)
        self.armed = case.settings.shed_after_slo == 0
        self.core: Core | None = None

    def attach(self, controller: Controller) -> None:
        """``simulate``'s ``instrument`` hook: keep the run's control core."""
        self.core = controller.core

    def check(self) -> None:
        """Print the note once, the first time the queued calls pass the limit (with shedding off)."""
        if self.armed and self.core is not None and self.core.waiting > self.limit:
            self.armed = False
            self.console.print(
                f"note: {self.core.waiting} calls are queued, over {BACKLOG_S:g} s of arrivals: the cluster is far "
                "past capacity and the run slows as the queues grow; --set shed_after_slo=3 fails the calls still "
                "queued 3x their SLO after their request arrived",
                highlight=False,
            )


MAX_REQUESTS = 1e8
"""The most requests one simulated run may hold (each is kept until the report)."""


def register(app: typer.Typer) -> None:
    """Add the ``simulate`` command."""

    @app.command("simulate")
    def simulate_cmd(
        ctx: typer.Context,
        scheduler: str | None = typer.Option(
            None, "--scheduler", "-s", help="Registered scheduler name (default: esg; with --case, the case's)."
        ),
        rate: float = typer.Option(300.0, help="Mean arrival rate, requests/s (standard case)."),
        trace: str = typer.Option(
            "azure_functions_2019",
            help="Workload trace: azure_functions_2019, azure_llm_code, azure_llm_conv, alibaba_genai_2026, "
            "poisson, or csv:<file> (columns arrival_s[,workflow], rescaled to --rate).",
        ),
        duration: float = typer.Option(60.0, help="Arrival window, s."),
        warmup: float | None = typer.Option(
            None, help="Leading seconds left out of the report (default 20, at most half the run)."
        ),
        tightness: float = typer.Option(
            5.0, help="SLO = tightness x the batch-1 critical path on a whole T4 (p95), rounded up to 10 ms."
        ),
        profile: str = typer.Option(
            "nvidia_gpu", help="A shipped profile's name or a CSV path (a name wins: ./NAME for a file of that name)."
        ),
        seed: int | None = typer.Option(
            None, min=0, help="Seed of arrivals and service times (default: 0; with --case, the case's)."
        ),
        case_file: Annotated[
            Path | None,
            typer.Option(
                "--case",
                help="A case JSON file (replaces --rate, --trace, --duration, --warmup, --tightness and --profile; "
                "--scheduler and --seed, when given, override its own).",
            ),
        ] = None,
        out: Annotated[Path | None, typer.Option(help="Directory for case.json and report.json.")] = None,
        as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
        settings: Annotated[
            list[str] | None,
            typer.Option(
                "--set",
                help="Override an ESG setting, KEY=VALUE (repeat), e.g. --set keep_alive_by_price=false.",
            ),
        ] = None,
    ) -> None:
        """Simulate one case and print its report (the standard case unless --case is given)."""
        from esg_prefect.simulator import simulate, standard_case
        from esg_prefect.simulator.standard import STANDARD_WARMUP_S

        if scheduler is not None:
            check_scheduler(scheduler)
        if case_file is not None:
            given = given_options(ctx, CASE_KEYS)
            if given:
                raise typer.BadParameter(
                    f"{', '.join(f'--{o}' for o in given)}: for the standard case only; with --case set "
                    f"{', '.join(CASE_KEYS[o] for o in given)} in the case file",
                    param_hint="--case",
                )
            case = load_case(case_file)
            # Only what was given overrides the case: its own scheduler and seed otherwise.
            case = case.with_(scheduler=scheduler) if scheduler is not None else case
            case = case.with_(seed=seed) if seed is not None else case
            check_scheduler(case.scheduler, "--case")
        else:
            check_number(rate, "--rate", "mean requests/s")
            check_number(duration, "--duration", "arrival window, s")
            if warmup is not None:
                check_number(warmup, "--warmup", "s left out of the report", zero_ok=True)
            if rate * duration > MAX_REQUESTS:
                raise typer.BadParameter(
                    f"{duration:g} s at {rate:g} requests/s is {rate * duration:.3g} requests; one run holds its "
                    f"requests in memory: at most {MAX_REQUESTS:.0e} (split the window into several runs)",
                    param_hint="--duration",
                )
            if warmup is not None and warmup >= duration:
                raise typer.BadParameter(
                    f"must be below --duration ({duration:g} s), got {warmup:g}", param_hint="--warmup"
                )
            check_number(tightness, "--tightness", "SLO / batch-1 critical path")
            check_trace(trace)
            check_profile(profile)
            case = standard_case(
                scheduler or "esg",
                rate_per_s=rate,
                trace=trace,
                duration_s=duration,
                warmup_s=STANDARD_WARMUP_S if warmup is None else warmup,
                tightness=tightness,
                seed=0 if seed is None else seed,
                profile=profile,
            )
        case = with_settings(case, settings or [])
        if out is not None:
            make_out_dir(out)
        console = Console(stderr=as_json)
        if case_file is not None:
            note_case(case, console)
        else:
            note_csv_replay(case, console, from_file=False)
            note_noisy_profile(profile, console)
        if case_file is None and warmup is not None and case.warmup_s != warmup:
            console.print(
                f"note: the warm-up is at most half the run: {case.warmup_s:g} s, not {warmup:g}", highlight=False
            )
        with progress_bar(console) as progress:
            task = progress.add_task(f"{case.scheduler} on {case.workload.trace}", total=1.0)
            clock = WallClock()
            t0 = clock()
            hint = BacklogHint(case, console)

            def step(f: float) -> None:
                progress.update(task, completed=f)
                hint.check()

            run = simulate(case, case.seed, clock=clock, progress=step, instrument=hint.attach)
            wall = (clock() - t0) / 1000.0
        report = run.report
        if out is not None:
            (out / "case.json").write_text(json.dumps(case_dict_in(case, out), indent=2), encoding="utf-8")
            (out / "report.json").write_text(json.dumps(report.to_dict(), indent=2), encoding="utf-8")
        if as_json:
            typer.echo(json.dumps(report.to_dict(), indent=2))
            return
        print_table(console, f"{case.scheduler}: {case.name} case, seed {case.seed}", report.rows(), REPORT_COLUMNS)
        stage_rows = [s.to_dict() for s in report.stages]
        cols = ("workflow", "stage", "jobs", "queue_ms", "cold_start_ms", "transfer_ms", "exec_ms", "mean_batch_size")
        print_table(console, "where the time goes (mean ms per job)", stage_rows, cols, keys=2)
        console.print(summary_line(run, case, wall))
