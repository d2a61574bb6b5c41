"""``esg-prefect simulate`` and ``esg-prefect compare``: the simulator from the command line.

``simulate`` runs one case (the standard case, changed by options, or a case
JSON file) and prints its report. ``compare`` runs the experiments E1-E7 of
ESG-SPEC section 8 over the schedulers, in parallel processes, and writes
``results.json``, ``tables.md`` and PNG plots into ``--out``. Both show a
progress bar. This module reads the wall clock (to time decisions and the
simulator's speed); the simulator it drives does not.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import replace
from multiprocessing import get_context
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

DEFAULT_OUT = Path("bench/out/compare")


class WallClock:
    """Monotonic wall clock in ms (a class, so it pickles into worker processes)."""

    def __call__(self) -> float:
        return time.perf_counter() * 1000.0


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5):
            return f"{v:.3g}"
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def print_table(console: Console, title: str, rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    """A rich table of ``columns`` of ``rows``."""
    table = Table(title=title)
    for c in columns:
        table.add_column(c)
    for r in rows:
        table.add_row(*(_fmt(r.get(c)) for c in columns))
    console.print(table)


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """The same table in Markdown."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(c)) for c in columns) + " |")
    return "\n".join(lines)


def _work(spec: Any) -> dict[str, Any]:
    from esg_prefect.simulator.experiments import run_spec

    return run_spec(spec, WallClock())


def spec_key(spec: Any) -> str:
    """A stable name of an experiment run, to resume an interrupted comparison.

    It ends with a digest of the case's ESG settings, so that a comparison run
    again with other settings (``--set``, or a changed default) is not answered
    from rows of the old ones.
    """
    digest = hashlib.sha1(json.dumps(spec.case.settings.to_dict(), sort_keys=True).encode()).hexdigest()[:10]
    return f"{spec.experiment}|{spec.case.scheduler}|{spec.seed}|{spec.case.name}|{dict(spec.labels)}|{digest}"


def run_parallel(
    specs: Sequence[Any], processes: int, progress: Progress | None = None, sink: Path | None = None
) -> list[dict[str, Any]]:
    """Run experiment specs in ``processes`` worker processes; rows in the order of ``specs``.

    With ``sink``, each row is appended to that JSON-lines file as soon as it is
    done, and rows already in it (same :func:`spec_key`) are reused instead of
    run again: an interrupted comparison resumes where it stopped.
    """
    done: dict[str, dict[str, Any]] = {}
    if sink is not None and sink.exists():
        for line in sink.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                done[row["key"]] = row
    keys = [spec_key(s) for s in specs]
    rows: list[dict[str, Any] | None] = [done.get(k) for k in keys]
    todo = [(i, s) for i, s in enumerate(specs) if rows[i] is None]
    task = progress.add_task("simulating", total=len(specs), completed=len(specs) - len(todo)) if progress else None

    def record(i: int, row: dict[str, Any]) -> None:
        row["key"] = keys[i]
        rows[i] = row
        if sink is not None:
            with open(sink, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(row, default=str) + "\n")
        if progress is not None and task is not None:
            progress.advance(task)
            progress.console.log(f"done {keys[i]} ({row.get('wall_s') or 0:.0f} s)")

    if processes <= 1:
        for i, spec in todo:
            record(i, _work(spec))
    elif todo:
        with get_context("fork").Pool(processes) as pool:
            for i, row in pool.imap_unordered(_indexed, todo):
                record(i, row)
    return [r for r in rows if r is not None]


def _indexed(item: tuple[int, Any]) -> tuple[int, dict[str, Any]]:
    return item[0], _work(item[1])


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )


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
RUN_COLUMNS = (
    "scheduler",
    "slo_hit_rate",
    "p99_ms",
    "batch_cost_per_request",
    "cost_per_request",
    "mean_batch",
    "cold_starts",
    "failed",
    "wall_s",
)


def _compare_case(
    case_file: Path, schedulers: str, seeds: int, processes: int, out: Path, sets: Sequence[str] = ()
) -> None:
    """Every scheduler on the user's case: the answer to "what would ESG save on my workload?"."""
    from esg_prefect.simulator import Case, plots
    from esg_prefect.simulator import experiments as ex

    case = with_settings(Case.from_dict(json.loads(case_file.read_text(encoding="utf-8"))), sets)
    names = tuple(s for s in schedulers.split(",") if s) or ex.DEFAULT_SCHEDULERS
    specs = [
        ex.RunSpec("case", case.with_(scheduler=s), seed, (("case", case.name),))
        for s in names
        for seed in range(seeds)
    ]
    out.mkdir(parents=True, exist_ok=True)
    console = Console()
    with _progress(console) as progress:
        rows = run_parallel(specs, processes or os.cpu_count() or 1, progress, out / "rows.jsonl")
    print_table(console, f"case {case.name!r}", rows, RUN_COLUMNS)
    result: dict[str, Any] = {"case": case.to_dict(), "rows": rows}
    md = [f"## case {case.name}\n\n" + markdown_table(rows, RUN_COLUMNS)]
    if "esg" in names and any(n in ex.PRIOR_WORK for n in names):
        head = ex.headline([r for r in rows if r["seed"] == 0])
        result["headline"] = head
        cols = ("best_baseline", "esg_slo", "baseline_slo", "slo_gain", "cost_ratio", "cost_ratio_with_idle")
        print_table(console, "ESG vs the best prior-work baseline", [head], cols)
        md.append(markdown_table([head], cols))
    plots.bars(rows, "case", out / "case.png", f"case {case.name}")
    (out / "results.json").write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")
    (out / "tables.md").write_text("\n\n".join(md) + "\n", encoding="utf-8")
    console.print(f"wrote {out / 'results.json'}, {out / 'tables.md'} and {out / 'case.png'}")


def with_settings(case: Any, pairs: Sequence[str]) -> Any:
    """``case`` with ESG settings overridden by ``KEY=VALUE`` pairs (``--set``).

    A value is read as JSON (``true``, ``0.25``, ``"p95"``, ``{...}``), else
    taken as a string, so that ``--set percentile=mean`` works unquoted. Unknown
    keys and bad values are refused by :class:`~esg_prefect.scheduling.ESGSettings`
    with the name and the value in the message.

    Raises:
        typer.BadParameter: on a pair without ``=`` or a setting refused.
    """
    from esg_prefect.exceptions import ConfigError
    from esg_prefect.scheduling import ESGSettings

    if not pairs:
        return case
    data = case.settings.to_dict()
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint="--set")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        data[key.strip()] = value
    try:
        settings = ESGSettings.from_dict(data)
    except (ConfigError, TypeError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--set") from None
    return replace(case, settings=settings)


def register(app: typer.Typer) -> None:
    """Add the ``simulate`` and ``compare`` commands."""

    @app.command("simulate")
    def simulate_cmd(
        scheduler: str = typer.Option("esg", "--scheduler", "-s", help="Registered scheduler name."),
        rate: float = typer.Option(300.0, help="Mean arrival rate, requests/s (standard case)."),
        trace: str = typer.Option("azure_functions_2019", help="Workload trace."),
        duration: float = typer.Option(60.0, help="Arrival window, s."),
        warmup: float = typer.Option(20.0, help="Leading seconds left out of the report."),
        tightness: float = typer.Option(5.0, help="SLO = tightness x batch-1 critical path on a T4."),
        profile: str = typer.Option("nvidia_gpu", help="Packaged profile name or CSV path."),
        seed: int = typer.Option(0, help="Seed of arrivals and service times."),
        case_file: Annotated[
            Path | None, typer.Option("--case", help="A case JSON file (overrides the options above).")
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
        import esg_prefect.scheduling  # noqa: F401 - registers the baselines
        from esg_prefect.simulator import Case, simulate, standard_case

        if case_file is not None:
            case = Case.from_dict(json.loads(case_file.read_text(encoding="utf-8")))
            case = case.with_(scheduler=scheduler) if scheduler != "esg" else case
        else:
            case = standard_case(
                scheduler,
                rate_per_s=rate,
                trace=trace,
                duration_s=duration,
                warmup_s=warmup,
                tightness=tightness,
                seed=seed,
                profile=profile,
            )
        case = with_settings(case, settings or [])
        console = Console(stderr=as_json)
        with _progress(console) as progress:
            task = progress.add_task(f"{case.scheduler} on {case.workload.trace}", total=1.0)
            clock = WallClock()
            t0 = clock()
            run = simulate(case, seed, clock=clock, progress=lambda f: progress.update(task, completed=f))
            wall = (clock() - t0) / 1000.0
        report = run.report
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / "case.json").write_text(json.dumps(case.to_dict(), indent=2), encoding="utf-8")
            (out / "report.json").write_text(json.dumps(report.to_dict(), indent=2), encoding="utf-8")
        if as_json:
            typer.echo(json.dumps(report.to_dict(), indent=2))
            return
        print_table(console, f"{case.scheduler}: {case.name} case, seed {seed}", report.rows(), REPORT_COLUMNS)
        stage_rows = [s.to_dict() for s in report.stages]
        cols = ("workflow", "stage", "jobs", "queue_ms", "cold_start_ms", "transfer_ms", "exec_ms", "mean_batch_size")
        print_table(console, "where the time goes (mean ms per job)", stage_rows, cols)
        speed = len(run.requests) / wall if wall > 0 else float("inf")
        in_decide = sum(run.decide_ms) / 1000.0
        console.print(
            f"{len(run.requests)} requests simulated in {wall:.1f} s ({speed:.0f} requests/s; "
            f"{in_decide:.1f} s inside the scheduler's decide over {run.rounds} rounds); "
            f"{run.cold_starts} workers started over the whole run, warm-up included ({run.prewarm_starts} "
            f"pre-warmed, {run.at_risk_cold_starts} for at-risk dispatches; the table's at_risk counts requests "
            f"after the warm-up); cost ${report.overall.cost_total:.4f} "
            f"(batches ${report.busy_cost:.4f}, idle ${report.idle_cost:.4f})"
        )

    @app.command("compare")
    def compare_cmd(
        experiment: str = typer.Option("all", help="Comma list of e1 e3 e4 e5 e6 e7, or all (E2 comes with E1)."),
        schedulers: str = typer.Option("", help="Comma list of schedulers (default: ESG, its ablations, prior work)."),
        loads: str = typer.Option("150,300,450,600", help="E1 loads, requests/s."),
        seeds: int = typer.Option(1, help="Seeds per simulated point."),
        quick: bool = typer.Option(False, help="Short runs and fewer decisions (a smoke test, minutes)."),
        processes: int = typer.Option(0, help="Worker processes (0: one per CPU)."),
        out: Annotated[Path, typer.Option(help="Output directory.")] = DEFAULT_OUT,
        case_file: Annotated[
            Path | None,
            typer.Option("--case", help="Compare the schedulers on this case JSON instead of running E1-E7."),
        ] = None,
        sets: list[str] = typer.Option(
            [],
            "--set",
            help="Override an ESG setting of every run, KEY=VALUE (repeat), e.g. --set keep_alive_by_price=false.",
        ),
    ) -> None:
        """Run experiments E1-E7 (or every scheduler on --case) and write results.json, tables.md and plots.

        Each finished simulation is appended to rows.jsonl in --out; running the
        same command again reuses those rows (delete the file to start afresh).
        """
        import esg_prefect.scheduling  # noqa: F401 - registers the baselines
        from esg_prefect.simulator import experiments as ex
        from esg_prefect.simulator import plots

        if case_file is not None:
            _compare_case(case_file, schedulers, seeds, processes, out, sets)
            return

        wanted = {"e1", "e3", "e4", "e5", "e6", "e7"} if experiment == "all" else set(experiment.lower().split(","))
        unknown = wanted - {"e1", "e2", "e3", "e4", "e5", "e6", "e7"}
        if unknown:
            raise typer.BadParameter(f"unknown experiments {sorted(unknown)}")
        if "e2" in wanted:
            wanted.add("e1")
        names = tuple(s for s in schedulers.split(",") if s) or ex.DEFAULT_SCHEDULERS
        load_values = tuple(float(x) for x in loads.split(",") if x)
        seed_list = tuple(range(seeds))
        procs = processes or os.cpu_count() or 1
        out.mkdir(parents=True, exist_ok=True)
        console = Console()
        results: dict[str, Any] = {"quick": quick, "schedulers": list(names)}
        md: list[str] = []
        clock = WallClock()
        n_dec = 40 if quick else 200

        with _progress(console) as progress:
            if "e3" in wanted:
                t = progress.add_task("E3 decision time", total=None)
                stages = (1, 2, 4, 8) if quick else (1, 2, 3, 4, 5, 6, 7, 8)
                rows = ex.decision_time(clock, stages=stages, n=n_dec)
                progress.update(t, completed=1, total=1)
                results["E3"] = rows
                plots.decision_time(rows, out / "e3_decision_time.png")
            if "e4" in wanted:
                t = progress.add_task("E4 pruning ablation", total=None)
                rows = ex.pruning_ablation(clock, n=n_dec // 2 if quick else 100)
                progress.update(t, completed=1, total=1)
                results["E4"] = rows
                plots.pruning(rows, out / "e4_pruning.png")
            if "e5" in wanted:
                t = progress.add_task("E5 DAG growth", total=None)
                sizes = ((2, 1), (3, 3)) if quick else ((2, 1), (2, 2), (3, 3), (3, 5), (4, 7))
                rows = ex.dag_growth(clock, sizes=sizes, n=n_dec // 2)
                progress.update(t, completed=1, total=1)
                results["E5"] = rows
                plots.dag_growth(rows, out / "e5_dag_growth.png")
            specs: list[Any] = []
            if "e1" in wanted:
                specs += ex.load_specs(names, load_values, seed_list, quick)
            if "e5" in wanted:
                specs += ex.horizon_specs(seed_list, quick)
            if "e6" in wanted:
                specs += ex.trace_specs(names, seed_list, quick) + ex.tightness_specs(
                    names, ex.TIGHTNESS, seed_list, quick
                )
            if "e7" in wanted:
                specs += ex.stall_specs(quick=quick)
            specs = [replace(s, case=with_settings(s.case, sets)) for s in specs]
            rows = run_parallel(specs, procs, progress, out / "rows.jsonl") if specs else []

        groups: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            groups.setdefault(r["experiment"], []).append(r)
        for key, rs in groups.items():
            results[key] = rs
        if "E1" in groups:
            plots.slo_and_cost(
                groups["E1"],
                "load",
                "load (requests/s)",
                out / "e1_e2_load.png",
                "E1/E2: SLO hit rate and cost vs load",
            )
            head = [
                {"load": load, **ex.headline([r for r in groups["E1"] if r["load"] == load and r["seed"] == 0])}
                for load in load_values
            ]
            results["E1-headline"] = head
            print_table(
                console,
                "E1/E2 headline: ESG vs the best prior-work baseline",
                head,
                ("load", "best_baseline", "esg_slo", "baseline_slo", "slo_gain", "cost_ratio", "cost_ratio_with_idle"),
            )
            md.append(
                "## E1/E2 headline\n\n"
                + markdown_table(
                    head,
                    (
                        "load",
                        "best_baseline",
                        "esg_slo",
                        "baseline_slo",
                        "slo_gain",
                        "cost_ratio",
                        "cost_ratio_with_idle",
                    ),
                )
            )
            for load in load_values:
                rs = [r for r in groups["E1"] if r["load"] == load]
                print_table(console, f"E1/E2 at {load:g} requests/s", rs, RUN_COLUMNS)
                md.append(f"## E1/E2 at {load:g} requests/s\n\n" + markdown_table(rs, RUN_COLUMNS))
        if "E6-trace" in groups:
            plots.bars(
                groups["E6-trace"], "trace_label", out / "e6_traces.png", "E6: bursty (code) vs steady (conv) arrivals"
            )
            print_table(console, "E6: traces", groups["E6-trace"], ("trace_label", *RUN_COLUMNS))
            md.append("## E6 traces\n\n" + markdown_table(groups["E6-trace"], ("trace_label", *RUN_COLUMNS)))
        if "E6-slo" in groups:
            plots.slo_and_cost(
                groups["E6-slo"],
                "tightness",
                "SLO / batch-1 critical path on a T4",
                out / "e6_tightness.png",
                "E6: SLO tightness sweep",
            )
            print_table(console, "E6: SLO tightness", groups["E6-slo"], ("tightness", *RUN_COLUMNS))
            md.append("## E6 SLO tightness\n\n" + markdown_table(groups["E6-slo"], ("tightness", *RUN_COLUMNS)))
        if "E5-sim" in groups:
            print_table(console, "E5: horizon in simulation", groups["E5-sim"], ("horizon", *RUN_COLUMNS))
            md.append("## E5 horizon in simulation\n\n" + markdown_table(groups["E5-sim"], ("horizon", *RUN_COLUMNS)))
        if "E7" in groups:
            st = ex.stall_rows(groups["E7"])
            results["E7-stalls"] = st
            plots.stalls(st, out / "e7_stalls.png")
            cols = (
                "scheduler",
                "workflow",
                "stage",
                "queue_ms",
                "cold_start_ms",
                "transfer_ms",
                "exec_ms",
                "mean_batch_size",
            )
            print_table(console, "E7: stall breakdown (mean ms per job)", st, cols)
            md.append("## E7 stall breakdown\n\n" + markdown_table(st, cols))
        for key, key_cols in (
            ("E3", ("space", "stages", "configs", "pareto_options", "p50_ms", "p99_ms", "mean_expansions")),
            ("E4", ("pruning", "p50_ms", "p99_ms", "mean_expansions", "max_rel_cost_diff_vs_none")),
            ("E5", ("dag", "dag_stages", "horizon", "horizon_stages", "p50_ms", "p99_ms", "mean_expansions")),
        ):
            if key in results:
                print_table(console, key, results[key], key_cols)
                md.append(f"## {key}\n\n" + markdown_table(results[key], key_cols))
        (out / "results.json").write_text(json.dumps(results, indent=1, default=str), encoding="utf-8")
        (out / "tables.md").write_text("\n\n".join(md) + "\n", encoding="utf-8")
        console.print(f"wrote {out / 'results.json'}, {out / 'tables.md'} and the plots in {out}")
