"""A* with dual-blade pruning: worked examples, brute-force oracle, budgets."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from esg_prefect.exceptions import InvalidInputError
from esg_prefect.scheduling.frontier import Option, SuffixFrontiers, pareto_prune
from esg_prefect.scheduling.search import astar_plan, greedy_plan


def brute_force(stages: list[list[Option]], slack_us: int) -> float:
    """Least total cost over every one-option-per-stage plan within the slack."""
    best = math.inf
    for plan in itertools.product(*stages):
        if sum(o.latency_us for o in plan) <= slack_us:
            best = min(best, sum(o.cost for o in plan))
    return best


def random_stages(rng: random.Random, k: int, n: int) -> list[list[Option]]:
    """k stages of n options; faster options tend to cost more, as in real profiles."""
    stages = []
    for s in range(k):
        opts = []
        for i in range(n):
            lat = rng.randint(1, 60)
            cost = round(rng.uniform(0.1, 5.0) + 30.0 / lat, 6)
            opts.append(Option(lat, cost, (s, i)))
        stages.append(list(pareto_prune(opts)))
    return stages


PRUNING_MODES = [
    dict(latency_blade=True, cost_blade=True, heuristic="frontier"),
    dict(latency_blade=True, cost_blade=False, heuristic="frontier"),
    dict(latency_blade=False, cost_blade=True, heuristic="frontier"),
    dict(latency_blade=True, cost_blade=True, heuristic="min_cost"),
    dict(latency_blade=True, cost_blade=False, heuristic="min_cost"),
    dict(latency_blade=False, cost_blade=True, heuristic="min_cost"),
    dict(latency_blade=False, cost_blade=False, heuristic="min_cost"),
]


def test_worked_example_pipeline_conscious_choice() -> None:
    # Stage A: fast (10 us, cost 5) or slow (40 us, cost 1). Stage B: fast (10, 6) or slow (40, 1).
    # Slack 55: both slow takes 80 (too long); A slow + B fast = 50, cost 7; A fast + B slow = 50, cost 6;
    # both fast = 20, cost 11. Optimum: A fast + B slow, cost 6. Greedy per stage (cheapest A that
    # leaves room for B's fastest) takes A slow (40 + 10 <= 55) and pays 7: the pipeline view matters.
    a = [Option(10, 5.0, "A-fast"), Option(40, 1.0, "A-slow")]
    b = [Option(10, 6.0, "B-fast"), Option(40, 1.0, "B-slow")]
    res = astar_plan([a, b], 55)
    assert [o.payload for o in res.plan or ()] == ["A-fast", "B-slow"]
    assert res.cost == 6.0 and res.latency_us == 50
    greedy = greedy_plan([a, b], 55)
    assert greedy is not None and [o.payload for o in greedy] == ["A-slow", "B-fast"]


def test_infeasible_returns_no_plan() -> None:
    # The fastest plan takes 20 us; a 19 us slack admits nothing, in every mode.
    a = [Option(10, 5.0, "a")]
    b = [Option(10, 1.0, "b")]
    for mode in PRUNING_MODES:
        res = astar_plan([a, b], 19, **mode)  # type: ignore[arg-type]
        assert res.plan is None and res.cost == math.inf
    assert greedy_plan([a, b], 19) is None


def test_slack_exactly_met_is_feasible() -> None:
    # Integer microseconds: 10 + 10 == 20 exactly, no float drift at the boundary.
    res = astar_plan([[Option(10, 1.0)], [Option(10, 1.0)]], 20)
    assert res.plan is not None and res.latency_us == 20


@pytest.mark.parametrize("seed", range(600))
def test_oracle_equals_brute_force_in_every_pruning_mode(seed: int) -> None:
    rng = random.Random(seed)
    k = rng.randint(1, 5)
    n = rng.randint(1, 6 if k >= 4 else 9)
    stages = random_stages(rng, k, n)
    fastest = sum(opts[0].latency_us for opts in stages)
    slowest = sum(opts[-1].latency_us for opts in stages)
    slack = rng.randint(max(0, fastest - 10), slowest + 10)
    expected = brute_force(stages, slack)
    costs = []
    for mode in PRUNING_MODES:
        res = astar_plan(stages, slack, **mode)  # type: ignore[arg-type]
        assert not res.stats.budget_hit
        costs.append(res.cost)
        if expected == math.inf:
            assert res.plan is None
        else:
            assert res.plan is not None and res.latency_us <= slack
            assert math.isclose(res.cost, expected, rel_tol=1e-9), (mode, res.cost, expected)
    assert all(math.isclose(c, costs[0], rel_tol=1e-9) or c == costs[0] for c in costs)


def test_blades_cut_expansions_by_far_on_a_4_stage_chain() -> None:
    rng = random.Random(7)
    stages = random_stages(rng, 4, 40)
    fastest = sum(opts[0].latency_us for opts in stages)
    slack = fastest + 40
    plain = astar_plan(stages, slack, latency_blade=False, cost_blade=False, heuristic="min_cost")
    pruned = astar_plan(stages, slack)
    assert math.isclose(plain.cost, pruned.cost, rel_tol=1e-12)
    assert pruned.stats.expansions <= 4  # the exact heuristic walks straight to the optimum
    assert plain.stats.expansions >= 20 * pruned.stats.expansions
    assert pruned.stats.cut_latency > 0


def test_expansion_budget_returns_best_incumbent() -> None:
    rng = random.Random(3)
    stages = random_stages(rng, 5, 20)
    slack = sum(opts[0].latency_us for opts in stages) + 30
    res = astar_plan(stages, slack, heuristic="min_cost", latency_blade=False, max_expansions=2)
    assert res.stats.budget_hit and res.stats.expansions == 2
    greedy = greedy_plan(stages, slack)
    assert greedy is not None
    # The cost blade seeds the incumbent with the greedy plan; the search cannot do worse.
    assert res.plan is not None and res.cost <= sum(o.cost for o in greedy) + 1e-12


def test_time_budget_uses_the_injected_clock() -> None:
    rng = random.Random(4)
    stages = random_stages(rng, 5, 30)
    slack = sum(opts[0].latency_us for opts in stages) + 60
    ticks = itertools.count()

    def clock() -> float:  # every read advances one millisecond
        return float(next(ticks))

    res = astar_plan(
        stages, slack, heuristic="min_cost", latency_blade=False, cost_blade=False, time_budget_ms=5.0, clock=clock
    )
    assert res.stats.budget_hit
    # t0 reads 0; then the clock is read after expansions 31, 63, 95, 127, 159, 191 and shows
    # 1, 2, 3, 4, 5, 6 ms elapsed: the first reading over 5 ms stops the search at 191.
    assert res.stats.expansions == 191
    assert res.stats.elapsed_ms == 7.0  # one more read for the statistics
    # No incumbent without the cost blade: the budget falls back to the greedy plan.
    greedy = greedy_plan(stages, slack)
    assert res.plan == greedy


def test_frontier_heuristic_values() -> None:
    # Stage 0: (1 us, 5), (4 us, 1); stage 1: (2 us, 3), (5 us, 1). Sums: (3, 8), (6, 6), (6, 4), (9, 2).
    # Frontier: (3, 8), (6, 4), (9, 2).
    f = SuffixFrontiers([[Option(1, 5.0), Option(4, 1.0)], [Option(2, 3.0), Option(5, 1.0)]])
    assert [f.cheapest_within(0, s) for s in (2, 3, 5, 6, 8, 9, 100)] == [math.inf, 8.0, 8.0, 4.0, 4.0, 2.0, 2.0]
    assert f.min_latency(0) == 3 and f.cheapest_within(2, 0) == 0.0


def test_pareto_prune_keeps_the_frontier_only() -> None:
    opts = [Option(5, 5.0, "a"), Option(5, 4.0, "b"), Option(3, 6.0, "c"), Option(7, 4.0, "d"), Option(8, 1.0, "e")]
    # b dominates a (same latency, cheaper) and d (faster, same cost); c is fastest; e cheapest.
    assert [o.payload for o in pareto_prune(opts)] == ["c", "b", "e"]


def test_bad_input_is_named() -> None:
    with pytest.raises(InvalidInputError, match="at least one stage"):
        astar_plan([], 10)
    with pytest.raises(InvalidInputError, match="stage 1 of the search has no options"):
        astar_plan([[Option(1, 1.0)], []], 10)
    with pytest.raises(InvalidInputError, match="'greedy'"):
        astar_plan([[Option(1, 1.0)]], 10, heuristic="greedy")
    with pytest.raises(InvalidInputError, match="frontiers cover 3 stages"):
        astar_plan([[Option(1, 1.0)], [Option(1, 1.0)]], 10, frontiers=SuffixFrontiers([[Option(1, 1.0)]] * 3))


def test_one_stage_closed_form_equals_the_general_search() -> None:
    """Regression guard for the one-stage fast path: same plan, cost, latency and statistics."""
    rng = random.Random(11)
    for _ in range(3000):
        n = rng.randint(1, 12)
        costs = [rng.choice([0.0, rng.random(), float(rng.randint(1, 3))]) for _ in range(n)]
        opts = [Option(rng.randint(1, 50), c, i) for i, c in enumerate(costs)]
        stage = list(pareto_prune(opts)) if rng.random() < 0.5 else sorted(opts, key=lambda o: o.latency_us)
        slack = rng.randint(0, 60)
        for heuristic in ("frontier", "min_cost"):
            fast = astar_plan([stage], slack, heuristic=heuristic)
            full = astar_plan([stage], slack, heuristic=heuristic, fast_path=False)
            assert (fast.plan, fast.cost, fast.latency_us, fast.stats) == (
                full.plan,
                full.cost,
                full.latency_us,
                full.stats,
            )


def test_one_stage_statistics_worked_example() -> None:
    # Latencies 5, 10, 20 with costs 3, 2, 1; slack 12: the 10-us option is the cheapest within it.
    stage = [Option(5, 3.0, "a"), Option(10, 2.0, "b"), Option(20, 1.0, "c")]
    r = astar_plan([stage], 12)
    assert [o.payload for o in r.plan or ()] == ["b"]
    # One expansion; all three generated; "c" cut by the latency blade, "a" and "b" by the cost blade.
    assert (r.stats.expansions, r.stats.generated, r.stats.cut_latency, r.stats.cut_cost) == (1, 3, 1, 2)
    none = astar_plan([stage], 4)
    assert none.plan is None and (none.stats.expansions, none.stats.cut_latency, none.stats.cut_cost) == (1, 3, 0)
