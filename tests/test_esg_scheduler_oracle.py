"""ESG's search against oracles: whole decisions by brute force, first options and the one-pass pick."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import replace
from typing import Any

import pytest

from esg_prefect.model import (
    ClusterSnapshot,
    Config,
    ConfigSpace,
    Device,
    Job,
    LatencyProfile,
    Node,
    PriceSheet,
    ProfilePoint,
    QueueKey,
    Workflow,
)
from esg_prefect.scheduling import ESGScheduler, ESGSettings, QueueState, Snapshot
from esg_prefect.scheduling.dispatch import ClusterView
from esg_prefect.scheduling.tables import to_us


def random_case(seed: int) -> tuple[ESGScheduler, Workflow, list[str], list[Job], float, ClusterSnapshot]:
    """A random chain or fork-join workflow, profile, prices and queue; returns the horizon too."""
    rng = random.Random(seed)
    shape = rng.choice(["chain", "chain", "forkjoin"])
    if shape == "chain":
        k = rng.randint(1, 5)
        names = [f"s{i}" for i in range(k)]
        wf = Workflow.chain("wf", names, slo_ms=1000)
    else:  # a -> {b1 -> b2, c} -> d
        names = ["a", "b1", "b2", "c", "d"]
        wf = Workflow("wf", names, [("a", "b1"), ("b1", "b2"), ("a", "c"), ("b2", "d"), ("c", "d")], 1000)
    stages_n = len(names)
    batches = (1, 2, 4) if stages_n <= 3 else (1, 4)
    vcpus = (1, 2) if stages_n <= 4 else (1,)
    shares = (0.0, 0.5) if stages_n <= 3 else (0.0, 1.0)
    space = ConfigSpace(batches, vcpus, shares)
    points = []
    cold = {}
    for st in names:
        base = rng.uniform(2, 40)
        for hw, share in (("cpu", 0.0), ("T4", shares[1])):
            speed = 1.0 if hw == "cpu" else rng.uniform(3, 8) * share
            for v in vcpus:
                for b in batches:
                    lat = base * (0.6 + 0.4 * b) / speed / (v ** rng.uniform(0.2, 0.8)) + rng.uniform(0, 2)
                    points.append(ProfilePoint(st, hw, b, v, share, round(lat, 3)))
            cold[(st, hw)] = round(rng.uniform(0, 30), 3)
    prices = PriceSheet(rng.uniform(1e-6, 2e-5), {"T4": rng.uniform(5e-5, 5e-4)})
    # The busy-time objective the brute force computes (the paper's; idle_aware adds a keep-alive term).
    settings = ESGSettings(config_space=space, search_horizon=rng.choice(["segment", "workflow"]), idle_aware=False)
    sched = ESGScheduler(LatencyProfile(points, cold), prices, settings)
    entry = names[0] if shape == "chain" else rng.choice(["a", "b1", "c"])
    n = rng.randint(1, 6)
    q = QueueKey("wf", entry)
    deadline = rng.uniform(5, 250)
    jobs = [Job(f"j{i}", f"r{i}", f"r{i}", q, 0.0, 0.0, deadline + i, deadline + 2 * i) for i in range(n)]
    rate = rng.choice([0.0, 50.0, 500.0])
    cluster = ClusterSnapshot([Node("n0", 8)], [Device("n0/g0", "n0", "T4")])
    hardware = frozenset({"cpu", "T4"})
    horizon = list(sched.tables.horizon(wf, entry, hardware))
    return sched, wf, horizon, jobs, rate, cluster


def brute_force_decision(sched: ESGScheduler, horizon: list[str], jobs: list[Job], rate: float, now: float) -> float:
    """Least plan cost by enumeration from the raw profile and prices (every worker is cold)."""
    t = sched.tables
    space = sched.settings.config_space
    prof, prices = t.profile, t.prices
    n = len(jobs)

    def configs(stage: str) -> list[tuple[Config, str]]:
        return [(c, "cpu" if c.gpu_share == 0 else "T4") for c in space]

    first: list[tuple[int, float]] = []
    stage = horizon[0]
    for cfg, hw in configs(stage):
        cold = prof.cold_start_ms(stage, hw)
        sizes = []
        if cfg.batch <= n:
            sizes.append((cfg.batch, 0.0))
        else:
            sizes.append((n, 0.0))  # the whole queue goes now
            if rate > 0:
                sizes.append((cfg.batch, (cfg.batch - n) / rate * 1000.0))
        for b, wait in sizes:
            lat = prof.try_latency_ms(stage, cfg.with_batch(b), hw)
            if lat is None:
                continue
            busy = lat + cold
            # A wait option's latency: the busy time plus the fill time, each in whole microseconds.
            first.append((to_us(busy) + to_us(wait), prices.batch_cost(cfg.with_batch(b), hw, busy) / b))
    rest: list[list[tuple[int, float]]] = []
    for st in horizon[1:]:
        opts = []
        for cfg, hw in configs(st):
            lat = prof.latency_ms(st, cfg, hw)
            opts.append((to_us(lat), prices.cost_per_request(cfg, hw, lat)))
        rest.append(opts)
    deadline = min(j.e2e_deadline_ms if sched.settings.search_horizon == "workflow" else j.deadline_ms for j in jobs)
    slack = to_us(deadline - now)
    best = math.inf
    for plan in itertools.product(first, *rest):
        if sum(p[0] for p in plan) <= slack:
            best = min(best, sum(p[1] for p in plan))
    return best


@pytest.mark.parametrize("seed", range(520))
def test_decision_cost_equals_brute_force_and_unpruned(seed: int) -> None:
    sched, wf, horizon, jobs, rate, cluster = random_case(seed)
    now = 1.0
    view_snapshot = Snapshot((QueueState(jobs[0].queue, tuple(jobs), rate),), cluster, {wf.name: wf})

    expected = brute_force_decision(sched, horizon, jobs, rate, now)
    unpruned = ESGScheduler(sched.tables.profile, sched.tables.prices, sched.settings.without_pruning())
    results = []
    for s in (sched, unpruned):
        view = ClusterView(view_snapshot.cluster)
        dec = s.decide_queue(view_snapshot.queues[0], list(jobs), wf, view, now)
        assert dec.stats.horizon == len(horizon)
        if expected == math.inf:
            assert not dec.stats.feasible and (dec.kind != "dispatch" or dec.at_risk)
            results.append(math.inf)
            continue
        assert dec.stats.feasible and dec.choice is not None and not dec.at_risk
        plan = (dec.choice, *dec.plan)
        assert [c.stage for c in plan] == horizon
        # Every choice's latency_ms is its busy time (cold start included) and config.batch its real size.
        cost = sum(sched.tables.prices.cost_per_request(c.config, c.hardware, c.latency_ms) for c in plan)
        assert math.isclose(cost, expected, rel_tol=1e-9), (seed, cost, expected)
        results.append(cost)
    assert results[0] == results[1] or math.isclose(results[0], results[1], rel_tol=1e-9)


def _first_stage_tables() -> tuple[Any, tuple[tuple[str, int, float, bool], ...]]:
    """Candidate tables of one stage on two GPU types, 4 batch sizes, 2 vCPU counts and 3 shares; resources
    of the whole space, some warm."""
    from esg_prefect.scheduling.tables import CandidateTables

    prof = LatencyProfile(
        [
            ProfilePoint("m", hw, b, v, s, (8.0 + 3.0 * b) / max(s, 0.25) * (1.5 if hw == "V100" else 1.0) / v)
            for hw in ("T4", "V100")
            for b in (1, 2, 4, 8)
            for v in (1, 2)
            for s in (0.25, 0.5, 1.0)
        ],
        {("m", "T4"): 30.0, ("m", "V100"): 30.0},
    )
    prices = PriceSheet(1e-4, {"T4": 1e-3, "V100": 3e-3})
    settings = ESGSettings(config_space=ConfigSpace((1, 2, 4, 8), (1, 2), (0.25, 0.5, 1.0)))
    tables = CandidateTables(prof, prices, settings)
    resources = tuple(
        (hw, v, s, warm) for hw in ("T4", "V100") for v in (1, 2) for s in (0.25, 0.5, 1.0) for warm in (s != 0.5,)
    )
    return tables, resources


def test_first_options_equal_the_pruned_merge_of_every_option() -> None:
    """first_options builds only the surviving wait options; the result is pareto_prune of all of them."""
    from esg_prefect.scheduling.frontier import Option, pareto_prune
    from esg_prefect.scheduling.tables import Choice

    tables, resources = _first_stage_tables()
    rng = random.Random(5)
    for _ in range(200):
        n = rng.randint(1, 8)
        rate = rng.choice([0.0, rng.uniform(1.0, 500.0)])
        got = tables.first_options("m", n, resources, rate)
        sizes = sorted({b for b in (1, 2, 4, 8) if b <= n} | {n})
        naive = [o for r in resources for b in sizes if (o := tables.single_option("m", r, b))]
        naive = list(pareto_prune(naive))
        if rate > 0 and n < 8:
            for b in (2, 4, 8):
                if b <= n:
                    continue
                wait_ms = (b - n) / rate * 1000.0
                group = pareto_prune([o for r in resources if (o := tables.single_option("m", r, b))])
                for o in group:
                    assert isinstance(o.payload, Choice)
                    naive.append(Option(o.latency_us + to_us(wait_ms), o.cost, replace(o.payload, wait_ms=wait_ms)))
        assert got == pareto_prune(naive)
        assert tables.first_options("m", n, resources, rate) is got or rate == 0.0 or n >= 8  # cached


def test_first_pick_equals_the_search_over_first_options() -> None:
    """The one-pass pick gives astar_plan's plan and statistics on first_options, and the slack interval."""
    from esg_prefect.scheduling.search import astar_plan

    tables, resources = _first_stage_tables()
    rng = random.Random(11)
    fits_seen = set()
    for _ in range(400):
        n = rng.randint(1, 8)
        rate = rng.choice([0.0, rng.uniform(1.0, 500.0)])
        slack = rng.randint(0, 150_000)
        first = tables.first_options("m", n, resources, rate)
        pick = tables.first_pick("m", n, resources, rate, slack)
        search = astar_plan([first], slack)
        assert pick.count == len(first)
        assert pick.fits == sum(1 for o in first if o.latency_us <= slack)
        fits_seen.add(0 < pick.fits < pick.count)
        if search.plan is None:
            assert pick.best is None
        else:
            assert pick.best == search.plan[0]
            assert (search.stats.generated, search.stats.cut_latency) == (pick.count, pick.count - pick.fits)
        # Every slack in [lo, hi) lets the same options fit, and the bounds are where that changes.
        assert pick.lo_us <= slack < pick.hi_us
        for probe in (pick.lo_us, pick.hi_us - 1):
            if math.isfinite(probe):
                assert sum(1 for o in first if o.latency_us <= probe) == pick.fits
        if math.isfinite(pick.hi_us):
            assert sum(1 for o in first if o.latency_us <= pick.hi_us) == pick.fits + 1
    assert fits_seen == {True, False}  # both partial and all-or-nothing fits were exercised
