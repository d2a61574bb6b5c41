"""ESG_1Q: one queue's decision, the cheapest plan over the horizon that meets its slack.

Mixed into :class:`~esg_prefect.scheduling.esg.ESGScheduler`, whose state it
uses; the scheduler's module holds the round around it (EDF across queues,
then :mod:`~esg_prefect.scheduling.esg_round`). The options are built only on
the resources placeable now; a one-stage answer is kept between rounds
(:mod:`~esg_prefect.scheduling.kept`), and when no plan meets the slack the
infeasible policy answers (:mod:`~esg_prefect.scheduling.best_effort`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from esg_prefect.model.jobs import Job
from esg_prefect.model.workflow import Workflow
from esg_prefect.scheduling.base import DecisionStats, QueueState, search_stats
from esg_prefect.scheduling.best_effort import BestEffort
from esg_prefect.scheduling.dispatch import ClusterView
from esg_prefect.scheduling.esg_round import DecisionKind, QueueDecision
from esg_prefect.scheduling.frontier import Option
from esg_prefect.scheduling.hardware import HardwareSelector
from esg_prefect.scheduling.kept import Kept, with_decision_ms
from esg_prefect.scheduling.memo import Memo
from esg_prefect.scheduling.search import Clock, astar_plan
from esg_prefect.scheduling.settings import ESGSettings
from esg_prefect.scheduling.stage_plan import StagePlanner
from esg_prefect.scheduling.tables import CandidateTables, Choice, FirstPick, Resource, gap_class, to_us

__all__ = ["ESG1Q"]


class ESG1Q:
    """ESG_1Q's methods (module docstring); the attributes below are the scheduler's, set in its ``__init__``."""

    settings: ESGSettings
    tables: CandidateTables
    clock: Clock | None
    _memo: Memo
    _hardware: HardwareSelector | None
    _late: BestEffort
    _planner: StagePlanner | None

    if TYPE_CHECKING:

        def _deadline(self, job: Job) -> float: ...

    def placeable_resources(self, stage: str, view: ClusterView, now_ms: float | None = None) -> tuple[Resource, ...]:
        """Resources of the space that can take a batch of ``stage`` now, and whether warm.

        With ``idle_aware`` and ``now_ms``, a warm resource carries the gap class
        of its most recently idle worker (the one the placement reuses first).
        """
        key = ("esg-placeable", stage, now_ms)
        planner = self._planner
        if planner is None:
            return view.remember(key, lambda: self._placeable(stage, view, now_ms))
        return view.remember(key, lambda: planner.restrict(stage, self._placeable(stage, view, now_ms), view))

    def _placeable(self, stage: str, view: ClusterView, now_ms: float | None) -> tuple[Resource, ...]:
        hardware = view.hardware
        got = self._memo.get(("kinds", stage, hardware))
        if got is None:
            usable = hardware & self.tables.profile.hardware_types(stage)
            space = [(hw, v, s) for hw in sorted(usable) for v, s in self.tables.resources(hw)]
            kinds = tuple(dict.fromkeys((hw, v) for hw, v, _ in space))
            got = (kinds, tuple((hw, v, s, round(s * 100), kinds.index((hw, v))) for hw, v, s in space))
            self._memo.put(("kinds", stage, hardware), got)
        kinds, flat = got
        rooms = tuple([view.max_room(v, hw) for hw, v in kinds])  # one capacity question per (hardware, vcpus)
        warm: dict[tuple[str, int, float], int]
        if self.settings.idle_aware and now_ms is not None:
            warm = {k: gap_class(now_ms - since) for k, since in view.warm_idle_since(stage).items()}
        else:
            warm = dict.fromkeys(view.warm_resources(stage), 1)
        # The answer depends on nothing else, and the same few answers recur round after round.
        key = ("placeable", stage, hardware, rooms, frozenset(warm.items()))
        cached: tuple[Resource, ...] | None = self._memo.get(key)
        if cached is not None:
            return cached
        out: list[Resource] = []
        for hw, v, s, need, kind in flat:  # the space's order: hardware, then share, then vcpus
            flag = warm.get((hw, v, s), 0) if warm else 0
            if flag:
                out.append((hw, v, s, flag))
            elif need <= rooms[kind]:
                out.append((hw, v, s, 0))
        return self._memo.put(key, tuple(out))  # type: ignore[no-any-return]

    def decide_queue(
        self, queue: QueueState, jobs: list[Job], workflow: Workflow, view: ClusterView, now_ms: float
    ) -> QueueDecision:
        """ESG_1Q for one queue whose jobs are ``jobs`` (EDF order).

        A queue is decided again every round while it waits, mostly with the
        same inputs. The search's part of the answer is a function of (the
        queue's length, its arrival rate, the placeable resources, the
        workflow, the hardware present) and of the slack only through which
        options fit in it, so it is kept per queue with the slack interval in
        which it holds (:class:`~esg_prefect.scheduling.kept.Kept`) and reused while those inputs are the
        same: the same plan and the same statistics (the decision time aside),
        without building the options or searching again. Whatever depends on
        the rest of the cluster (the best-effort fallback's check for a busy
        warm worker) is worked out anew each time.
        """
        t0 = self.clock() if self.clock is not None else None
        stage = queue.key.stage
        hardware = view.hardware
        resources = self.placeable_resources(stage, view, now_ms)
        if self._hardware is not None:  # PALDIA: only the types that carry the queue's load
            resources = self._hardware.restrict(queue.key, resources)
        n = len(jobs)
        rate = queue.arrival_rate_per_s
        slack_us = to_us(self._deadline(jobs[0]) - now_ms)
        kept: Kept | None = self._memo.get(("kept", queue.key))
        if kept is not None and kept.holds(n, rate, resources, workflow, hardware, slack_us):
            r = kept.stats
            stats = r if t0 is None else with_decision_ms(r, self._since(t0))
            if kept.feasible:
                return QueueDecision(kept.kind, kept.choice, (), False, stats)  # one stage: no plan after it
            assert kept.best is not None
            return self._late.decide(stage, view, jobs, kept.best, stats, now_ms)
        return self._decide_queue(queue, jobs, workflow, view, now_ms, t0, resources, slack_us)

    def _decide_queue(
        self,
        queue: QueueState,
        jobs: list[Job],
        workflow: Workflow,
        view: ClusterView,
        now_ms: float,
        t0: float | None,
        resources: tuple[Resource, ...],
        slack_us: int,
    ) -> QueueDecision:
        stage = queue.key.stage
        hardware = frozenset(view.hardware)
        _, rest_opts, frontiers = self.tables.suffix(workflow, stage, hardware)
        s = self.settings
        rate = queue.arrival_rate_per_s
        # One stage with both blades: the search is the cheapest option within the slack, taken in
        # one pass over the first stage's candidates (the same plan and statistics as astar_plan's
        # closed form). Such an answer depends on the slack only through which options fit in it,
        # so it is kept for the next rounds with that slack interval.
        if not rest_opts and s.latency_blade and s.cost_blade and s.max_expansions >= 1:
            pick = self.tables.first_pick(stage, len(jobs), resources, rate, slack_us)
            if not pick.count:
                st = DecisionStats(queue.key, feasible=False, horizon=1, decision_ms=self._since(t0))
                return QueueDecision(DecisionKind.NONE, None, (), False, st)
            found = pick.best
            if found is not None and found.cost <= 0.0:  # the root already matches the greedy seed
                stats = DecisionStats(queue.key, decision_ms=self._since(t0), feasible=True, options=pick.count)
            else:
                stats = search_stats(
                    queue.key,
                    1,
                    pick.count,
                    pick.count - pick.fits,
                    pick.fits if found is not None else 0,
                    False,
                    self._since(t0),
                    found is not None,
                    1,
                    pick.count,
                )
            if found is not None:
                head = found.payload
                assert isinstance(head, Choice)
                kind = DecisionKind.WAIT if head.wait_ms > 0 else DecisionKind.DISPATCH
                self._keep(queue, len(jobs), workflow, hardware, resources, pick, stats, kind, head)
                return QueueDecision(kind, head, (), False, stats)
            return self._infeasible(queue, jobs, workflow, view, now_ms, resources, None, rest_opts, stats, pick)
        first = self.tables.first_options(stage, len(jobs), resources, rate)
        if not first:
            st = DecisionStats(queue.key, feasible=False, horizon=1 + len(rest_opts), decision_ms=self._since(t0))
            return QueueDecision(DecisionKind.NONE, None, (), False, st)
        result = astar_plan(
            [first, *rest_opts],
            slack_us,
            latency_blade=s.latency_blade,
            cost_blade=s.cost_blade,
            heuristic=s.heuristic,
            frontiers=frontiers if s.heuristic == "frontier" else None,
            max_expansions=s.max_expansions,
            time_budget_ms=s.time_budget_ms,
            clock=self.clock,
        )
        r = result.stats
        stats = search_stats(
            queue.key,
            r.expansions,
            r.generated,
            r.cut_latency,
            r.cut_cost,
            r.budget_hit,
            self._since(t0),
            result.plan is not None,
            1 + len(rest_opts),
            len(first),
        )
        if result.plan is not None:
            head = result.plan[0].payload
            assert isinstance(head, Choice)
            plan = tuple(o.payload for o in result.plan[1:] if isinstance(o.payload, Choice))
            return QueueDecision(
                DecisionKind.WAIT if head.wait_ms > 0 else DecisionKind.DISPATCH, head, plan, False, stats
            )
        return self._infeasible(queue, jobs, workflow, view, now_ms, resources, first, rest_opts, stats, None)

    def _infeasible(
        self,
        queue: QueueState,
        jobs: list[Job],
        workflow: Workflow,
        view: ClusterView,
        now_ms: float,
        resources: tuple[Resource, ...],
        first: tuple[Option, ...] | None,
        rest_opts: list[tuple[Option, ...]],
        stats: DecisionStats,
        pick: FirstPick | None,
    ) -> QueueDecision:
        """No plan meets the slack: reject the late jobs (``reject``) or go best effort.

        ``pick`` is the one-stage answer to keep (None for a multi-stage search, which is not kept);
        ``first`` the first stage's options, or None where the one-pass search did not build them
        (built here only if read).
        """
        stage = queue.key.stage
        s = self.settings

        built = first

        def first_options() -> tuple[Option, ...]:  # built at most once, only if read
            nonlocal built
            if built is None:
                built = self.tables.first_options(stage, len(jobs), resources, queue.arrival_rate_per_s)
            return built

        if s.infeasible_policy == "reject":
            late = self._late.late_count(stage, jobs, first_options(), rest_opts, now_ms)
            if late:
                return QueueDecision(DecisionKind.REJECT, None, (), False, stats, reject_count=late)
        best = self._late.option(stage, jobs, resources, first_options)
        if pick is not None and s.infeasible_policy == "best_effort":
            kept = Kept(
                len(jobs),
                queue.arrival_rate_per_s,
                resources,
                workflow,
                frozenset(view.hardware),
                pick,
                stats,
                DecisionKind.NONE,  # unread: infeasible
                None,
                best,
            )
            self._memo.put(("kept", queue.key), kept)
        return self._late.decide(stage, view, jobs, best, stats, now_ms)

    def _keep(
        self,
        queue: QueueState,
        n_jobs: int,
        workflow: Workflow,
        hardware: frozenset[str],
        resources: tuple[Resource, ...],
        pick: FirstPick,
        stats: DecisionStats,
        kind: DecisionKind,
        choice: Choice,
    ) -> None:
        """Keep a feasible one-stage answer with the slack interval over which the same options fit.

        The first stage's options are sorted by strictly rising latency
        (Pareto-pruned), and the closed-form search looks at the slack only
        through ``latency <= slack`` for each option: the answer holds for
        every slack from the latency of the last option that fits up to (not
        including) that of the first one that does not (``pick.lo_us``, ``pick.hi_us``).
        """
        kept = Kept(n_jobs, queue.arrival_rate_per_s, resources, workflow, hardware, pick, stats, kind, choice, None)
        self._memo.put(("kept", queue.key), kept)

    def _since(self, t0: float | None) -> float | None:
        return None if t0 is None or self.clock is None else self.clock() - t0
