"""ESG when no plan meets a queue's slack: reject the late jobs, or best effort.

``infeasible_policy = "reject"`` rejects the jobs that even the fastest plan
cannot serve in time. ``"best_effort"`` (the default) dispatches the largest
batch the queue fills now on the fastest placeable resources, or on the
cheapest at most ``best_effort_tolerance`` slower, and marks it at risk; but
when that means a cold start and a busy worker warm for the stage would do no
worse, or the start would stop another stage's idle worker, the jobs wait for
the busy worker instead (``wait_for_busy_warm``; the rules are in
:mod:`~esg_prefect.scheduling.busy_warm`).
"""

from __future__ import annotations

from collections.abc import Callable

from esg_prefect.model.jobs import Job
from esg_prefect.scheduling.base import DecisionStats
from esg_prefect.scheduling.busy_warm import BusyWarm
from esg_prefect.scheduling.dispatch import ClusterView
from esg_prefect.scheduling.esg_round import DecisionKind, QueueDecision
from esg_prefect.scheduling.frontier import Option
from esg_prefect.scheduling.tables import CandidateTables, Choice, Resource, to_us

__all__ = ["BestEffort"]


class BestEffort:
    """The infeasible policy's answers for one queue (module docstring)."""

    def __init__(self, tables: CandidateTables, busy: BusyWarm, deadline: Callable[[Job], float]) -> None:
        self.tables = tables
        self.settings = tables.settings
        self.busy = busy
        self.deadline = deadline

    def late_count(
        self,
        stage: str,
        jobs: list[Job],
        first: tuple[Option, ...],
        rest_opts: list[tuple[Option, ...]],
        now_ms: float,
    ) -> int:
        """How many of ``jobs`` (EDF order) even the fastest plan that goes now cannot serve in time."""
        now_fastest = min(o.latency_us for o in first if isinstance(o.payload, Choice) and o.payload.wait_ms == 0)
        fastest_us = now_fastest + sum(opts[0].latency_us for opts in rest_opts)
        return sum(1 for j in jobs if to_us(self.deadline(j) - now_ms) < fastest_us)

    def option(
        self, stage: str, jobs: list[Job], resources: tuple[Resource, ...], first: Callable[[], tuple[Option, ...]]
    ) -> Option:
        """The largest batch the queue fills now on the fastest resources (or the cheapest within the tolerance).

        ``first`` builds the first stage's options, read only when no resource
        can take the whole batch (then the fastest of them, a wait if nothing
        can go now).
        """
        s = self.settings
        top = min(len(jobs), s.config_space.max_batch)
        whole = [o for r in resources if (o := self.tables.single_option(stage, r, top))]
        if not whole:
            return first()[0]
        best = min(whole, key=lambda o: (o.latency_us, o.cost))
        if s.best_effort_tolerance > 0:
            limit = best.latency_us * (1.0 + s.best_effort_tolerance)
            best = min((o for o in whole if o.latency_us <= limit), key=lambda o: (o.cost, o.latency_us))
        return best

    def decide(
        self, stage: str, view: ClusterView, jobs: list[Job], best: Option, stats: DecisionStats, now_ms: float
    ) -> QueueDecision:
        """``best`` (at risk), or a hold for a busy warm worker of the stage."""
        assert isinstance(best.payload, Choice)
        c = best.payload
        s = self.settings
        top = min(len(jobs), s.config_space.max_batch)
        if (
            s.wait_for_busy_warm
            and c.cold
            and (s.idle_aware or self.busy.evicts(c, view, jobs[:top]))
            and self.busy.soon_us(stage, view, top, len(jobs), now_ms) <= best.latency_us
        ):
            # A worker warm for the stage (or starting), busy now, finishes its batch and then this
            # queue no later than a cold start would: wait for it rather than start a worker that then
            # idles (idle_aware), or that stops idle ones (the cluster is full).
            return QueueDecision(DecisionKind.BUSY, None, (), True, stats)
        if (
            s.wait_for_busy_warm
            and s.idle_aware
            and c.cold
            and view.busy_by_stage.get(stage)
            and self.busy.evicts(c, view, jobs[:top])
        ):
            # The cluster is full and the stage has a worker: late jobs wait for it rather than stop
            # another stage's idle worker, which that stage's next jobs would then start again late
            # (past capacity, such evictions feed each other: a cold-start storm).
            return QueueDecision(DecisionKind.BUSY, None, (), True, stats)
        return QueueDecision(DecisionKind.DISPATCH if c.wait_ms == 0 else DecisionKind.WAIT, c, (), True, stats)
