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

Options of a stage come sorted by latency, so once the latency blade cuts one
child it cuts all the slower ones after it, and the loop stops there.

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

import heapq
import itertools
import math
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

    Each stage takes its cheapest option such that the stages after it can
    still finish at their least latency. Returns None exactly when no plan is
    feasible (the all-fastest plan exceeds the slack).
    """
    min_after = _min_latency_after(stages)
    if min_after[0] > slack_us:
        return None
    plan: list[Option] = []
    lat = 0
    for k, opts in enumerate(stages):
        room = slack_us - lat - min_after[k + 1]
        best = min((o for o in opts if o.latency_us <= room), key=lambda o: (o.cost, o.latency_us))
        plan.append(best)
        lat += best.latency_us
    return tuple(plan)


def _min_latency_after(stages: Sequence[Sequence[Option]]) -> list[int]:
    out = [0] * (len(stages) + 1)
    for k in range(len(stages) - 1, -1, -1):
        out[k] = out[k + 1] + min(o.latency_us for o in stages[k])
    return out


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
    """Cheapest one-option-per-stage plan within ``slack_us``.

    Args:
        stages: options per stage, each list sorted by latency (as
            :func:`~esg_prefect.scheduling.frontier.pareto_prune` returns them).
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
        was found) with its total cost and latency, and the statistics.

    Raises:
        InvalidInputError: on no stages, an empty stage, or an unknown heuristic.
    """
    if not stages:
        raise InvalidInputError("astar_plan needs at least one stage")
    for k, opts in enumerate(stages):
        if not opts:
            raise InvalidInputError(f"stage {k} of the search has no options")
    if heuristic not in ("frontier", "min_cost"):
        raise InvalidInputError(f"heuristic must be 'frontier' or 'min_cost', got {heuristic!r}")
    t0 = clock() if clock is not None else 0.0
    k_count = len(stages)
    if fast_path and k_count == 1 and latency_blade and cost_blade and max_expansions >= 1:
        return _one_stage(stages[0], slack_us, clock, t0)
    min_lat_after = _min_latency_after(stages)
    min_cost_after = [0.0] * (k_count + 1)
    for k in range(k_count - 1, -1, -1):
        min_cost_after[k] = min_cost_after[k + 1] + min(o.cost for o in stages[k])
    if heuristic == "frontier":
        front = frontiers if frontiers is not None else SuffixFrontiers(stages[1:])
        if front.stage_count != k_count - 1:
            raise InvalidInputError(f"frontiers cover {front.stage_count} stages; expected {k_count - 1} (stages[1:])")

        def h(k: int, rem: float) -> float:
            # Exact: the cheapest completion of stages k..K-1 within rem (inf if none).
            return front.cheapest_within(k - 1, rem)
    else:

        def h(k: int, rem: float) -> float:
            # Slack-blind: the sum of the remaining stages' cheapest options.
            return min_cost_after[k]

    best_plan: tuple[Option, ...] | None = None
    best_cost = math.inf
    if cost_blade:
        best_plan = greedy_plan(stages, slack_us)
        if best_plan is not None:
            best_cost = sum(o.cost for o in best_plan)

    expansions = generated = cut_lat = cut_cost = 0
    budget_hit = False
    counter = itertools.count()
    # Heap entries: (f, tie-break counter, depth, latency, cost, path); the counter keeps
    # entries with equal f from ever comparing the paths.
    heap: list[tuple[float, int, int, int, float, tuple[Option, ...]]] = [(0.0, next(counter), 0, 0, 0.0, ())]
    found: tuple[Option, ...] | None = None
    while heap:
        f, _, k, lat, cost, path = heapq.heappop(heap)
        if cost_blade and f >= best_cost:
            break  # nothing left can beat the incumbent: it is optimal
        if k == k_count:
            found = path  # first complete node popped: optimal (h admissible)
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
            nf = ncost + h(k + 1, slack_us - nlat)
            if cost_blade and nf >= best_cost:
                cut_cost += 1
                continue
            if nf == math.inf:
                continue  # the exact heuristic proves there is no feasible completion
            npath = (*path, o)
            if last and ncost < best_cost:
                best_cost, best_plan = ncost, npath
            heapq.heappush(heap, (nf, next(counter), k + 1, nlat, ncost, npath))
    plan = found if found is not None else best_plan
    if plan is None and budget_hit:
        plan = greedy_plan(stages, slack_us)  # still a feasible answer, if one exists
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
