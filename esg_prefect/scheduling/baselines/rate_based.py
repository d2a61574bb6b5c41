"""Per-function schedulers without a pipeline view: INFless-like and FaST-GShare-like.

Both split a workflow's SLO evenly over its stages (each stage of a workflow
whose longest path has K stages gets SLO / K) and choose each function's
configuration from its own budget and its own arrival rate, never from the
slack a request really has left: what a function-level serverless platform
does when it runs the stages of a pipeline as independent functions.

``infless`` — INFless (Yang et al., ASPLOS '22)
    What it models: per function, the batch size and resources (vCPUs, GPU
    share, GPU type; INFless's "non-uniform scaling" with batching and
    CPU-GPU resource combinations) that minimise the cost per request such that
    batch execution plus the time to fill the batch at the current arrival
    rate fits in the function's budget; batches go when full or when the
    oldest request's remaining budget only just covers the execution (INFless's
    batch timeout); instances are added when the rate needs more throughput
    than the instances of that configuration give (INFless's rate-driven
    autoscaling), one starting at a time.
    What it leaves out: the long-short term histogram that pre-warms instances,
    the operator-level profiling model (the latency model here is the same
    profile every scheduler uses), INFless's own placement heuristic
    (ESG_Dispatch's placement is used).

``fast-gshare`` — FaST-GShare (Gu et al., ICPP '23)
    What it models: spatio-temporal GPU sharing for functions: each function
    gets the cheapest GPU share (and type) whose single-request latency fits
    the function's budget, requests run one at a time (no batching), and the
    number of instances follows the arrival rate (FaST-Scheduler's
    throughput-driven scaling), one starting at a time.
    What it leaves out: the temporal quota (time slicing inside the share)
    beyond what the share's latency implies, FaST-Manager's memory sharing,
    and the profiler's search (the shared latency model is used).
"""

from __future__ import annotations

import math

from esg_prefect.model.workflow import Workflow
from esg_prefect.scheduling.base import (
    DecisionStats,
    Dispatch,
    Hold,
    QueueState,
    SchedulingResult,
    Snapshot,
    plain_stats,
)
from esg_prefect.scheduling.baselines.common import BaselineBase, Resource, stage_budget_ms
from esg_prefect.scheduling.dispatch import ClusterView


class _RoundCounts:
    """Instances per (stage, hardware, vcpus, share) this round: the snapshot's workers, busy or idle
    (:meth:`ClusterView.workers_of_kind`), plus the ones this round has started."""

    __slots__ = ("_added", "_view")

    def __init__(self, view: ClusterView) -> None:
        self._view = view
        self._added: dict[tuple[str, str, int, float], int] = {}

    def get(self, key: tuple[str, str, int, float]) -> int:
        return self._view.workers_of_kind(*key) + self._added.get(key, 0)

    def add(self, key: tuple[str, str, int, float]) -> None:
        self._added[key] = self._added.get(key, 0) + 1


_Choices = tuple[list[tuple[float, Resource, int]], tuple[Resource, int, float] | None]
"""INFless's options worth trying for one budget, and its batch-1 fallback."""


class INFlessScheduler(BaselineBase):
    """Per-function batch and resources from an even SLO split and the arrival rate (module docstring)."""

    name = "infless"

    def _setup(self) -> None:
        # Per (stage, hardware present, budget): the options worth trying, and the fallback.
        self._choices: dict[
            tuple[str, frozenset[str], float],
            tuple[list[tuple[float, Resource, int]], tuple[Resource, int, float] | None],
        ] = {}

    def choose(self, stage: str, budget_ms: float, rate_per_s: float, view: ClusterView) -> tuple[Resource, int, float]:
        """The (resources, batch, latency) of least cost per request that fits ``budget_ms``.

        A batch of ``b`` fits when its latency plus the time to fill it at
        ``rate_per_s`` stays within the budget (no batching while the rate is
        unknown). Falls back to the fastest batch-1 configuration when none fits.
        """
        key = (stage, view.hardware, budget_ms)
        got = self._choices.get(key)
        if got is None:
            opts = self.options(stage, view)
            if not opts:
                raise LookupError(f"no profiled configuration for stage {stage!r}")
            # Cheapest first, the options that can fit at some rate, up to the first that fits at any rate
            # (batch 1 within the budget): the loop below gives the same answer as over every option.
            reach: list[tuple[float, Resource, int]] = []
            for _cost, lat, res, b in opts:
                if lat > budget_ms:  # never fits: the fill time is never negative
                    continue
                reach.append((lat, res, b))
                if b == 1:
                    break
            ones = [(o[1], o[2]) for o in opts if o[3] == 1]
            fallback = None
            if ones:
                lat, res = min(ones)
                fallback = (res, 1, lat)
            got = self._choices[key] = (reach, fallback)
        reach, fallback = got
        for lat, res, b in reach:
            if b == 1:
                fill_ms = 0.0
            elif rate_per_s > 0:
                fill_ms = (b - 1) / rate_per_s * 1000.0
            else:
                continue
            if lat + fill_ms <= budget_ms:
                return res, b, lat
        if fallback is None:
            raise ValueError("no batch-1 configuration to fall back on")  # as min() of nothing did
        return fallback

    def decide(self, snapshot: Snapshot, now_ms: float) -> SchedulingResult:
        """Dispatch full or timed-out batches of each function's configuration; scale by rate."""
        view = self._views.view(snapshot.cluster)
        counts = _RoundCounts(view)
        dispatches: list[Dispatch] = []
        holds: list[Hold] = []
        stats: list[DecisionStats] = []
        for q in sorted(snapshot.queues, key=lambda q: (self.oldest_ready_ms(q), q.key)):
            wf = snapshot.workflows[q.key.workflow]
            self._queue(q, wf, view, counts, now_ms, dispatches, holds, stats)
        return SchedulingResult(tuple(dispatches), tuple(holds), (), tuple(stats))

    def _queue(
        self,
        q: QueueState,
        wf: Workflow,
        view: ClusterView,
        counts: _RoundCounts,
        now_ms: float,
        dispatches: list[Dispatch],
        holds: list[Hold],
        stats: list[DecisionStats],
    ) -> None:
        stage = q.key.stage
        budget = stage_budget_ms(wf)
        try:
            res, b, lat = self.choose(stage, budget, q.arrival_rate_per_s, view)
        except LookupError as exc:
            holds.append(Hold(q.key, str(exc)))
            return
        hw, v, s = res
        throughput = b / lat * 1000.0
        wanted = max(1, math.ceil(q.arrival_rate_per_s / throughput))
        jobs = self.fifo_of(q)
        timeout_ms = max(0.0, budget - lat)
        while jobs:
            if len(jobs) < b and now_ms - jobs[0].ready_ms < timeout_ms:
                holds.append(Hold(q.key, f"batching to {b}: {len(jobs)} queued"))
                return
            n = min(b, len(jobs))
            run_lat = self.latency_ms(stage, n, res) or lat
            key = (stage, hw, v, s)
            placement = self.place(view, stage, res, jobs[:n], now_ms, allow_cold=counts.get(key) < wanted)
            stats.append(plain_stats(q.key, run_lat <= budget, 1))
            if placement is None:
                holds.append(Hold(q.key, f"waiting for an instance ({counts.get(key)} of {wanted})"))
                return
            if placement.cold:
                counts.add(key)
            batch, jobs = jobs[:n], jobs[n:]
            dispatches.append(
                self.dispatch(
                    q, batch, res, placement, run_lat, run_lat > budget, f"infless: b={b} budget {budget:.0f} ms"
                )
            )


class FaSTGShareScheduler(BaselineBase):
    """Cheapest GPU share that fits the even-split budget, no batching, rate-driven scaling (module docstring)."""

    name = "fast-gshare"

    def _setup(self) -> None:
        self._ones: dict[tuple[str, frozenset[str]], list[tuple[float, float, Resource, int]]] = {}  # batch-1 options

    def choose(self, stage: str, budget_ms: float, view: ClusterView) -> tuple[Resource, float]:
        """The (resources, latency) of least cost for one request within ``budget_ms``; else the fastest."""
        key = (stage, view.hardware)
        ones = self._ones.get(key)
        if ones is None:
            ones = self._ones[key] = [o for o in self.options(stage, view) if o[3] == 1]
        if not ones:
            raise LookupError(f"no profiled configuration for stage {stage!r}")
        for _cost, lat, res, _b in ones:  # cheapest first
            if lat <= budget_ms:
                return res, lat
        lat, res = min((o[1], o[2]) for o in ones)
        return res, lat

    def decide(self, snapshot: Snapshot, now_ms: float) -> SchedulingResult:
        """Send each job alone to an instance of its function's configuration; scale by rate."""
        view = self._views.view(snapshot.cluster)
        counts = _RoundCounts(view)
        dispatches: list[Dispatch] = []
        holds: list[Hold] = []
        stats: list[DecisionStats] = []
        for q in sorted(snapshot.queues, key=lambda q: (self.oldest_ready_ms(q), q.key)):
            stage = q.key.stage
            budget = stage_budget_ms(snapshot.workflows[q.key.workflow])
            try:
                res, lat = self.choose(stage, budget, view)
            except LookupError as exc:
                holds.append(Hold(q.key, str(exc)))
                continue
            hw, v, s = res
            wanted = max(1, math.ceil(q.arrival_rate_per_s * lat / 1000.0))
            key = (stage, hw, v, s)
            for job in self.fifo_of(q):
                placement = self.place(view, stage, res, [job], now_ms, allow_cold=counts.get(key) < wanted)
                stats.append(plain_stats(q.key, lat <= budget, 1))
                if placement is None:
                    holds.append(Hold(q.key, f"waiting for an instance ({counts.get(key)} of {wanted})"))
                    break
                if placement.cold:
                    counts.add(key)
                dispatches.append(
                    self.dispatch(q, [job], res, placement, lat, lat > budget, f"fast-gshare: share {s} on {hw}")
                )
        return SchedulingResult(tuple(dispatches), tuple(holds), (), tuple(stats))
