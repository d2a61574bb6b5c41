"""The scale case (issue #25): does ESG's control plane keep up with a fleet, and what does partitioning cost?

The case (esg_prefect/simulator/scale.py): 1,000 GPUs (664 T4, 168 V100, 168
A100 on eight-GPU nodes), 100 workflows of 2-8 stages drawn with a fixed seed
from the six published-profile DNN models and the twelve measured example
stages (chains and DAGs; SLO 5x the batch-1 critical path), arrivals from the
Azure Functions 2019 sample (workflow i plays the i-th most-invoked http
function, the whole sample scaled by one factor) at 10,000 requests/s for
120 s, the first 20 s a warm-up left out of the figures.

Decision time is the control core's own time: its admissions, its rounds
(snapshot, the scheduler's ``decide``, applying the decisions) and its worker
bookkeeping (esg_prefect/simulator/timed.py), not the simulator's event loop,
callers and service-time draws. It is read from the process's CPU-time clock
(``--clock cpu``, the default): on a core of its own that is the wall time,
and on a shared machine it leaves out the time spent waiting for a core
(``--clock wall`` reads the wall clock instead). The scheduler gets no clock,
so decisions are those of an untimed run. With ``--partitions K`` the case runs as K
independent controllers (esg_prefect/simulator/partitioned.py; ``--by
workflow``: groups of workflows on pools sized to their demand; ``--by
pool``: equal pools each serving every workflow, requests in turn), one after
another in one process; nothing is shared, so each could have its own core.
The default, 64 partitions by workflow, is the fewest of the sweep's counts
at which every partition keeps up with real time on this case.

Definitions:
  realtime_factor = simulated seconds (the 120 s arrival window) / control-core
      seconds of the slowest partition (each partition on its own core); the
      core's time after the window, while the last requests drain, counts too.
  factor on one core = simulated seconds / all partitions' control-core seconds.
  decision_p99_ms = the 99th percentile of the wall time of a round, over every
      partition's rounds.
  peak_rss_mb = the peak resident memory of the process that ran the case (one
      fresh process per run: the simulator's records of one partition at a time,
      the arrivals, the scheduler and the core).
  SLO hit and whole bill as bench/simulator.py and bench/whole_bill.py define
      them, over the window after the warm-up: whole bill per request = every
      worker billed busy and idle (cold starts included) / requests; batch cost
      per request = the batches alone (the paper's cost model). The best baseline
      is the one with the highest SLO hit rate (ties: the cheaper).

Sections, in order: the main run (``--scheduler`` on the case), the baselines
(``--baselines``, same partitions), the factor against the number of partitions
(``--sweep``, at ``--sweep-duration``), and the cost of partitioning against one
controller on a case small enough for both (``--loss``). Each run goes to a
fresh process (``--processes`` at a time; timings are cleanest with 1).
``--quick``: a tiny case, for tests.

Run:  python bench/scale.py [--duration S] [--rate R] [--gpus G] [--workflows W] [--partitions K]
      [--by workflow|pool] [--baselines a,b|all|none] [--sweep 1,2,4] [--loss] [--quick]
Ends with: RESULT realtime_factor=<x> decision_p99_ms=<y> peak_rss_mb=<z> partitions=<n>
(of the main run)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import sys
import time
from multiprocessing import get_context
from typing import Any

import esg_prefect.scheduling  # noqa: F401 - registers the baselines
from esg_prefect.cli.progress import WallClock
from esg_prefect.simulator.experiments import PRIOR_WORK, headline
from esg_prefect.simulator.partitioned import simulate_partitioned
from esg_prefect.simulator.scale import (
    SCALE_DURATION_S,
    SCALE_GPUS,
    SCALE_RATE_PER_S,
    SCALE_WARMUP_S,
    SCALE_WORKFLOWS,
    scale_case,
)
from esg_prefect.simulator.timed import PartitionResult, merge

DEFAULT_PARTITIONS = 64
SWEEP_DURATION_S = 30.0
SWEEP_WARMUP_S = 10.0
LOSS_CASE: dict[str, Any] = {"gpus": 200, "workflows": 20, "rate_per_s": 2000.0, "duration_s": 40.0, "warmup_s": 10.0}
"""The case small enough for one controller and its partitions (``--loss``)."""
LOSS_PARTITIONS: tuple[int, ...] = (2, 4)
QUICK_CASE: dict[str, Any] = {"gpus": 16, "workflows": 3, "rate_per_s": 60.0, "duration_s": 2.0, "warmup_s": 0.5}

Job = tuple[str, dict[str, Any], str, int, str, str]
"""(label, scale_case keyword arguments, scheduler, partitions, split by, clock)."""


class CpuClock:
    """This process's CPU time in ms (a class, so it pickles into worker processes)."""

    def __call__(self) -> float:
        return time.process_time() * 1000.0


def run_job(job: Job) -> dict[str, Any]:
    """One case run in this (fresh) process: merged figures, per-partition rows, wall time, peak RSS."""
    label, kwargs, scheduler, k, by, clock = job
    case = scale_case(scheduler, **kwargs)
    t0 = time.perf_counter()

    def note(r: PartitionResult) -> None:
        print(
            f"  [{label} {scheduler} K={k}] p{r.index}: {r.workflows} workflows, {r.gpus} GPUs, "
            f"{r.simulated_requests} requests, core {(r.core_ms or 0) / 1000:.1f} s, {r.rounds} rounds "
            f"({time.perf_counter() - t0:.0f} s)",
            file=sys.stderr,
            flush=True,
        )

    timer = CpuClock() if clock == "cpu" else WallClock()
    parts = simulate_partitioned(case, k, by=by, clock=timer, progress=note)  # type: ignore[arg-type]
    wall = time.perf_counter() - t0
    figures = merge(parts)
    rows = [
        {
            "index": r.index,
            "workflows": r.workflows,
            "gpus": r.gpus,
            "requests": r.simulated_requests,
            "core_s": (r.core_ms or 0.0) / 1000.0,
            "decide_s": (r.decide_ms or 0.0) / 1000.0,
            "rounds": r.rounds,
            "slo": r.slo_met / r.requests if r.requests else 0.0,
        }
        for r in parts
    ]
    return {
        "label": label,
        "scheduler": scheduler,
        "k": k,
        "by": by,
        "clock": clock,
        "case": kwargs,
        "figures": dataclasses.asdict(figures),
        "parts": rows,
        "wall_s": wall,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
    }


def run_jobs(jobs: list[Job], processes: int) -> list[dict[str, Any]]:
    """Each job in a fresh process (its own peak RSS), ``processes`` at a time; results in the jobs' order.

    ``processes=0`` runs them in this process (quick runs; peak RSS is then this process's).
    Each run's headline figures go to stderr as it ends.
    """
    if processes == 0:
        return [_noted(run_job(j)) for j in jobs]
    ctx = get_context("spawn")
    with ctx.Pool(max(1, min(processes, len(jobs))), maxtasksperchild=1) as pool:
        return [_noted(r) for r in pool.imap(run_job, jobs, chunksize=1)]


def _noted(r: dict[str, Any]) -> dict[str, Any]:
    f = r["figures"]
    print(
        f"[{r['label']} {r['scheduler']} K={r['k']} by {r['by']}] done: factor {_fmt(f['realtime_factor'], '.3f')}, "
        f"SLO hit {f['slo_hit_rate']:.4f}, whole {f['whole_cost_per_request']:.3e} $/req, "
        f"batch {f['batch_cost_per_request']:.3e} $/req, p99 {_fmt(f['latency_p99_ms'], '.0f')} ms, "
        f"wall {r['wall_s']:.0f} s",
        file=sys.stderr,
        flush=True,
    )
    return r


def row(r: dict[str, Any]) -> dict[str, Any]:
    """A run's figures in the shape experiments.headline reads."""
    f = r["figures"]
    return {
        "scheduler": r["scheduler"],
        "slo_hit_rate": f["slo_hit_rate"],
        "batch_cost_per_request": f["batch_cost_per_request"],
        "cost_per_request": f["whole_cost_per_request"],
    }


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def print_main(r: dict[str, Any]) -> None:
    """The main run: per partition, then the whole."""
    f = r["figures"]
    print(
        f"{r['scheduler']} on {_case_label(r['case'])}, {r['k']} partition(s) by {r['by']}: "
        f"{f['simulated_requests']} requests simulated in {r['wall_s']:.0f} s of wall time; core time by the "
        f"{r['clock']} clock"
    )
    print("| partition | workflows | GPUs | requests | core s | of it decide s | rounds | factor | SLO hit |")
    print("|---|---|---|---|---|---|---|---|---|")
    for p in r["parts"]:
        factor = f["sim_s"] / p["core_s"] if p["core_s"] else float("inf")
        print(
            f"| p{p['index']} | {p['workflows']} | {p['gpus']} | {p['requests']} | {p['core_s']:.1f} "
            f"| {p['decide_s']:.1f} | {p['rounds']} | {factor:.2f} | {p['slo']:.4f} |"
        )
    print(
        f"real-time factor {f['realtime_factor']:.2f} (slowest partition, {f['core_s_max']:.1f} core s for "
        f"{f['sim_s']:g} simulated s); on one core {f['realtime_factor_one_core']:.2f} ({f['core_s_total']:.1f} s, "
        f"{f['decide_s_total']:.1f} s of it in decide); per round p50 {f['round_p50_ms']:.2f} ms, "
        f"p99 {f['round_p99_ms']:.2f} ms over {f['rounds']} rounds; peak RSS {r['peak_rss_mb']:.0f} MB"
    )
    print(
        f"SLO hit {f['slo_hit_rate']:.4f} of {f['requests']} requests after the warm-up; latency p50 "
        f"{_fmt(f['latency_p50_ms'], '.0f')} ms, p99 {_fmt(f['latency_p99_ms'], '.0f')} ms; whole bill "
        f"{f['whole_cost_per_request']:.3e} $/request, batches alone {f['batch_cost_per_request']:.3e}; "
        f"mean batch {f['mean_batch']:.2f}; {f['workers']} workers started"
    )


def _case_label(kw: dict[str, Any]) -> str:
    return (
        f"{kw['gpus']} GPUs, {kw['workflows']} workflows, {kw['rate_per_s']:g} requests/s, "
        f"{kw['duration_s']:g} s ({kw['warmup_s']:g} s warm-up), seed {kw.get('seed', 0)}"
    )


def print_compare(results: list[dict[str, Any]]) -> None:
    """Schedulers side by side, and ESG against the best baseline."""
    print("| scheduler | SLO hit | whole $/req | batch $/req | p99 ms | mean batch | workers | factor | wall s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        f = r["figures"]
        print(
            f"| {r['scheduler']} | {f['slo_hit_rate']:.4f} | {f['whole_cost_per_request']:.3e} "
            f"| {f['batch_cost_per_request']:.3e} | {_fmt(f['latency_p99_ms'], '.0f')} | {f['mean_batch']:.2f} "
            f"| {f['workers']} | {_fmt(f['realtime_factor'], '.2f')} | {r['wall_s']:.0f} |"
        )
    names = [r["scheduler"] for r in results]
    if "esg" in names and any(n in PRIOR_WORK for n in names):
        h = headline([row(r) for r in results], baselines=[n for n in PRIOR_WORK if n in names])
        print(
            f"best baseline: {h['best_baseline']} (SLO {h['baseline_slo']:.4f} vs ESG {h['esg_slo']:.4f}); "
            f"whole bill best baseline / ESG {h['cost_ratio_with_idle']:.3f}; batches alone {h['cost_ratio']:.3f}"
        )


def print_sweep(results: list[dict[str, Any]]) -> None:
    """The factor against the number of partitions."""
    print(
        "| partitions | by | slowest core s | all core s | factor | factor, one core | round p50 ms | round p99 ms "
        "| SLO hit | whole $/req | peak RSS MB | wall s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        f = r["figures"]
        print(
            f"| {r['k']} | {r['by']} | {f['core_s_max']:.1f} | {f['core_s_total']:.1f} "
            f"| {f['realtime_factor']:.2f} | {f['realtime_factor_one_core']:.2f} | {f['round_p50_ms']:.2f} "
            f"| {f['round_p99_ms']:.2f} | {f['slo_hit_rate']:.4f} | {f['whole_cost_per_request']:.3e} "
            f"| {r['peak_rss_mb']:.0f} | {r['wall_s']:.0f} |"
        )


def print_loss(results: list[dict[str, Any]]) -> None:
    """Partitions against one controller: what the split costs."""
    one = next(r for r in results if r["k"] == 1)["figures"]
    whole, batch = one["whole_cost_per_request"], one["batch_cost_per_request"]
    print("| partitions | by | SLO hit | whole $/req | vs one controller | batch $/req | vs one | workers | factor |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        f = r["figures"]
        print(
            f"| {r['k']} | {r['by']} | {f['slo_hit_rate']:.4f} | {f['whole_cost_per_request']:.3e} "
            f"| {f['whole_cost_per_request'] / whole - 1:+.1%} "
            f"| {f['batch_cost_per_request']:.3e} | {f['batch_cost_per_request'] / batch - 1:+.1%} "
            f"| {f['workers']} | {f['realtime_factor']:.2f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=SCALE_DURATION_S, help="arrival window, s")
    parser.add_argument("--warmup", type=float, default=SCALE_WARMUP_S, help="warm-up left out, s")
    parser.add_argument("--rate", type=float, default=SCALE_RATE_PER_S, help="requests/s in all")
    parser.add_argument("--gpus", type=int, default=SCALE_GPUS)
    parser.add_argument("--workflows", type=int, default=SCALE_WORKFLOWS)
    parser.add_argument("--partitions", type=int, default=DEFAULT_PARTITIONS, help="controllers (1: one for all)")
    parser.add_argument("--by", choices=("workflow", "pool"), default="workflow", help="how partitions split")
    parser.add_argument("--scheduler", default="esg")
    parser.add_argument("--seed", type=int, default=0, help="arrivals and service times (the workflows stay)")
    parser.add_argument("--baselines", default="none", help="comma-separated, 'all' (the five) or 'none'")
    parser.add_argument("--sweep", default="", help="partition counts for the factor table, e.g. 1,2,4,8,16,32")
    parser.add_argument("--sweep-by", default="workflow", help="split(s) of the sweep: workflow, pool or both")
    parser.add_argument("--sweep-duration", type=float, default=SWEEP_DURATION_S)
    parser.add_argument("--loss", action="store_true", help="partitions against one controller on a small case")
    parser.add_argument(
        "--processes", type=int, default=1, help="runs at a time, each in a fresh process (0: all in this one)"
    )
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu", help="how the core's time is read")
    parser.add_argument("--json", default="", help="also write every run's figures to this file")
    parser.add_argument("--no-main", action="store_true", help="skip the main run (sections only; no RESULT line)")
    parser.add_argument("--quick", action="store_true", help="a tiny case with every section (for tests)")
    args = parser.parse_args()
    case = {
        "gpus": args.gpus,
        "workflows": args.workflows,
        "rate_per_s": args.rate,
        "duration_s": args.duration,
        "warmup_s": min(args.warmup, args.duration / 2),
        "seed": args.seed,
    }
    k, sweep, processes = args.partitions, [int(x) for x in args.sweep.split(",") if x], args.processes
    loss_case, loss_ks = {**LOSS_CASE, "seed": args.seed}, LOSS_PARTITIONS
    sweep_case = {**case, "duration_s": args.sweep_duration, "warmup_s": min(SWEEP_WARMUP_S, args.sweep_duration / 2)}
    if args.quick:
        case, k, sweep, loss_case, loss_ks = dict(QUICK_CASE), 2, [1, 2], dict(QUICK_CASE), (2,)
        sweep_case, processes = dict(QUICK_CASE), 0
        args.loss = True
    t0 = time.perf_counter()
    saved: dict[str, Any] = {}
    main_run = None
    jobs: list[Job]
    if not args.no_main:
        main_run = saved["main"] = run_jobs(
            [("main", case, args.scheduler, k, args.by, args.clock)], min(processes, 1)
        )[0]
        print_main(main_run)
    baselines = {"all": list(PRIOR_WORK), "none": []}.get(args.baselines, [b for b in args.baselines.split(",") if b])
    if baselines:
        print(f"\nBaselines on the same case and partitions ({k} by {args.by}):\n")
        others = saved["baselines"] = run_jobs(
            [("baseline", case, b, k, args.by, args.clock) for b in baselines], processes
        )
        print_compare([main_run, *others] if main_run else others)
    if sweep:
        bys = ["workflow", "pool"] if args.sweep_by == "both" else [args.sweep_by]
        print(f"\nReal-time factor against partitions, {args.scheduler} on {_case_label(sweep_case)}:\n")
        pairs = [(n, by) for by in bys for n in sweep if by == bys[0] or n > 1]  # one controller is split no way
        jobs = [("sweep", sweep_case, args.scheduler, n, by, args.clock) for n, by in pairs]
        saved["sweep"] = run_jobs(jobs, processes)
        print_sweep(saved["sweep"])
    if args.loss:
        print(f"\nPartitions against one controller, {args.scheduler} on {_case_label(loss_case)}:\n")
        jobs = [("loss", loss_case, args.scheduler, 1, "workflow", args.clock)]
        jobs += [("loss", loss_case, args.scheduler, n, by, args.clock) for by in ("workflow", "pool") for n in loss_ks]
        saved["loss"] = run_jobs(jobs, processes)
        print_loss(saved["loss"])
    print(f"\nbench wall time {time.perf_counter() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(saved, fh, indent=1)
    if main_run is None:
        return
    f = main_run["figures"]
    print(
        f"RESULT realtime_factor={f['realtime_factor']:.3f} decision_p99_ms={f['round_p99_ms']:.3f} "
        f"peak_rss_mb={main_run['peak_rss_mb']:.0f} partitions={main_run['k']}"
    )


if __name__ == "__main__":
    main()
