"""Pareto frontiers of (latency, cost) and the slack-aware A* heuristic.

A stage's options are pruned to its Pareto frontier before the search: an
option that is both slower and dearer than another can always be swapped for
it without breaking the slack or raising the cost, so dropping it is safe.

For the stages ``k..K-1`` of a search, the frontier of their *sums* (the
Minkowski sum of the per-stage frontiers, pruned again) tells, for any
remaining slack, the cheapest way to finish: that is an exact lower bound on
the cost of completing a partial plan, and so an admissible heuristic that,
unlike the sum of per-stage minimum costs, sees the slack (ESG-SPEC section 3,
"Making it fast"). Frontiers depend only on the options, so callers cache them.

Latencies are integer microseconds, so feasibility tests are exact and do not
depend on the order of additions.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Option:
    """One choice for one stage: its latency, its cost per request, and what it is."""

    latency_us: int
    cost: float
    payload: Hashable = None


def pareto_prune(options: Sequence[Option]) -> tuple[Option, ...]:
    """Options not dominated by another, sorted by latency (cost strictly falling).

    Ties in both latency and cost keep the first option given.

    Example:
        >>> [o.payload for o in pareto_prune([Option(5, 1.0, "a"), Option(3, 2.0, "b"), Option(6, 2.0, "c")])]
        ['b', 'a']
    """
    order = sorted(range(len(options)), key=lambda i: (options[i].latency_us, options[i].cost, i))
    out: list[Option] = []
    best = math.inf
    for i in order:
        o = options[i]
        if o.cost < best:  # strictly cheaper than every faster-or-equal option
            out.append(o)
            best = o.cost
    return tuple(out)


class SuffixFrontiers:
    """For each k, the Pareto frontier of total (latency, cost) over stages k..K-1.

    Args:
        stages: the Pareto-pruned options of each stage.

    Example:
        >>> f = SuffixFrontiers([[Option(1, 5.0), Option(4, 1.0)], [Option(2, 3.0), Option(5, 1.0)]])
        >>> f.cheapest_within(0, 6), f.cheapest_within(0, 9), f.cheapest_within(0, 2)
        (4.0, 2.0, inf)
    """

    __slots__ = ("_cost", "_lat", "size", "stage_count")

    def __init__(self, stages: Sequence[Sequence[Option]]) -> None:
        k_count = len(stages)
        self.stage_count = k_count
        self._lat: list[list[int]] = [[] for _ in range(k_count + 1)]
        self._cost: list[list[float]] = [[] for _ in range(k_count + 1)]
        self._lat[k_count] = [0]
        self._cost[k_count] = [0.0]
        for k in range(k_count - 1, -1, -1):
            nxt_lat, nxt_cost = self._lat[k + 1], self._cost[k + 1]
            sums = sorted(
                (o.latency_us + lat, o.cost + cost)
                for o in stages[k]
                for lat, cost in zip(nxt_lat, nxt_cost, strict=True)
            )
            lats: list[int] = []
            costs: list[float] = []
            best = math.inf
            for lat, cost in sums:
                if cost < best:
                    lats.append(lat)
                    costs.append(cost)
                    best = cost
            self._lat[k] = lats
            self._cost[k] = costs
        self.size = sum(len(x) for x in self._lat)

    def cheapest_within(self, k: int, slack_us: float) -> float:
        """Least cost of finishing stages k..K-1 within ``slack_us``; inf if impossible."""
        lats = self._lat[k]
        i = bisect.bisect_right(lats, slack_us) - 1
        return self._cost[k][i] if i >= 0 else math.inf

    def level(self, k: int) -> tuple[list[int], list[float]]:
        """The frontier of stages k..K-1 as (latencies rising, costs strictly falling); read-only.

        For searches that look up many slacks: the cheapest completion within
        ``s`` is the last point whose latency is at most ``s``, and its latency
        is the least of any completion at that cost.
        """
        return self._lat[k], self._cost[k]

    def min_latency(self, k: int) -> int:
        """Least latency of stages k..K-1 at any cost."""
        return self._lat[k][0] if self._lat[k] else 0
