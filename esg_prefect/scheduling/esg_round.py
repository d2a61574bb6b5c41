"""ESG's round after ESG_1Q: small policies run in one fixed order, each on only when its knob is.

For each queue, most urgent first (EDF across queues), ESG_1Q decides
(:class:`DecisionKind`): dispatch, wait for a fuller batch, hold for a busy
warm worker, hold for lack of capacity, or reject. A dispatch then goes
through, in this order:

1. **Packing** (Cypress, ``size_aware``): the batch re-sized by its items'
   predicted time within the time its plan leaves (:mod:`~esg_prefect.scheduling.packing`).
2. **Placement** (ESG_Dispatch): a warm worker on the inputs' node, any warm
   worker, a cold start on the inputs' node, best fit
   (:class:`~esg_prefect.scheduling.dispatch.ClusterView`).
3. **Hardware review** (PALDIA, ``hybrid_sharing``): co-run beside the
   device's busy tenants now, on a less busy device of the type, or hold the
   queue until they finish (:mod:`~esg_prefect.scheduling.hybrid`).
4. **Commit**: the round's view takes the capacity; the dispatch is emitted.

After every queue was served, **lookahead** (``lookahead_starts``) starts the
next stages' workers for the round's batches (:class:`Lookahead`), and
**pre-warm** (``prewarm``) starts cheaper workers with the capacity the round
left (:class:`Prewarm`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from esg_prefect.model.config import Config
from esg_prefect.model.jobs import QueueKey
from esg_prefect.model.workflow import Workflow
from esg_prefect.scheduling.base import DecisionStats, Placement, Start
from esg_prefect.scheduling.dispatch import ClusterView
from esg_prefect.scheduling.hardware import HardwareSelector
from esg_prefect.scheduling.hybrid import HybridSharing
from esg_prefect.scheduling.memo import Memo
from esg_prefect.scheduling.packing import pack, packed_stages, packs
from esg_prefect.scheduling.stage_plan import stage_budgets
from esg_prefect.scheduling.tables import CandidateTables, Choice, Resource
from esg_prefect.scheduling.waves import Waves


class DecisionKind(StrEnum):
    """What ESG_1Q decided for a queue."""

    DISPATCH = "dispatch"
    WAIT = "wait"  # for a fuller batch
    NONE = "none"  # nothing placeable
    BUSY = "busy"  # wait for a busy warm worker
    REJECT = "reject"


@dataclass(frozen=True, slots=True)
class QueueDecision:
    """The outcome of one ESG_1Q call, before placement."""

    kind: DecisionKind
    choice: Choice | None
    plan: tuple[Choice, ...]
    at_risk: bool
    stats: DecisionStats
    reject_count: int = 0


class Packing:
    """Cypress: re-size a dispatch's batch by its items' predicted time (None when the knob is off)."""

    def __init__(self, tables: CandidateTables) -> None:
        self.tables = tables
        self.max_batch = tables.settings.config_space.max_batch
        self.stages = packed_stages(tables)  # the stages it may re-size; shared batches keep off them

    @classmethod
    def of(cls, tables: CandidateTables) -> Packing | None:
        """The policy when ``size_aware`` is on and the profile has a size model, else None."""
        return cls(tables) if packs(tables) else None

    def shape(self, c: Choice, sizes: list[float], budget_ms: float | None) -> Choice:
        """``c`` re-sized to the jobs (EDF order) whose predicted time fits ``budget_ms`` (None: at risk)."""
        return pack(self.tables, c, sizes[: self.max_batch], self.max_batch, budget_ms)


class HardwareReview:
    """PALDIA's hybrid sharing: run a dispatch beside busy tenants now, elsewhere, or hold it."""

    def __init__(self, hybrid: HybridSharing) -> None:
        self.hybrid = hybrid

    def review(
        self, c: Choice, placement: Placement, view: ClusterView, now_ms: float, due_ms: float
    ) -> tuple[Placement, float] | str:
        """The placement and predicted time to commit, or the reason to hold the queue."""
        verdict = self.hybrid.review(c, placement, view, now_ms, due_ms)
        if verdict.wait:
            return verdict.reason
        self.hybrid.committed(verdict.placement, now_ms, verdict.latency_ms)
        return verdict.placement, verdict.latency_ms


class Prewarm:
    """Start a cheaper worker off the requests' path after a dispatch onto a dear warm one (``prewarm``).

    If resources that could run the same batch within the same slack once warm
    cost at least ``prewarm_saving`` less per job, have room without stopping
    anyone, and none of that kind is idle for the stage, the cheapest of them
    is started: the next rounds find it warm and the search moves the queue
    onto it; the dear worker then serves only what the cheap one cannot take,
    and expires once the queue stops needing it. One start per stage at a time
    (none while a worker of the stage is still starting), so a queue's demand
    is met one worker after another, as it proves to need them.
    """

    def __init__(self, tables: CandidateTables, hardware: HardwareSelector | None, memo: Memo) -> None:
        self.tables, self.hardware, self.memo = tables, hardware, memo
        self.saving = tables.settings.prewarm_saving

    def start(
        self,
        key: QueueKey,
        c: Choice,
        left_ms: float,
        view: ClusterView,
        resources: tuple[Resource, ...],
        starts: list[Start],
    ) -> Start | None:
        """A worker to start for queue ``key``, just served by ``c`` within ``left_ms``, or None."""
        stage = key.stage
        if starting(stage, view, starts):
            return None
        batch = c.config.batch
        ceiling = (1.0 - self.saving) * self.tables.prices.batch_cost(c.config, c.hardware, c.latency_ms) / batch
        if self.hardware is not None:
            resources = self.hardware.restrict(key, resources)
        # The cheapest (then fastest, then first) of the cold resources' options once warm within the
        # slack, if it costs at most the ceiling.
        found = next(
            (e for e in warm_options(self.tables, self.memo, stage, resources, batch) if e[1] <= left_ms), None
        )
        if found is None or found[0] > ceiling:
            return None
        per_job, best = found[0], found[3]
        cfg, hw, lat = best.config, best.hardware, best.latency_ms
        if view.has_idle_warm(stage, cfg.vcpus, cfg.gpu_share, hw):
            return None
        reason = (
            f"pre-warm: {hw} share {cfg.gpu_share} would run batch {batch} in {lat:.1f} ms at "
            f"{per_job:.3g} per job, under {ceiling:.3g} on {c.hardware} share {c.config.gpu_share}"
        )
        return start_cold(key, cfg, hw, view, reason)


TAKEN_SHARE = 100.0
"""A start is skipped for a busy worker of the stage that serves the batch within 1/this of the start's latency:
only where starting is pure waste (sub-millisecond batches, cold starts of hundreds of ms); nearer bounds
cost the bursty code trace SLO hits, where late starts are the next wave's capacity (whole-bill.md, section 14)."""


class Lookahead:
    """Start the next stages' workers as a batch goes out (``lookahead_starts``).

    A wave of requests reaches a pipeline's stages one after another. ESG's plan for a batch prices
    the next stages warm; where one has no idle warm worker and none starting, the wave would meet a
    cold start there, late and often on a dear type. The start is made now, while the batch runs:
    the cheapest kind that runs the batch within the next stage's part of its workflow's SLO once warm
    (:func:`~esg_prefect.scheduling.stage_plan.stage_budgets`), with room and without stopping anyone,
    one per stage a round. Only for a stage whose calls come in waves (:mod:`~esg_prefect.scheduling.waves`):
    on a steady stage every worker is busy often, and a start each time would add workers its queue does
    not need.
    """

    def __init__(self, tables: CandidateTables, memo: Memo) -> None:
        self.tables, self.memo = tables, memo
        self._budgets: dict[tuple[tuple[Workflow, ...], frozenset[str]], dict[str, float]] = {}
        self.waves = Waves()

    def observe(self, new: Mapping[str, Sequence[float]]) -> None:
        """Feed ``new``, the calls that became ready since the last round (:class:`~esg_prefect.scheduling.stage_plan.
        NewCalls`), to the stages' wave detector (a stage with no call yet is never in waves, so it is never started
        ahead: a runtime worker loads the code its calls named)."""
        for stage, times in new.items():
            for t in times:
                self.waves.observe(stage, t)

    def starts(
        self,
        sent: list[tuple[Workflow, str, int]],
        workflows: tuple[Workflow, ...],
        view: ClusterView,
        resources: Callable[[str], tuple[Resource, ...]],
        starts: list[Start],
        now_ms: float,
    ) -> None:
        """Append to ``starts`` the workers that the round's batches ``sent`` (workflow, stage, size) call for.

        None for a next stage whose busy worker (one this round took, say) runs the batch within a hundredth
        of the start's cold start: a stage of sub-millisecond batches and a cold start of hundreds of ms
        would start a worker per burst that its one worker serves before the start is done.
        """
        key = (workflows, view.hardware)
        budgets = self._budgets.get(key)
        if budgets is None:
            budgets = self._budgets[key] = stage_budgets(workflows, self.tables, view.hardware)
        for wf, stage, n in sent:
            for nxt in wf.successors(stage):
                budget = budgets.get(nxt)
                if budget is None or not self.waves.in_waves(nxt) or view.warm_resources(nxt):
                    continue
                if starting(nxt, view, starts):
                    continue
                res = resources(nxt)
                found = next((e for e in warm_options(self.tables, self.memo, nxt, res, n) if e[1] <= budget), None)
                if found is None:
                    continue
                cfg, hw = found[3].config, found[3].hardware
                if self._busy_serves(nxt, n, view, now_ms, self.tables.profile.cold_start_ms(nxt, hw) / TAKEN_SHARE):
                    continue
                reason = f"lookahead: {hw} share {cfg.gpu_share} for a batch of {n} coming from {stage}"
                got = start_cold(QueueKey(wf.name, nxt), cfg, hw, view, reason)
                if got is not None:
                    starts.append(got)

    def _busy_serves(self, stage: str, batch: int, view: ClusterView, now_ms: float, within_ms: float) -> bool:
        """Whether a busy worker warm for ``stage`` (the snapshot's, or one this round took) runs ``batch`` once free
        within ``within_ms``."""
        for w in (*view.busy_by_stage.get(stage, ()), *view.taken(stage)):
            if w.free_at_ms is None:
                continue
            lat = self.tables.latency_ms(stage, batch, w.vcpus, w.gpu_share, w.hardware)
            if lat is not None and max(0.0, w.free_at_ms - now_ms) + lat <= within_ms:
                return True
        return False


def starting(stage: str, view: ClusterView, starts: list[Start]) -> bool:
    """Whether a worker of ``stage`` is loading or among this round's ``starts`` (one start per stage at a time)."""
    return any(w.starting for w in view.busy_by_stage.get(stage, ())) or any(s.queue.stage == stage for s in starts)


def start_cold(key: QueueKey, cfg: Config, hardware: str, view: ClusterView, reason: str) -> Start | None:
    """A start of ``cfg`` on ``hardware`` for queue ``key``, placed where it has room without stopping anyone and
    committed to ``view``; None where there is no such room."""
    placement = view.place(key.stage, cfg.vcpus, cfg.gpu_share, hardware, ())
    if placement is None or not placement.cold or placement.evict:
        return None
    view.commit(placement, cfg.vcpus, cfg.gpu_share)
    return Start(key, cfg, hardware, placement, reason)


def warm_options(
    tables: CandidateTables, memo: Memo, stage: str, resources: tuple[Resource, ...], batch: int
) -> tuple[tuple[float, float, int, Choice], ...]:
    """Each cold resource's option for ``batch`` once warm, as (cost, latency, position, choice), cheapest first.

    Kept per placeable-resources tuple (the same few recur round after round), anchored to it.
    """
    key = ("warm", stage, id(resources), batch)
    got: tuple[tuple[float, float, int, Choice], ...] | None = memo.get(key, resources)
    if got is not None:
        return got
    out = []
    for i, (hw, vcpus, share, warm) in enumerate(resources):
        if warm:
            continue
        o = tables.single_option(stage, (hw, vcpus, share, True), batch)
        if o is not None:
            assert isinstance(o.payload, Choice)
            out.append((o.cost, o.payload.latency_ms, i, o.payload))
    options = tuple(sorted(out, key=lambda e: e[:3]))
    memo.put(key, options, resources)
    return options
