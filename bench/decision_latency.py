"""Decision latency of ESG_1Q: with and without pruning, chains of 1-8 stages and a fork-join DAG.

What it measures: the wall time of one queue decision (``ESGScheduler.decide_queue``:
first-stage options from the queue's state, Pareto pruning, A*, best-effort fallback)
and the A* node expansions, over the default configuration space (batch
{1,2,4,8,16,32} x vcpus {1,2,4} x share {0, 0.1..1.0}: 198 configurations per
stage) on a cluster with one GPU type, with ``search_horizon="workflow"`` so that a
chain of K stages is planned as one K-stage search.

Workload of decisions: for each shape, 400 decisions with a seeded random queue
length (1-40 jobs), arrival rate (0-400/s) and slack (from 0.9x to 4x the fastest
plan's latency, so some are infeasible). The profile is synthetic and seeded, shaped
like measured ones: per-batch latency grows sub-linearly with the batch, falls with
vCPUs and GPU share (a share s runs about s**0.8 as fast as the whole GPU), and the
CPU is 8-30x slower than the GPU. Decision time depends on the shape of the
Pareto sets, not on the exact values.

"Pruned" is the default ESG (both blades, slack-aware frontier heuristic); "plain"
is A* with no blades and the slack-blind heuristic (sum of per-stage cheapest
costs), with its budgets lifted to 200,000 expansions so that its expansion count
is its own, up to that cap.

Run:  python bench/decision_latency.py
Ends with: RESULT decision_p99_ms_4stage=<x> decision_p99_ms_8stage=<y> expansion_reduction=<z>
(expansion_reduction = mean plain expansions / mean pruned expansions on the 4-stage chain).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import replace

from esg_prefect.model import (
    ClusterSnapshot,
    Device,
    Job,
    LatencyProfile,
    Node,
    PriceSheet,
    ProfilePoint,
    QueueKey,
    Workflow,
)
from esg_prefect.scheduling import ESGScheduler, ESGSettings, QueueState
from esg_prefect.scheduling.dispatch import ClusterView


def clock_ms() -> float:
    """The monotonic clock injected into the scheduler."""
    return time.perf_counter() * 1000.0


def synthetic_profile(stages: list[str], settings: ESGSettings, seed: int) -> LatencyProfile:
    """A seeded profile covering every configuration of the space on the CPU and a T4."""
    rng = random.Random(seed)
    points = []
    cold = {}
    space = settings.config_space
    for st in stages:
        gpu_base = rng.uniform(2.0, 15.0)  # ms at batch 1 on a whole GPU
        cpu_factor = rng.uniform(8.0, 30.0)
        growth = rng.uniform(0.55, 0.9)  # latency ~ batch**growth
        for share in space.gpu_shares:
            hw = "cpu" if share == 0 else "T4"
            for v in space.vcpus:
                for b in space.batches:
                    if hw == "cpu":
                        lat = gpu_base * cpu_factor * b**growth / v**0.7
                    else:
                        lat = gpu_base * b**growth / share**0.8 * (1.0 + 0.1 / v)
                    lat *= rng.uniform(0.97, 1.03)
                    points.append(ProfilePoint(st, hw, b, v, share, round(lat, 3), round(lat * 1.08, 3)))
            cold[(st, hw)] = rng.uniform(200, 2000)
    return LatencyProfile(points, cold)


def run_shape(wf: Workflow, entry: str, decisions: int, seed: int, plain: bool) -> dict[str, float]:
    """Time ``decisions`` queue decisions on ``wf``'s queue ``entry``."""
    base = ESGSettings(search_horizon="workflow")
    settings = replace(base.without_pruning(), max_expansions=200_000, time_budget_ms=1e9) if plain else base
    profile = synthetic_profile(list(wf.stages), base, seed)
    sched = ESGScheduler(profile, PriceSheet.default(), settings, clock=clock_ms)
    cluster = ClusterSnapshot([Node("n0", 64)], [Device(f"n0/g{i}", "n0", "T4") for i in range(4)])
    q = QueueKey(wf.name, entry)
    hardware = frozenset({"cpu", "T4"})
    t0 = clock_ms()
    horizon = sched.tables.horizon(wf, entry, hardware)
    sched.tables.suffix(wf, entry, hardware)  # builds and caches the frontiers
    build_ms = clock_ms() - t0
    rest_fastest_ms = sum(sched.tables.min_latency_ms(s, hardware) for s in horizon[1:])
    resources = sched.placeable_resources(entry, ClusterView(cluster))
    rng = random.Random(seed + 1)
    times: list[float] = []
    expansions: list[int] = []
    infeasible = budget = 0
    for i in range(decisions):
        n = rng.randint(1, 40)
        rate = rng.uniform(0, 400)
        # The fastest plan for this queue state: its first stage pays a cold start (no warm workers).
        first_ms = sched.tables.first_options(entry, n, resources, rate)[0].latency_us / 1000.0
        slack = (first_ms + rest_fastest_ms) * rng.uniform(0.9, 4.0)
        jobs = [Job(f"j{i}-{k}", f"r{k}", f"r{k}", q, 0.0, 0.0, slack, slack) for k in range(n)]
        state = QueueState(q, tuple(jobs), rate)
        dec = sched.decide_queue(state, jobs, wf, ClusterView(cluster), 0.0)
        assert dec.stats.decision_ms is not None
        times.append(dec.stats.decision_ms)
        expansions.append(dec.stats.expansions)
        infeasible += not dec.stats.feasible
        budget += dec.stats.budget_hit
    times.sort()
    return {
        "stages": len(horizon),
        "p50": statistics.median(times),
        "p99": times[min(len(times) - 1, int(0.99 * len(times)))],
        "exp": statistics.fmean(expansions),
        "build_ms": build_ms,
        "infeasible": infeasible / decisions,
        "budget": budget / decisions,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--decisions", type=int, default=400)
    parser.add_argument(
        "--plain-max-stages", type=int, default=5, help="plain A* only up to this chain length (at least 4)"
    )
    args = parser.parse_args()
    if args.plain_max_stages < 4:
        parser.error("--plain-max-stages must be at least 4: the RESULT line compares expansions at 4 stages")
    shapes: list[tuple[str, Workflow, str]] = []
    for k in range(1, 9):
        names = [f"s{i}" for i in range(k)]
        shapes.append((f"chain-{k}", Workflow.chain(f"chain{k}", names, 1000), "s0"))
    fj = Workflow("fj", ["a", "b", "c", "d", "e"], [("a", "b"), ("b", "c"), ("a", "d"), ("c", "e"), ("d", "e")], 1000)
    shapes.append(("forkjoin-5", fj, "a"))
    header = (
        f"{'shape':<11} {'K':>2} {'p50 ms':>8} {'p99 ms':>8} {'exp':>7} {'plain p50':>10} {'plain p99':>10} "
        f"{'plain exp':>10} {'exp ratio':>9} {'build ms':>9} {'infeas':>6}"
    )
    print(header)
    print("-" * len(header))
    results: dict[str, dict[str, float]] = {}
    for name, wf, entry in shapes:
        pr = run_shape(wf, entry, args.decisions, 11, plain=False)
        k = int(pr["stages"])
        pl = run_shape(wf, entry, max(50, args.decisions // 4), 11, plain=True) if k <= args.plain_max_stages else None
        results[name] = pr
        if pl is not None:
            results[name + "-plain"] = pl
        ratio = f"{pl['exp'] / pr['exp']:9.1f}" if pl else f"{'-':>9}"
        plain_cols = (
            f"{pl['p50']:10.2f} {pl['p99']:10.2f} {pl['exp']:10.0f}" if pl else f"{'-':>10} {'-':>10} {'-':>10}"
        )
        print(
            f"{name:<11} {k:>2} {pr['p50']:8.3f} {pr['p99']:8.3f} {pr['exp']:7.1f} {plain_cols} {ratio} "
            f"{pr['build_ms']:9.1f} {pr['infeasible']:6.0%}"
        )
    four, eight = results["chain-4"], results["chain-8"]
    reduction = results["chain-4-plain"]["exp"] / four["exp"]
    print()
    print("build ms: one-off cost of the suffix frontiers, cached per (workflow, stage, hardware set).")
    print(f"plain A* budget hits at 4 stages: {results['chain-4-plain']['budget']:.0%}")
    print(
        f"RESULT decision_p99_ms_4stage={four['p99']:.3f} decision_p99_ms_8stage={eight['p99']:.3f} "
        f"expansion_reduction={reduction:.1f}"
    )


if __name__ == "__main__":
    main()
