"""Decision latency of ESG_1Q on fresh decisions, on cached ones, and the one-time table setup.

What it measures: the wall time of one queue decision (``ESGScheduler.decide_queue``:
placeable resources, first-stage options from the queue's state, Pareto pruning, A*,
best-effort fallback), timed from outside around the call, over the default
configuration space (batch {1,2,4,8,16,32} x vcpus {1,2,4} x share {0, 0.1..1.0}:
198 configurations per stage) on one node with four T4 GPUs, for chains of 2, 4, 8
and 12 stages under both search horizons: ``segment`` (the default; on a chain
every stage is its own dominator segment, so one stage is planned) and
``workflow`` (the whole chain planned as one search).

Fresh decisions: each has its own seeded random queue length (1-40 jobs),
arrival rate (0-400/s, a float, so never the same twice), slack (0.9x to 4x
the fastest plan's latency, so some are infeasible) and cluster (0-3 idle
workers warm for the queue's stage on random resources, and a busy worker of
another stage taking a random share of one GPU), and nothing is called on the
timed scheduler between them: no cache holds their answer. (The slack is worked
out on a second scheduler, so the timed one sees each queue state first in the
timed call.) The workflow's static tables are built first
(``CandidateTables.prepare``: per stage options, suffix frontiers, first-stage
options at every queue length; timed as setup); a column gives the fresh p99
without that, where early decisions build what they miss.

Cached decisions: each fresh decision is asked again right after with the same
inputs (a queue decided again in the next round with nothing changed); their
times are reported apart, with how often the answer came from a cache: ``kept``
is the share answered whole from the queue's kept one-stage answer (a search of
more than one stage is never kept), ``opts`` the share whose first-stage
options came from a cache without being built.

Setup: the one-time cost per workflow on a new scheduler, median of three:
``suffix``, what a first decision at the entry builds (per stage Pareto
options, SLO distribution, horizon, suffix frontiers); ``prepare``, every
table of every stage's queue (suffix included).

Plans: ``--fingerprint`` prints a SHA-256 of every fresh decision's outcome (kind,
choice, plan, at-risk, rejects, search statistics but the time) on a scheduler
without a clock, per shape and over all, so a speed change can be shown to
leave every plan as it was.

The profile is synthetic and seeded, shaped like measured ones: per-batch
latency grows sub-linearly with the batch, falls with vCPUs and GPU share (a
share s runs about s**0.8 as fast as the whole GPU), and the CPU is 8-30x
slower than the GPU.

Run:  python bench/decision_latency.py [--decisions N] [--fingerprint]
Ends with: RESULT decision_p99_ms_4stage_fresh=<x> decision_p99_ms_8stage_fresh=<y>
(both whole-chain horizon, fresh decisions) decision_p99_ms_4stage_cached=<z>
expansion_reduction=<r> (mean expansions of A* without pruning over with it,
4-stage whole-chain horizon).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from esg_prefect.model import (
    ClusterSnapshot,
    Device,
    Job,
    LatencyProfile,
    Node,
    PriceSheet,
    ProfilePoint,
    QueueKey,
    Worker,
    Workflow,
)
from esg_prefect.scheduling import ESGScheduler, ESGSettings, QueueState
from esg_prefect.scheduling.dispatch import ClusterView
from esg_prefect.scheduling.esg import QueueDecision

HARDWARE = frozenset({"cpu", "T4"})
STAGE_COUNTS = (2, 4, 8, 12)
HORIZONS = ("segment", "workflow")


def clock_ms() -> float:
    """The monotonic clock injected into the scheduler (as the runtime injects one)."""
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


@dataclass(frozen=True)
class Shape:
    """A chain of ``k`` stages, its profile, and the scheduler settings of one horizon."""

    k: int
    horizon: str
    workflow: Workflow
    profile: LatencyProfile
    settings: ESGSettings

    @property
    def label(self) -> str:
        return f"chain-{self.k} {self.horizon}"


def make_shape(k: int, horizon: str, seed: int = 11) -> Shape:
    names = [f"s{i}" for i in range(k)]
    settings = ESGSettings(search_horizon=horizon)  # type: ignore[arg-type]
    return Shape(
        k, horizon, Workflow.chain(f"chain{k}", names, 1000), synthetic_profile(names, settings, seed), settings
    )


@dataclass(frozen=True)
class Decision:
    """One fresh decision's inputs: the queue and the cluster it sees."""

    state: QueueState
    jobs: tuple[Job, ...]
    cluster: ClusterSnapshot


def make_decisions(shape: Shape, count: int, seed: int) -> list[Decision]:
    """``count`` seeded decisions at the chain's entry, each with its own queue, rate, slack and workers."""
    ref = ESGScheduler(shape.profile, PriceSheet.default(), shape.settings)  # works out slacks; never timed
    wf = shape.workflow
    entry = wf.stages[0]
    q = QueueKey(wf.name, entry)
    horizon = ref.tables.horizon(wf, entry, HARDWARE)
    rest_fastest_ms = sum(ref.tables.min_latency_ms(s, HARDWARE) for s in horizon[1:])
    space = shape.settings.config_space
    gpu_kinds = [(v, s) for s in space.gpu_shares if s > 0 for v in space.vcpus]
    rng = random.Random(seed)
    out = []
    for i in range(count):
        workers = []
        for g in range(rng.randint(0, 3)):  # idle workers warm for the entry stage
            if rng.random() < 0.2:
                workers.append(Worker(f"w{g}", "n0", None, "cpu", rng.choice(space.vcpus), 0.0, entry, False, 0.0))
            else:
                v, s = rng.choice(gpu_kinds)
                workers.append(Worker(f"w{g}", "n0", f"n0/g{g}", "T4", v, s, entry, False, 0.0))
        if rng.random() < 0.5:  # a busy worker of another stage takes a share of the last GPU
            v, s = rng.choice(gpu_kinds)
            workers.append(Worker("busy", "n0", "n0/g3", "T4", v, s, wf.stages[-1], True))
        cluster = ClusterSnapshot([Node("n0", 64)], [Device(f"n0/g{g}", "n0", "T4") for g in range(4)], workers)
        n = rng.randint(1, 40)
        rate = rng.uniform(0, 400)
        resources = ref.placeable_resources(entry, ClusterView(cluster))
        first = ref.tables.first_options(entry, n, resources, rate)
        fastest_ms = first[0].latency_us / 1000.0 if first else 1.0
        slack = (fastest_ms + rest_fastest_ms) * rng.uniform(0.9, 4.0)
        jobs = tuple(Job(f"j{i}-{j}", f"r{j}", f"r{j}", q, 0.0, 0.0, slack, slack) for j in range(n))
        out.append(Decision(QueueState(q, jobs, rate), jobs, cluster))
    return out


def outcome(dec: QueueDecision) -> str:
    """A decision's outcome as text: everything but its measured time."""
    return repr((dec.kind, dec.choice, dec.plan, dec.at_risk, dec.reject_count, replace(dec.stats, decision_ms=None)))


def percentiles(times_ms: list[float]) -> tuple[float, float, float]:
    """p50, p99 and p99.9 (nearest rank)."""
    xs = sorted(times_ms)

    def rank(p: float) -> float:
        return xs[min(len(xs) - 1, max(0, int(p * len(xs) + 0.999999) - 1))]

    return statistics.median(xs), rank(0.99), rank(0.999)


def setup_ms(shape: Shape) -> tuple[float, float]:
    """One-time table setup on a new scheduler, median of three: the entry's horizon tables, and all of prepare."""
    suffix, prepare = [], []
    for _ in range(3):
        sched = ESGScheduler(shape.profile, PriceSheet.default(), shape.settings, clock=clock_ms)
        t0 = time.perf_counter()
        sched.tables.suffix(shape.workflow, shape.workflow.stages[0], HARDWARE)
        t1 = time.perf_counter()
        sched.tables.prepare(shape.workflow, HARDWARE)
        suffix.append((t1 - t0) * 1000.0)
        prepare.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(suffix), statistics.median(prepare)


def time_decisions(shape: Shape, decisions: list[Decision], prepared: bool = True) -> dict[str, Any]:
    """Fresh and repeated (cached) decision times, in ms, and mean expansions of the fresh ones.

    ``prepared``: the workflow's tables are built first (``CandidateTables.prepare``, timed apart);
    else only the entry's horizon tables are, and the first decisions at each queue length build the rest.
    """
    sched = ESGScheduler(shape.profile, PriceSheet.default(), shape.settings, clock=clock_ms)
    sched.tables.suffix(shape.workflow, shape.workflow.stages[0], HARDWARE)
    if prepared:
        sched.tables.prepare(shape.workflow, HARDWARE)
    wf = shape.workflow
    fresh: list[float] = []
    cached: list[float] = []
    expansions = 0
    infeasible = 0
    perf = time.perf_counter_ns
    gc.collect()
    for d in decisions:
        view, again = ClusterView(d.cluster), ClusterView(d.cluster)
        jobs = list(d.jobs)
        t0 = perf()
        dec = sched.decide_queue(d.state, jobs, wf, view, 0.0)
        t1 = perf()
        sched.decide_queue(d.state, list(d.jobs), wf, again, 0.0)
        t2 = perf()
        fresh.append((t1 - t0) / 1e6)
        cached.append((t2 - t1) / 1e6)
        expansions += dec.stats.expansions
        infeasible += not dec.stats.feasible
    return {
        "fresh": percentiles(fresh),
        "cached": percentiles(cached),
        "exp": expansions / len(decisions),
        "infeasible": infeasible / len(decisions),
    }


def replay(shape: Shape, decisions: list[Decision]) -> tuple[str, float, float]:
    """Fingerprint of the fresh outcomes (no clock), and the repeats' cache hit rates (kept, opts)."""
    sched = ESGScheduler(shape.profile, PriceSheet.default(), shape.settings)
    calls = {"search": 0, "build": 0}

    def counted(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    # Instance attributes shadow the methods: a repeat that calls neither was answered from caches.
    sched._decide_queue = counted("search", sched._decide_queue)  # type: ignore[method-assign]
    for attr in ("_build_now", "_with_waits", "_candidates"):
        setattr(sched.tables, attr, counted("build", getattr(sched.tables, attr)))
    digest = hashlib.sha256()
    kept = opts = 0
    wf = shape.workflow
    for d in decisions:
        dec = sched.decide_queue(d.state, list(d.jobs), wf, ClusterView(d.cluster), 0.0)
        digest.update(outcome(dec).encode())
        before = dict(calls)
        sched.decide_queue(d.state, list(d.jobs), wf, ClusterView(d.cluster), 0.0)
        kept += calls["search"] == before["search"]
        opts += calls["build"] == before["build"]
    return digest.hexdigest(), kept / len(decisions), opts / len(decisions)


def expansion_reduction(decisions: list[Decision]) -> float:
    """Mean expansions of A* without pruning over with it, on the 4-stage whole-chain decisions given."""
    shape = make_shape(4, "workflow")
    plain = replace(shape.settings.without_pruning(), max_expansions=200_000, time_budget_ms=1e9)
    means = []
    for settings in (plain, shape.settings):
        sched = ESGScheduler(shape.profile, PriceSheet.default(), settings)
        total = 0
        for d in decisions:
            total += sched.decide_queue(
                d.state, list(d.jobs), shape.workflow, ClusterView(d.cluster), 0.0
            ).stats.expansions
        means.append(total / len(decisions))
    return means[0] / means[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--decisions", type=int, default=2000, help="fresh decisions per shape and horizon")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--stages", type=int, nargs="*", default=list(STAGE_COUNTS))
    parser.add_argument("--fingerprint", action="store_true", help="print the plans' fingerprint and exit")
    args = parser.parse_args()
    shapes = [make_shape(k, h) for k in args.stages for h in HORIZONS]
    cases = {s.label: make_decisions(s, args.decisions, args.seed + s.k) for s in shapes}
    if args.fingerprint:
        total = hashlib.sha256()
        for s in shapes:
            fp, _, _ = replay(s, cases[s.label])
            total.update(fp.encode())
            print(f"{s.label:<18} {fp[:16]}")
        print(f"FINGERPRINT {total.hexdigest()[:16]} ({args.decisions} decisions per shape, seed {args.seed})")
        return
    header = (
        f"{'shape':<18} {'fresh p50':>9} {'p99':>7} {'p99.9':>7} {'cached p50':>10} {'p99':>7} {'p99.9':>7} "
        f"{'kept':>5} {'opts':>5} {'exp':>5} {'infeas':>6} {'unprep p99':>10} {'suffix ms':>9} {'prepare ms':>10}"
    )
    print(
        f"ms per decision, {args.decisions} fresh decisions per row (seed {args.seed}), each asked again for 'cached'"
    )
    print(header)
    print("-" * len(header))
    rows: dict[str, dict[str, Any]] = {}
    for s in shapes:
        r = time_decisions(s, cases[s.label])
        _, r["kept"], r["opts"] = replay(s, cases[s.label])
        r["setup"] = setup_ms(s)
        r["unprepared"] = time_decisions(s, cases[s.label], prepared=False)["fresh"]
        rows[s.label] = r
        (f50, f99, f999), (c50, c99, c999) = r["fresh"], r["cached"]
        print(
            f"{s.label:<18} {f50:9.3f} {f99:7.3f} {f999:7.3f} {c50:10.3f} {c99:7.3f} {c999:7.3f} "
            f"{r['kept']:5.0%} {r['opts']:5.0%} {r['exp']:5.1f} {r['infeasible']:6.0%} {r['unprepared'][1]:10.3f} "
            f"{r['setup'][0]:9.1f} {r['setup'][1]:10.1f}"
        )
    print()
    print("fresh: no cache holds the answer (new queue length, rate, slack, warm workers), after the workflow's")
    print("tables are prepared; cached: the same decision asked again; kept/opts: repeats answered whole from")
    print("the kept answer / with the first stage's options from a cache; unprep p99: fresh p99 without prepare")
    print("(early decisions build tables); suffix: the entry's horizon tables; prepare: all the workflow's")
    print("tables, suffix included (one-time, median of 3).")
    four = rows.get("chain-4 workflow")
    eight = rows.get("chain-8 workflow")
    if four is None or eight is None:
        return
    reduction = expansion_reduction(cases["chain-4 workflow"][:100])
    print(
        f"RESULT decision_p99_ms_4stage_fresh={four['fresh'][1]:.3f} "
        f"decision_p99_ms_8stage_fresh={eight['fresh'][1]:.3f} "
        f"decision_p99_ms_4stage_cached={four['cached'][1]:.3f} expansion_reduction={reduction:.1f}"
    )


if __name__ == "__main__":
    main()
