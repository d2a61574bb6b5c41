"""``esg-prefect compare``: the schedulers side by side in the simulator, with the whole bill.

It runs the experiments E1-E7 of ESG-SPEC section 8 (or every scheduler on
the user's ``--case``) in parallel processes, and writes ``results.json``,
``tables.md`` and PNG plots into ``--out``. Each run's row carries its whole
bill per request split three ways, busy + idle + cold start
(:func:`~esg_prefect.cli.bill_plot.bill_split`), and the bar plots stack
those three per scheduler, so a scheduler that saves on batches but pays for
idle workers shows it. Every option is checked before
anything runs; finished runs are kept in ``rows.jsonl`` so an interrupted
comparison resumes, by the same code only (:mod:`esg_prefect.cli.rows_file`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from multiprocessing import get_context
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress

from esg_prefect.cli.args import check_scheduler, make_out_dir, with_settings
from esg_prefect.cli.bill_plot import BILL, bill_bars, bill_split, label_of
from esg_prefect.cli.case_file import given_options, load_case, note_case
from esg_prefect.cli.progress import WallClock, progress_bar
from esg_prefect.cli.rows_file import CODE_FIELD, case_files, code_stamp, file_digests, reusable_rows
from esg_prefect.cli.tables import markdown_table, print_table
from esg_prefect.cli.verdict import verdict

DEFAULT_OUT = Path("esg-compare")
"""Where ``compare`` writes when no ``--out`` is given: a folder of its own in the working folder."""
DEFAULT_LOADS = "150,300,450,600"
EXPERIMENTS = ("e1", "e2", "e3", "e4", "e5", "e6", "e7")
RUN_COLUMNS = (
    "scheduler",
    "slo_hit_rate",
    "p99_ms",
    "cost_per_request",
    *BILL,
    "mean_batch",
    "cold_starts",
    "failed",
    "wall_s",
)
STALL_COLUMNS = ("queue_ms", "cold_start_ms", "transfer_ms", "exec_ms", "mean_batch_size")


def run_row(spec: Any, clock: Any = None) -> dict[str, Any]:
    """Simulate ``spec``: the row of :func:`~esg_prefect.simulator.experiments.run_spec` plus its whole bill."""
    from esg_prefect.simulator import simulate
    from esg_prefect.simulator.experiments import spec_row

    t0 = clock() if clock is not None else 0.0
    run = simulate(spec.case, spec.seed)
    wall_s = (clock() - t0) / 1000.0 if clock is not None else None
    return {**spec_row(spec, run, wall_s), **bill_split(run, spec.case)}


def _work(spec: Any) -> dict[str, Any]:
    return run_row(spec, WallClock())


def spec_key(spec: Any, digests: Mapping[str, str] | None = None) -> str:
    """A stable name of an experiment run, to resume an interrupted comparison (kept in rows.jsonl, not shown).

    It ends with a digest of the whole case (rate, trace, cluster, prices,
    workflows, settings) and of the contents of the user's files it reads (a
    CSV trace, a profile CSV: :func:`~esg_prefect.cli.rows_file.case_files`), so
    that a comparison run again on another case with the same name, with other
    settings (``--set``, a changed default), or with a file edited in place, is
    not answered from rows of the old one. ``digests``: the files' digests by
    path (:func:`~esg_prefect.cli.rows_file.file_digests`), read here when not given.
    """
    case = spec.case.to_dict()
    files = case_files(spec.case)
    if files:
        known = digests if digests is not None else file_digests(files)
        case["file_digests"] = {path: known[path] for path in files}
    digest = hashlib.sha1(json.dumps(case, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"{spec.experiment}|{spec.case.scheduler}|{spec.seed}|{spec.case.name}|{dict(spec.labels)}|{digest}"


def spec_label(spec: Any) -> str:
    """What a user reads of a run: ``E1 at 300 requests/s: esg, seed 0``."""
    where = "".join(f" {label_of(k, v)}" for k, v in spec.labels)
    return f"{spec.experiment}{where}: {spec.case.scheduler}, seed {spec.seed}"


def run_parallel(
    specs: Sequence[Any],
    processes: int,
    progress: Progress | None = None,
    sink: Path | None = None,
    reuse: bool = True,
) -> list[dict[str, Any]]:
    """Run experiment specs in ``processes`` worker processes; rows in the order of ``specs``.

    With ``sink``, each row is appended to that JSON-lines file as soon as it is
    done, and rows already in it are reused instead of run again: an interrupted
    comparison resumes where it stopped. A row is reused only when it is the same
    run (:func:`spec_key`) computed by the same code (its
    :func:`~esg_prefect.cli.rows_file.code_stamp`: the version and a digest of the
    package); others are run again, and one line says so. ``reuse=False``
    (``--fresh``) empties the file first.
    """
    digests = file_digests(path for s in specs for path in case_files(s.case))  # each file read once
    keys = [spec_key(s, digests) for s in specs]
    stamp = code_stamp()
    done: dict[str, dict[str, Any]] = {}
    if sink is not None and not reuse:
        sink.unlink(missing_ok=True)
    if sink is not None:
        done = reusable_rows(sink, stamp, set(keys), BILL, lambda text: _say(progress, text))
    rows: list[dict[str, Any] | None] = [done.get(k) for k in keys]
    todo = [(i, s) for i, s in enumerate(specs) if rows[i] is None]
    task = progress.add_task("simulating", total=len(specs), completed=len(specs) - len(todo)) if progress else None
    if progress is not None and sink is not None and len(todo) < len(specs):
        progress.console.print(
            f"reusing {len(specs) - len(todo)} of {len(specs)} runs already in {sink} (--fresh runs them again)",
            highlight=False,
        )

    def record(i: int, row: dict[str, Any]) -> None:
        row["key"], row[CODE_FIELD] = keys[i], stamp
        rows[i] = row
        if sink is not None:
            with open(sink, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(row, default=str) + "\n")
        if progress is not None and task is not None:
            progress.advance(task)
            progress.console.print(f"done {spec_label(specs[i])} ({row.get('wall_s') or 0:.0f} s)", highlight=False)

    if processes <= 1:
        for i, spec in todo:
            record(i, _work(spec))
    elif todo:
        with get_context("fork").Pool(processes) as pool:
            for i, row in pool.imap_unordered(_indexed, todo):
                record(i, row)
    return [r for r in rows if r is not None]


def _say(progress: Progress | None, text: str) -> None:
    """A line above the progress bar, or on stderr without one."""
    if progress is not None:
        progress.console.print(text, highlight=False)
    else:
        typer.echo(text, err=True)


def _indexed(item: tuple[int, Any]) -> tuple[int, dict[str, Any]]:
    return item[0], _work(item[1])


# ---- the command ---------------------------------------------------------------------------------


RATIO_NOTE = (
    "cost ratios are best baseline / ESG: above 1, ESG is cheaper "
    "(cost_ratio: batches alone; cost_ratio_with_idle: the whole bill)"
)
"""The line under a headline table: which way its ratios read (``headline()``'s keys stay as they are)."""


def _scheduler_list(text: str, given: bool = False) -> tuple[str, ...]:
    """The schedulers ``--schedulers`` names, each once in the order given; the default list when not ``given``.

    Raises:
        typer.BadParameter: for an unknown name, or a value given that names none (``--schedulers ""``).
    """
    from esg_prefect.simulator import experiments as ex

    names = tuple(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    if not names:
        if given:
            raise typer.BadParameter(f"give at least one scheduler name, got {text!r}", param_hint="--schedulers")
        names = ex.DEFAULT_SCHEDULERS
    for name in names:
        check_scheduler(name, "--schedulers")
    return names


def _loads(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        values = ()
    if not values or any(not (math.isfinite(v) and v > 0) for v in values):
        raise typer.BadParameter(
            f"must be comma-separated finite numbers > 0 (requests/s), got {text!r}", param_hint="--loads"
        )
    return values


def _check_counts(seeds: int, processes: int) -> None:
    if seeds < 1:
        raise typer.BadParameter(f"must be at least 1, got {seeds}", param_hint="--seeds")
    if processes < 0:
        raise typer.BadParameter(f"must be 0 (one per CPU) or more, got {processes}", param_hint="--processes")


def _compare_case(
    case_file: Path,
    names: Sequence[str],
    seeds: int,
    processes: int,
    out: Path,
    sets: Sequence[str] = (),
    fresh: bool = False,
) -> None:
    """Every scheduler on the user's case: the answer to "what would ESG save on my workload?".

    ``seeds`` runs start at the case's own seed (``seed``, ``seed + 1``, ...), as ``simulate --case``
    runs it; the headline and the sentences compare the runs of that first seed.
    """
    from esg_prefect.simulator import experiments as ex

    case = with_settings(load_case(case_file), sets)
    specs = [
        ex.RunSpec("case", case.with_(scheduler=s), seed, (("case", case.name),))
        for s in names
        for seed in range(case.seed, case.seed + seeds)
    ]
    make_out_dir(out)
    console = Console()
    note_case(case, console)
    with progress_bar(console) as progress:
        rows = run_parallel(specs, processes or os.cpu_count() or 1, progress, out / "rows.jsonl", not fresh)
    columns = RUN_COLUMNS if seeds == 1 else ("scheduler", "seed", *RUN_COLUMNS[1:])  # rows told apart
    print_table(console, f"case {case.name!r}", rows, columns, keys=1 if seeds == 1 else 2)
    result: dict[str, Any] = {"case": case.to_dict(), "rows": rows}
    md = [f"## case {case.name}\n\n" + markdown_table(rows, columns)]
    first = [r for r in rows if r["seed"] == case.seed]
    only = f"the runs of seed {case.seed} only, the case's own (the table above has all {seeds} seeds, "
    only += "case.png their means)"
    if seeds > 1:
        console.print(f"Below: {only}.", highlight=False)
    if "esg" in names and ex.best_baseline(first) is not None:
        head = ex.headline(first)
        result["headline"] = head
        cols = ("best_baseline", "esg_slo", "baseline_slo", "slo_gain", "cost_ratio", "cost_ratio_with_idle")
        print_table(console, "ESG vs the best baseline", [head], cols)
        console.print(RATIO_NOTE, highlight=False, soft_wrap=True)
        md.append(markdown_table([head], cols) + f"\n\n{RATIO_NOTE}" + (f"; {only}" if seeds > 1 else ""))
    for line in verdict(first):
        console.print(line, highlight=False)
    bill_bars(rows, "case", out / "case.png", f"case {case.name}")
    (out / "results.json").write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")
    (out / "tables.md").write_text("\n\n".join(md) + "\n", encoding="utf-8")
    console.print(f"wrote {out / 'results.json'}, {out / 'tables.md'} and {out / 'case.png'}")


def register(app: typer.Typer) -> None:
    """Add the ``compare`` command."""

    # typer prints each paragraph of the docstring with its line breaks: one line each.
    @app.command("compare")
    def compare_cmd(
        ctx: typer.Context,
        experiment: str = typer.Option("all", help="Comma list of e1 e3 e4 e5 e6 e7, or all (E2 comes with E1)."),
        schedulers: str = typer.Option(
            "",
            help="Comma list of schedulers (default: esg, esg-fastest, esg-noshare, esg-greedy and the prior-work "
            "baselines; any other registered one only when named here).",
        ),
        loads: str = typer.Option(DEFAULT_LOADS, help="E1 loads, requests/s."),
        seeds: int = typer.Option(
            1, help="Seeds per simulated point: 0, 1, ...; with --case, the case's seed and the next ones."
        ),
        quick: bool = typer.Option(False, "--quick", help="Short runs and fewer decisions (a smoke test, minutes)."),
        processes: int = typer.Option(0, help="Worker processes (0: one per CPU)."),
        out: Annotated[
            Path,
            typer.Option(
                help="Output directory, created if missing (default: ./esg-compare in the working folder).",
                show_default=False,
            ),
        ] = DEFAULT_OUT,
        case_file: Annotated[
            Path | None,
            typer.Option("--case", help="Compare the schedulers on this case JSON instead of running E1-E7."),
        ] = None,
        fresh: bool = typer.Option(
            False, "--fresh", help="Run every simulation again, reusing none kept in --out (rows.jsonl)."
        ),
        sets: list[str] = typer.Option(
            [],
            "--set",
            help="Override an ESG setting of every run, KEY=VALUE (repeat), e.g. --set keep_alive_by_price=false.",
        ),
    ) -> None:
        """Run experiments E1-E7 (or the schedulers on --case) and write results.json, tables.md and plots.

        Each finished simulation is appended to rows.jsonl in --out; the same command run by the same code reuses them.
        """
        from esg_prefect.simulator import experiments as ex
        from esg_prefect.simulator import plots

        _check_counts(seeds, processes)
        names = _scheduler_list(schedulers, given=bool(given_options(ctx, ["schedulers"])))
        if case_file is not None:
            ignored = [
                f"--{n}" for n, on in (("experiment", experiment != "all"), ("loads", loads != DEFAULT_LOADS)) if on
            ]
            ignored += ["--quick"] if quick else []
            if ignored:
                raise typer.BadParameter(
                    f"{', '.join(ignored)}: only for experiments E1-E7; --case runs its own case as it is",
                    param_hint="--case",
                )
            _compare_case(case_file, names, seeds, processes, out, sets, fresh)
            return

        wanted = {"e1", "e3", "e4", "e5", "e6", "e7"} if experiment == "all" else set(experiment.lower().split(","))
        unknown = wanted - set(EXPERIMENTS)
        if unknown:
            raise typer.BadParameter(
                f"unknown experiments {', '.join(sorted(unknown))}; known: {', '.join(EXPERIMENTS)} or all",
                param_hint="--experiment",
            )
        if "e2" in wanted:
            wanted.add("e1")
        load_values = _loads(loads)
        seed_list = tuple(range(seeds))
        specs: list[Any] = []
        if "e1" in wanted:
            specs += ex.load_specs(names, load_values, seed_list, quick)
        if "e5" in wanted:
            specs += ex.horizon_specs(seed_list, quick)
        if "e6" in wanted:
            specs += ex.trace_specs(names, seed_list, quick) + ex.tightness_specs(names, ex.TIGHTNESS, seed_list, quick)
        if "e7" in wanted:
            specs += ex.stall_specs(quick=quick)
        specs = [replace(s, case=with_settings(s.case, sets)) for s in specs]  # a bad --set is refused before any run
        procs = processes or os.cpu_count() or 1
        make_out_dir(out)
        console = Console()
        results: dict[str, Any] = {"quick": quick, "schedulers": list(names)}
        md: list[str] = []
        clock = WallClock()
        n_dec = 40 if quick else 200

        with progress_bar(console) as progress:
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
            rows = run_parallel(specs, procs, progress, out / "rows.jsonl", not fresh) if specs else []

        groups: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            groups.setdefault(r["experiment"], []).append(r)
        for key, rs in groups.items():
            results[key] = rs
        if "E1" in groups:
            _report_e1(console, groups["E1"], load_values, out, results, md)
        if "E6-trace" in groups:
            bill_bars(groups["E6-trace"], "trace_label", out / "e6_traces.png", "E6: bursty (code) vs steady (conv)")
            print_table(console, "E6: traces", groups["E6-trace"], ("trace_label", *RUN_COLUMNS), keys=2)
            md.append("## E6 traces\n\n" + markdown_table(groups["E6-trace"], ("trace_label", *RUN_COLUMNS)))
        if "E6-slo" in groups:
            plots.slo_and_cost(
                groups["E6-slo"],
                "tightness",
                "SLO / batch-1 critical path on a T4",
                out / "e6_tightness.png",
                "E6: SLO tightness sweep",
            )
            print_table(console, "E6: SLO tightness", groups["E6-slo"], ("tightness", *RUN_COLUMNS), keys=2)
            md.append("## E6 SLO tightness\n\n" + markdown_table(groups["E6-slo"], ("tightness", *RUN_COLUMNS)))
        if "E5-sim" in groups:
            print_table(console, "E5: horizon in simulation", groups["E5-sim"], ("horizon", *RUN_COLUMNS), keys=2)
            md.append("## E5 horizon in simulation\n\n" + markdown_table(groups["E5-sim"], ("horizon", *RUN_COLUMNS)))
        if "E7" in groups:
            st = ex.stall_rows(groups["E7"])
            results["E7-stalls"] = st
            plots.stalls(st, out / "e7_stalls.png")
            cols = ("scheduler", "workflow", "stage", *STALL_COLUMNS)
            print_table(console, "E7: stall breakdown (mean ms per job)", st, cols, keys=3)
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


def _report_e1(
    console: Console,
    rows: list[dict[str, Any]],
    load_values: Sequence[float],
    out: Path,
    results: dict[str, Any],
    md: list[str],
) -> None:
    """E1/E2's plots and tables: SLO and batch cost against load, the whole bill per load, the headline."""
    from esg_prefect.simulator import experiments as ex
    from esg_prefect.simulator import plots

    plots.slo_and_cost(
        rows, "load", "load (requests/s)", out / "e1_e2_load.png", "E1/E2: SLO hit rate and cost vs load"
    )
    bill_bars(rows, "load", out / "e1_bill.png", "E1 by load")
    head = [
        {"load": load, **ex.headline([r for r in rows if r["load"] == load and r["seed"] == 0])} for load in load_values
    ]
    results["E1-headline"] = head
    cols = ("load", "best_baseline", "esg_slo", "baseline_slo", "slo_gain", "cost_ratio", "cost_ratio_with_idle")
    print_table(console, "E1/E2 headline: ESG vs the best prior-work baseline", head, cols)
    console.print(RATIO_NOTE, highlight=False, soft_wrap=True)
    md.append("## E1/E2 headline\n\n" + markdown_table(head, cols) + f"\n\n{RATIO_NOTE}")
    for load in load_values:
        rs = [r for r in rows if r["load"] == load]
        print_table(console, f"E1/E2 at {load:g} requests/s", rs, RUN_COLUMNS)
        md.append(f"## E1/E2 at {load:g} requests/s\n\n" + markdown_table(rs, RUN_COLUMNS))
