"""The first stage's side of the candidate tables: resources, gap classes, pruned fronts and wait groups.

A queue's first stage is decided every round, over resources that may be warm
(each with its idle worker's gap class) and batches that may wait to fill.
These are the values and pure steps that
:class:`~esg_prefect.scheduling.tables.CandidateTables` builds and caches its
first-stage options from, kept apart from its per-stage and SLO tables.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable

from esg_prefect.scheduling.frontier import Option

Resource = tuple[str, int, float, int]
"""A placeable resource choice for a first stage: (hardware, vcpus, gpu_share, warm).

``warm`` is 0 (False) for a new worker, else the gap class of the warm idle
worker it would run on (:func:`gap_class`; True is class 1, no gap).
"""

GAP_UNIT_MS = 8.0
"""Gap class k >= 2 stands for an idle gap of at least ``GAP_UNIT_MS * 2 ** (k - 2)``."""


def gap_class(gap_ms: float) -> int:
    """The warm flag of a resource whose idle worker has idled ``gap_ms``: 1 under one unit, then one per doubling."""
    if gap_ms < GAP_UNIT_MS:
        return 1
    return 2 + int(math.log2(gap_ms / GAP_UNIT_MS))


def gap_ms(warm: int) -> float:
    """The idle gap a warm flag stands for (the class's lower bound): what a use of that worker extends."""
    return 0.0 if warm <= 1 else GAP_UNIT_MS * 2.0 ** (warm - 2)


_WaitParts = tuple[list[tuple[int, float, int, Option, float]], list[tuple[int, list[tuple[int, float, int, Option]]]]]
"""Static parts of a first-stage merge: the dispatch-now candidates; per larger batch, (jobs short, candidates)."""

_Entry = tuple[int, float, int, Option]
"""An option with pareto_prune's sort key: (latency, cost, position in the list it stands for, option)."""


def _prune_entries(entries: list[_Entry]) -> list[_Entry]:
    """:func:`pareto_prune` on entries whose positions are unique (so the options are never compared)."""
    entries.sort()
    out: list[_Entry] = []
    best = math.inf
    for e in entries:
        if e[1] < best:  # strictly cheaper than every faster-or-equal entry
            out.append(e)
            best = e[1]
    return out


class FirstPick:
    """A one-stage search's answer (:meth:`CandidateTables.first_pick`).

    Attributes:
        best: the cheapest option within the slack; None if none fits.
        count: options in the Pareto-pruned list (:meth:`CandidateTables.first_options`).
        fits: how many of them fit in the slack (a prefix: the list is sorted by latency).
        lo_us: latency of the last option that fits (-inf if none).
        hi_us: latency of the first one that does not (inf if all fit): for
            every slack in ``[lo_us, hi_us)`` the same options fit.
    """

    __slots__ = ("best", "count", "fits", "hi_us", "lo_us")

    def __init__(self, best: Option | None, count: int, fits: int, lo_us: float, hi_us: float) -> None:
        self.best = best
        self.count = count
        self.fits = fits
        self.lo_us = lo_us
        self.hi_us = hi_us


def _pick(options: tuple[Option, ...], slack_us: int) -> FirstPick:
    """:class:`FirstPick` over a built, pruned list."""
    m = 0
    count = len(options)
    while m < count and options[m].latency_us <= slack_us:
        m += 1
    return FirstPick(
        options[m - 1] if m else None,
        count,
        m,
        options[m - 1].latency_us if m else -math.inf,
        options[m].latency_us if m < count else math.inf,
    )


class _FirstParts:
    """Static parts of a first stage's options for one (stage, queue length, resources)."""

    __slots__ = ("merged", "now", "resources", "waits")

    def __init__(self, resources: tuple[Resource, ...], now: tuple[Option, ...]) -> None:
        self.resources = resources  # held, so that the id in the cache key stays this tuple's
        self.now = now  # the dispatch-now options, Pareto-pruned
        self.waits: _WaitParts | None = None  # the wait candidates' static parts, built when first asked
        self.merged: dict[float, tuple[Option, ...]] = {}  # arrival rate -> first_options' merged list


def _wait_groups(
    n: int, now: tuple[Option, ...], batches: Iterable[int], group_of: Callable[[int], tuple[Option, ...]]
) -> _WaitParts:
    """The dispatch-now candidates, and per larger batch size (jobs to wait for, its candidates).

    ``group_of(b)`` is batch size ``b``'s dispatch-now options (every resource, pruned).
    """
    head = [(o.latency_us, o.cost, i, o, 0.0) for i, o in enumerate(now)]
    # The Pareto staircase of every earlier candidate's (latency with no wait, cost): latencies
    # rising, costs strictly falling; some earlier candidate matches or beats (lat, cost) in both
    # exactly when the step at or before lat costs at most cost.
    prior_lat = [o.latency_us for o in now]
    prior_cost = [o.cost for o in now]
    idx = len(head)
    groups = []
    for b in batches:
        if b <= n:
            continue
        group = group_of(b)
        entries = [(o.latency_us, o.cost, idx + j, o) for j, o in enumerate(group)]
        # An entry that an earlier candidate (dispatch-now, or a smaller batch: it waits no longer at
        # any rate) matches or beats in both latency and cost never survives the pruning, whatever the
        # rate, and leaving it out changes no other candidate's fate: drop it once here.
        kept = []
        for e in entries:
            i = bisect.bisect_right(prior_lat, e[0]) - 1
            if i < 0 or prior_cost[i] > e[1]:
                kept.append(e)
        steps = sorted([*zip(prior_lat, prior_cost, strict=True), *((e[0], e[1]) for e in entries)])
        prior_lat, prior_cost = [], []
        for lat, cost in steps:
            if not prior_cost or cost < prior_cost[-1]:
                prior_lat.append(lat)
                prior_cost.append(cost)
        if kept:  # a batch size all of whose options are beaten at any rate adds nothing
            groups.append((b - n, kept))
        idx += len(group)
    return head, groups
