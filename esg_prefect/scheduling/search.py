"""ESG_1Q's path search: A* with dual-blade pruning over a pipeline's stages.

Given, for stages ``0..K-1``, options of (latency, cost per request), find one
option per stage whose latencies sum to at most the slack at the least total
cost (ESG-SPEC section 3). A node at depth k holds the options chosen for
stages ``0..k-1``; its path cost g is their summed cost; the heuristic h bounds
from below the cost of the stages left. A* pops nodes by ``g + h`` and the
first complete node popped is optimal because h never overestimates.

The two blades, each safe (they never cut a path to a strictly cheaper
feasible plan, so the optimum is the same with or without them):

* latency blade: a child whose latency plus the least latency of the stages
  left exceeds the slack has no feasible completion.
* cost blade: a child whose ``g + h`` is not below the best complete plan
  known (seeded by a greedy plan) cannot lead to a cheaper one.

Each stage's options are sorted by latency (the search sorts a stage that is
not), so once the latency blade cuts one child it cuts all the slower ones
after it, and the loop stops there.

Of equally cheap plans the search returns one of least latency: nodes are
ordered, cut and compared with the incumbent by (cost, latency), with a lower
bound on the latency of the completion beside the one on its cost.

The search is bounded by an expansion budget and, when a clock is injected,
by a time budget; on hitting either it returns the best complete plan found.

References:
    Hart, Nilsson, Raphael. "A Formal Basis for the Heuristic Determination of
    Minimum Cost Paths." IEEE Trans. SSC 4(2), 1968.
    Hui et al. "ESG: Pipeline-Conscious Efficient Scheduling of DNN Workflows
    on Serverless Platforms with Shareable GPUs." HPDC '24.

Example:
    >>> stages = [[Option(10, 3.0, "fast"), Option(30, 1.0, "slow")], [Option(10, 2.0, "x")]]
    >>> r = astar_plan(stages, slack_us=45)
    >>> [o.payload for o in r.plan], r.cost
    (['slow', 'x'], 3.0)
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from esg_prefect.exceptions import InvalidInputError
from esg_prefect.scheduling.frontier import Option, SuffixFrontiers

Clock = Callable[[], float]
"""A monotonic clock returning milliseconds; injected, never read implicitly."""


@dataclass(frozen=True, slots=True)
class SearchStats:
    """What one search did.

    Attributes:
        expansions: nodes popped and expanded.
        generated: children created (before the blades).
        cut_latency: children dropped by the latency blade.
        cut_cost: children dropped by the cost blade.
        budget_hit: the expansion or time budget stopped the search.
        elapsed_ms: wall time, when a clock was injected; else None.
    """

    expansions: int = 0
    generated: int = 0
    cut_latency: int = 0
    cut_cost: int = 0
    budget_hit: bool = False
    elapsed_ms: float | None = None


@dataclass(frozen=True, slots=True)
class SearchResult:
    """The cheapest feasible plan (None if none was found) and the search statistics."""

    plan: tuple[Option, ...] | None
    cost: float
    latency_us: int
    stats: SearchStats


def greedy_plan(stages: Sequence[Sequence[Option]], slack_us: int) -> tuple[Option, ...] | None:
    """A feasible plan built stage by stage, each the cheapest that leaves room.

    Each stage takes its cheapest option (the faster of equal ones, then the
    first given) such that the stages after it can still finish at their least
    latency. Returns None exactly when no plan is feasible (the all-fastest
    plan exceeds the slack). Options may come in any order.
    """
    return _greedy(stages, slack_us, _min_latency_after(stages))


def _greedy(stages: Sequence[Sequence[Option]], slack_us: int, min_after: list[int]) -> tuple[Option, ...] | None:
    if min_after[0] > slack_us:
        return None
    plan: list[Option] = []
    lat = 0
    for k, opts in enumerate(stages):
        room = slack_us - lat - min_after[k + 1]
        best: Option | None = None
        for o in opts:  # min by (cost, latency), the first of equals
            if o.latency_us <= room and (
                best is None or o.cost < best.cost or (o.cost == best.cost and o.latency_us < best.latency_us)
            ):
                best = o
        assert best is not None  # the stage's fastest option fits: min_after says so
        plan.append(best)
        lat += best.latency_us
    return tuple(plan)


def _min_latency_after(stages: Sequence[Sequence[Option]]) -> list[int]:
    out = [0] * (len(stages) + 1)
    for k in range(len(stages) - 1, -1, -1):
        out[k] = out[k + 1] + min(o.latency_us for o in stages[k])
    return out


def _by_latency(o: Option) -> int:
    return o.latency_us


def _sorted_stages(stages: Sequence[Sequence[Option]]) -> Sequence[Sequence[Option]]:
    """``stages`` with each stage's options sorted by latency (stable); the same object when they already are.

    Raises:
        InvalidInputError: on no stages or an empty stage.
    """
    if not stages:
        raise InvalidInputError("astar_plan needs at least one stage")
    out: list[Sequence[Option]] | None = None
    for k, opts in enumerate(stages):
        if not opts:
            raise InvalidInputError(f"stage {k} of the search has no options")
        lats = [o.latency_us for o in opts]
        if any(map(operator.gt, lats, lats[1:])):
            if out is None:
                out = list(stages)
            out[k] = sorted(opts, key=_by_latency)
    return stages if out is None else out


def astar_plan(
    stages: Sequence[Sequence[Option]],
    slack_us: int,
    *,
    latency_blade: bool = True,
    cost_blade: bool = True,
    heuristic: str = "frontier",
    frontiers: SuffixFrontiers | None = None,
    max_expansions: int = 10_000,
    time_budget_ms: float | None = None,
    clock: Clock | None = None,
    fast_path: bool = True,
) -> SearchResult:
    """Cheapest one-option-per-stage plan within ``slack_us``; of equally cheap ones, the fastest.

    Args:
        stages: options per stage, in any order (each stage is sorted by
            latency here, stably, unless it already is, as
            :func:`~esg_prefect.scheduling.frontier.pareto_prune` returns
            them); options need not be Pareto-pruned. Costs must be >= 0.
        slack_us: the latency budget of the whole plan, in microseconds.
        latency_blade: turn the latency blade on.
        cost_blade: turn the cost blade on (seeded with :func:`greedy_plan`).
        heuristic: ``"frontier"`` (exact, slack-aware) or ``"min_cost"``.
        frontiers: precomputed :class:`SuffixFrontiers` of ``stages[1:]`` for the
            frontier heuristic (callers cache them); built here if None.
        max_expansions: expansion budget.
        time_budget_ms: time budget, enforced only with ``clock``.
        clock: monotonic clock in ms, for the time budget and ``elapsed_ms``.
        fast_path: answer a one-stage search with both blades in closed form
            (the same plan and statistics, see :func:`_one_stage`); False runs
            the general search (tests compare the two).

    Returns:
        The plan (None if infeasible or the budget ran out before any plan
        was found) with its total cost and latency, and the statistics. Ties:
        of the plans of least total cost, one of least total latency (costs
        compare as floats summed stage by stage, so ties are exact ones).

    Raises:
        InvalidInputError: on no stages, an empty stage, or an unknown heuristic.
    """
    stages = _sorted_stages(stages)
    if heuristic not in ("frontier", "min_cost"):
        raise InvalidInputError(f"heuristic must be 'frontier' or 'min_cost', got {heuristic!r}")
    t0 = clock() if clock is not None else 0.0
    k_count = len(stages)
    if fast_path and k_count == 1 and latency_blade and cost_blade and max_expansions >= 1:
        return _one_stage(stages[0], slack_us, clock, t0)
    min_lat_after = [0] * (k_count + 1)
    for k in range(k_count - 1, -1, -1):
        min_lat_after[k] = min_lat_after[k + 1] + stages[k][0].latency_us  # sorted: the first is the fastest
    # Lower bounds on completing stages k+1.. from a child at depth k+1, as (costs, latencies) per
    # remaining-slack step: the frontier of their sums (exact: the cheapest completion within the slack
    # left, and the least latency at that cost), or one step of the summed cheapest costs and least
    # latencies (slack-blind). Either bounds the completion's (cost, latency) from below in that order.
    levels: list[tuple[Sequence[float], Sequence[float]]]
    if heuristic == "frontier":
        front = frontiers if frontiers is not None else SuffixFrontiers(stages[1:])
        if front.stage_count != k_count - 1:
            raise InvalidInputError(f"frontiers cover {front.stage_count} stages; expected {k_count - 1} (stages[1:])")
        levels = [front.level(k) for k in range(k_count)]
    else:
        levels = [([-math.inf], [0.0])] * k_count
        c = 0.0
        for k in range(k_count - 1, 0, -1):
            c += min(o.cost for o in stages[k])
            levels[k - 1] = ([-math.inf], [c])
    frontier = heuristic == "frontier"

    best_plan: tuple[Option, ...] | None = None
    best_cost = math.inf
    best_lat: float = math.inf
    if cost_blade:
        best_plan = _greedy(stages, slack_us, min_lat_after)
        if best_plan is not None:
            best_cost = sum(o.cost for o in best_plan)
            best_lat = sum(o.latency_us for o in best_plan)

    expansions = generated = cut_lat = cut_cost = 0
    budget_hit = False
    counter = itertools.count()
    bisect_right = bisect.bisect_right
    push = heapq.heappush
    # Heap entries: (f, latency bound, tie-break counter, depth, latency, cost, path): popped by least
    # (cost, latency) bound; the counter keeps entries with equal bounds from ever comparing the paths.
    heap: list[tuple[float, float, int, int, int, float, tuple[Option, ...]]] = [(0.0, 0, next(counter), 0, 0, 0.0, ())]
    found: tuple[Option, ...] | None = None
    while heap:
        f, fl, _, k, lat, cost, path = heapq.heappop(heap)
        # Nothing left can beat the incumbent: it is optimal. The root (bound (0, 0)) stops only on a
        # zero-cost incumbent: with costs >= 0 the greedy plan then takes each stage's fastest
        # zero-cost option that fits, the fastest zero-cost plan there is.
        if cost_blade and (f > best_cost or (f == best_cost and (fl >= best_lat or not k))):
            break
        if k == k_count:
            found = path  # first complete node popped: optimal (the bounds are admissible)
            break
        if expansions >= max_expansions:
            budget_hit = True
            break
        timed = clock is not None and time_budget_ms is not None and expansions % 32 == 31
        if timed and clock() - t0 > time_budget_ms:  # type: ignore[misc, operator]
            budget_hit = True
            break
        expansions += 1
        opts = stages[k]
        room_after = min_lat_after[k + 1]
        last = k + 1 == k_count
        h_lats, h_costs = levels[k]
        h_lat_bound = room_after
        for idx, o in enumerate(opts):
            generated += 1
            nlat = lat + o.latency_us
            if nlat + room_after > slack_us:
                if latency_blade:
                    # Options are sorted by latency: every later one fails too.
                    cut_lat += len(opts) - idx
                    generated += len(opts) - idx - 1
                    break
                if last:
                    continue  # a complete plan over the slack is not a plan
            ncost = cost + o.cost
            i = bisect_right(h_lats, slack_us - nlat) - 1
            if i < 0:
                nf = nfl = math.inf  # the exact heuristic: no completion fits the slack left
            elif frontier:
                nf = ncost + h_costs[i]
                nfl = nlat + h_lats[i]
            else:
                nf = ncost + h_costs[0]
                nfl = nlat + h_lat_bound
            if cost_blade and (nf > best_cost or (nf == best_cost and nfl >= best_lat)):
                cut_cost += 1
                continue
            if nf == math.inf:
                continue  # the exact heuristic proves there is no feasible completion
            npath = (*path, o)
            if last and (ncost < best_cost or (ncost == best_cost and nlat < best_lat)):
                best_cost, best_lat, best_plan = ncost, nlat, npath
            push(heap, (nf, nfl, next(counter), k + 1, nlat, ncost, npath))
    plan = found if found is not None else best_plan
    if plan is None and budget_hit:
        plan = _greedy(stages, slack_us, min_lat_after)  # still a feasible answer, if one exists
    elapsed = (clock() - t0) if clock is not None else None
    stats = SearchStats(expansions, generated, cut_lat, cut_cost, budget_hit, elapsed)
    if plan is None:
        return SearchResult(None, math.inf, 0, stats)
    return SearchResult(plan, sum(o.cost for o in plan), sum(o.latency_us for o in plan), stats)


def _one_stage(opts: Sequence[Option], slack_us: int, clock: Clock | None, t0: float) -> SearchResult:
    """:func:`astar_plan` on one stage with both blades: the same plan and statistics, without the heap.

    With one stage the greedy seed is already the optimum (the cheapest option
    within the slack, the first of equal ones), so the search A* would run is
    known in closed form: the root is expanded once (unless the seed costs
    nothing: then the root's f = 0 already matches it and nothing is
    expanded); the options up to the first one over the slack are generated
    and each falls to the cost blade (none is cheaper than the seed); the
    first option over the slack and every one after it fall to the latency
    blade. Chains are split into one-stage segments by the dominator split, so
    this is the common case; tests check it against the general search.
    """
    best: Option | None = None
    for o in opts:  # greedy_plan's choice: least (cost, latency) within the slack, first of equals
        if o.latency_us <= slack_us and (best is None or (o.cost, o.latency_us) < (best.cost, best.latency_us)):
            best = o
    n = len(opts)
    if best is not None and best.cost <= 0.0:
        stats = SearchStats(elapsed_ms=(clock() - t0) if clock is not None else None)
    else:
        m = 0  # leading options within the slack (the latency blade stops at the first one over it)
        while m < n and opts[m].latency_us <= slack_us:
            m += 1
        cut_cost = m if best is not None else 0
        stats = SearchStats(1, n, n - m, cut_cost, False, (clock() - t0) if clock is not None else None)
    if best is None:
        return SearchResult(None, math.inf, 0, stats)
    return SearchResult((best,), best.cost, best.latency_us, stats)
