"""The ESG scheduler: ESG_1Q (A* with dual-blade pruning) plus ESG_Dispatch.

Each round, queues are served in order of their most urgent job (EDF across
queues). For one queue, ESG_1Q (:mod:`~esg_prefect.scheduling.esg_1q`) builds
the first stage's options from the queue's real state and plans them together
with the stages after it up to the end of the horizon (ESG-SPEC section 3):

* a *dispatch-now* option per (resources, batch size) for batches the queue
  can fill now, and one for the whole queue when it holds fewer jobs than a
  larger batch size (``min(batch, len(queue))`` jobs go);
* a *wait* option per larger batch size when ``wait_for_batch`` is on and the
  queue's arrival rate is known: its latency includes the projected time to
  fill the batch, so waiting wins only while the whole plan stays within the
  slack and is cheaper, and while the oldest job has waited less than
  ``max_batch_wait_ms`` (less one projected gap between arrivals);
* only resources that can be placed now are offered (an idle warm worker, or
  room for a cold one, whose cold start is added to the latency and billed).

The slack is the earliest deadline among the queue's jobs (they are taken in
EDF order) minus ``now_ms``. Only the first stage's choice is committed
(receding horizon). When no plan meets the slack, the ``best_effort`` policy
dispatches the whole queue (up to the largest batch) on the fastest placeable
resources and marks it at risk (with ``best_effort_tolerance`` > 0, the
default 0.1, on the cheapest of those at most that fraction slower than the
fastest; ``esg-fastest`` is ESG with the spec's fastest); the
``reject`` policy rejects the jobs that even the fastest option cannot serve
in time.

On a full cluster "fastest" counts a worker warm for the stage that is busy
now: when the fastest placeable option is a cold start that would stop idle
workers to make room, and such a worker would finish its current batch (at
most the largest batch of the space) and then this one sooner, the jobs stay
queued for it (a hold, at risk) instead. Without this, an overloaded cluster
fell into a cold-start storm: each infeasible queue started a worker, evicting
idle ones of other stages, whose next jobs then found no warm worker either
(at 450 requests/s on the standard case, 8,108 of 8,221 workers were started
that way and 2.5 % of the requests met their SLO; with it, 99.9 %;
docs/results.md). Where a new worker fits without evicting, it still starts:
holding then would keep queues on whatever warm workers the warm-up left.
The knob ``wait_for_busy_warm`` turns this off (the paper's behaviour).
With ``idle_aware``, a feasible plan also defers to a stage's busy workers: a
planned cold start waits for one that frees up within the slack, and a planned
use of a surplus idle worker waits for one no dearer per job within
``consolidate_slack`` of it (:mod:`~esg_prefect.scheduling.busy_warm`); with
``wait_for_taken`` > 0, a planned cold start also waits for a worker an
earlier dispatch of the round took, when that one runs the batch within that
fraction of the cold option's latency.

After ESG_1Q, a dispatch goes through packing (Cypress), placement, hardware
review (PALDIA) and commit, and pre-warm starts follow every queue's
dispatches: one fixed order of small policies, each on only with its knob
(:mod:`~esg_prefect.scheduling.esg_round`).

Pre-warming (``prewarm``, not in the paper): since a cold start rarely fits a
slack, a scheduler that starts workers only with jobs on them keeps serving
each queue from whatever warm workers it has, e.g. those the warm-up's best
effort started on the fastest (dearest) GPUs. After a dispatch onto a warm
worker, when resources that would run the same batch in the same slack once
warm cost ``prewarm_saving`` less per job, ESG also returns a
:class:`~esg_prefect.scheduling.base.Start` for them, placed after every
queue's dispatches (it takes only capacity the round left, never evicting).

Example:
    >>> from esg_prefect.model import (Config, ConfigSpace, LatencyProfile, ProfilePoint, PriceSheet,
    ...     Workflow, QueueKey, Job, cpu_cluster)
    >>> prof = LatencyProfile([ProfilePoint("m", "cpu", b, 1, 0.0, 10.0 + 2 * b) for b in (1, 2, 4)])
    >>> sched = ESGScheduler(prof, PriceSheet(1e-5, {}),
    ...     ESGSettings(config_space=ConfigSpace((1, 2, 4), (1,), (0.0,))))
    >>> wf = Workflow.chain("w", ["m"], slo_ms=100)
    >>> q = QueueKey("w", "m")
    >>> jobs = tuple(Job(f"j{i}", f"r{i}", f"r{i}", q, 0.0, 0.0, 100.0, 100.0) for i in range(4))
    >>> res = sched.decide(Snapshot((QueueState(q, jobs),), cpu_cluster(1, 2), {"w": wf}), now_ms=0.0)
    >>> [(d.config.batch, d.predicted_ms) for d in res.dispatches]
    [(4, 18.0)]
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter

from esg_prefect.exceptions import MissingProfileError
from esg_prefect.model.config import Config
from esg_prefect.model.jobs import Job, QueueKey
from esg_prefect.model.pricing import PriceSheet
from esg_prefect.model.profile import LatencyProfile
from esg_prefect.model.unchecked import unchecked
from esg_prefect.model.workflow import Workflow
from esg_prefect.scheduling.base import (
    DecisionStats,
    Dispatch,
    Hold,
    QueueState,
    Reject,
    SchedulingResult,
    Snapshot,
    Start,
)
from esg_prefect.scheduling.best_effort import BestEffort
from esg_prefect.scheduling.busy_warm import Bookings, BusyWarm
from esg_prefect.scheduling.dispatch import ClusterView, ViewCache
from esg_prefect.scheduling.esg_1q import ESG1Q
from esg_prefect.scheduling.esg_round import (
    TAKEN_SHARE,
    DecisionKind,
    HardwareReview,
    Lookahead,
    Packing,
    Prewarm,
    QueueDecision,
    start_cold,
    starting,
)
from esg_prefect.scheduling.memo import Memo
from esg_prefect.scheduling.paldia import paldia_features
from esg_prefect.scheduling.search import Clock
from esg_prefect.scheduling.settings import ESGSettings
from esg_prefect.scheduling.sharing import SharedBatches
from esg_prefect.scheduling.stage_plan import NewCalls, StagePlanner, StartSpare
from esg_prefect.scheduling.tables import CandidateTables, Choice

__all__ = ["ESGScheduler", "QueueDecision"]

_no_rate = unchecked(QueueState)  # a queue the round already holds, its rate set to 0 (_bounded_wait)


class ESGScheduler(ESG1Q):
    """ESG: pipeline-conscious batch, vCPU and GPU-share choice, then placement.

    The round is here; ESG_1Q for one queue (:meth:`decide_queue`,
    :meth:`placeable_resources`) is mixed in from :class:`~esg_prefect.scheduling.esg_1q.ESG1Q`.

    Args:
        profile: the latency model.
        prices: the price sheet.
        settings: the knobs (defaults from ESG-SPEC).
        clock: monotonic clock in ms, injected to enforce the time budget and
            measure decision time; without it decisions are fully deterministic.

    Examples:
        Create by name through the registry, as the runtime and simulator do::

            from esg_prefect.scheduling import create_scheduler
            sched = create_scheduler("esg", profile, prices)
    """

    name = "esg"

    def __init__(
        self,
        profile: LatencyProfile,
        prices: PriceSheet,
        settings: ESGSettings | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.settings = settings or ESGSettings()
        self.tables = CandidateTables(profile, prices, self.settings)
        self.clock = clock
        self._views = ViewCache(self.settings.allow_eviction)
        # The deadline a job is planned to (the search horizon's), and EDF order's key: that deadline, then
        # ready time, then id, read at C speed (a queue past capacity holds thousands of jobs).
        self._deadline_field = "e2e_deadline_ms" if self.settings.search_horizon == "workflow" else "deadline_ms"
        self._edf_key: Callable[[Job], tuple[float, float, str]] = attrgetter(
            self._deadline_field, "ready_ms", "job_id"
        )
        self._busy = BusyWarm(self.tables)  # the rules for a stage's busy warm workers (scheduling.busy_warm)
        self._late = BestEffort(self.tables, self._busy, self._deadline)  # no plan meets the slack
        # PALDIA's features (knobs hardware_selection, hybrid_sharing): None when off, the paper's ESG.
        self._hardware, hybrid = paldia_features(self.tables)
        self._packing = Packing.of(self.tables)
        self._review = HardwareReview(hybrid) if hybrid is not None else None
        # Every answer kept between rounds (scheduling.memo): per (stage, hardware present) its
        # resource kinds; per capacity state the placeable resources; per queue its EDF order and
        # latest one-stage answer; per cold-resource tuple their options once warm.
        self._memo = Memo()
        self._prewarm = Prewarm(self.tables, self._hardware, self._memo) if self.settings.prewarm else None
        self._lookahead = Lookahead(self.tables, self._memo) if self.settings.lookahead_starts else None
        # Batches across workflows' queues of one stage (share_batches), of the stages packing does not re-size.
        packed = frozenset() if self._packing is None else self._packing.stages
        max_batch = self.settings.config_space.max_batch
        self._sharing = SharedBatches(self.tables, max_batch, packed) if self.settings.share_batches else None
        # A steady stage's starts held to one kind and a count (stage_plan; scheduling.stage_plan).
        self._planner = StagePlanner(self.tables) if self.settings.stage_plan else None
        # The calls new since the last round, scanned once for the planner and the lookahead.
        self._calls = NewCalls() if self._planner is not None or self._lookahead is not None else None

    # ---- the round ---------------------------------------------------------

    def decide(self, snapshot: Snapshot, now_ms: float) -> SchedulingResult:
        """Decide this round's dispatches; see the module docstring."""
        view = self._views.view(snapshot.cluster)
        if self._hardware is not None:
            self._hardware.observe(snapshot, now_ms)
        if self._calls is not None:
            new = self._calls.take(snapshot, now_ms)
            if self._planner is not None:
                self._planner.observe(new, snapshot, now_ms, view.hardware)
            if self._lookahead is not None:
                self._lookahead.observe(new)
        if self._review is not None:
            self._review.hybrid.begin_round(snapshot.cluster, now_ms)
        dispatches: list[Dispatch] = []
        holds: list[Hold] = []
        rejects: list[Reject] = []
        stats: list[DecisionStats] = []
        starts: list[Start] = []
        candidates: list[tuple[QueueKey, Choice, float]] = []  # warm dispatches that may call for a pre-warm
        sent: list[tuple[Workflow, str, int]] = []  # the round's batches, for the lookahead
        queues = [q for q in snapshot.queues if q.jobs]
        pending = {q.key: self._edf(q) for q in queues}
        queues.sort(key=lambda q: (self._edf_key(pending[q.key][0]), q.key))
        shared = self._sharing
        if shared is not None:
            shared.begin(pending)
        cap = self.settings.max_batch_wait_ms
        busy, consolidate, booked = self._busy, self.settings.consolidate_slack > 0, Bookings()
        for q in queues:
            wf = snapshot.workflows[q.key.workflow]
            jobs = pending[q.key] if shared is None else shared.free(q.key)
            if cap and jobs and q.arrival_rate_per_s > 0:
                q = self._bounded_wait(q, jobs, cap, now_ms)
            while jobs:
                try:
                    dec = self.decide_queue(q, jobs, wf, view, now_ms)
                except MissingProfileError as exc:
                    rejects.append(Reject(q.key, tuple(j.job_id for j in jobs), str(exc)))
                    break
                stats.append(dec.stats)
                if dec.kind is DecisionKind.REJECT:
                    gone, jobs = jobs[: dec.reject_count], jobs[dec.reject_count :]
                    rejects.append(
                        Reject(q.key, tuple(j.job_id for j in gone), "no configuration can meet the deadline")
                    )
                    continue
                if dec.kind is DecisionKind.BUSY:
                    holds.append(
                        Hold(q.key, "no plan meets the slack; the jobs wait for a busy warm worker of the stage")
                    )
                    break
                if dec.kind is DecisionKind.NONE or dec.choice is None:
                    holds.append(Hold(q.key, "no capacity for any configuration; jobs stay queued"))
                    break
                c = dec.choice
                if dec.kind is DecisionKind.WAIT:
                    holds.append(
                        Hold(
                            q.key,
                            f"waiting for batch {c.config.batch}: {len(jobs)} queued, ~{c.wait_ms:.1f} ms to fill",
                        )
                    )
                    break
                if dec.at_risk and c.cold and self.settings.wait_for_busy_warm:
                    # Within the slack and a hundredth of the cold option's latency (its cold start included):
                    # the start would only be late.
                    left = min(self._deadline(jobs[0]) - now_ms, c.latency_ms / TAKEN_SHARE)
                    if busy.taken_in_time(c, left, view, now_ms, booked):
                        holds.append(Hold(q.key, "a worker this round took frees up within the slack: no new worker"))
                        break
                if self.settings.idle_aware and not dec.at_risk:
                    left = self._deadline(jobs[0]) - now_ms - sum(p.latency_ms for p in dec.plan)
                    if c.cold and busy.frees_in_time(c, left, view, now_ms):
                        holds.append(Hold(q.key, "a busy warm worker frees up within the slack: no new worker"))
                        break
                    if (
                        c.cold
                        and self.settings.wait_for_taken > 0
                        and busy.taken_in_time(
                            c, min(left, c.latency_ms * self.settings.wait_for_taken), view, now_ms, booked
                        )
                    ):
                        holds.append(Hold(q.key, "a worker this round took frees up within the slack: no new worker"))
                        break
                    if not c.cold and consolidate and busy.consolidates(c, left, view, now_ms, booked):
                        holds.append(Hold(q.key, "a busy warm worker no dearer per job runs it in time: no surplus"))
                        break
                # The fixed order after ESG_1Q (scheduling.esg_round): packing, placement, review, commit.
                if self._packing is not None:
                    left = self._deadline(jobs[0]) - now_ms - sum(p.latency_ms for p in dec.plan)
                    c = self._packing.shape(c, [j.input_size for j in jobs], None if dec.at_risk else left)
                batch, jobs = jobs[: c.config.batch], jobs[c.config.batch :]
                if shared is not None and not dec.at_risk:
                    room = self._deadline(batch[0]) - now_ms - sum(p.latency_ms for p in dec.plan) - c.latency_ms
                    c, batch = shared.top_up(q.key, c, batch, room, now_ms)
                placement = view.place(
                    c.stage, c.config.vcpus, c.config.gpu_share, c.hardware, (j.input_node for j in batch)
                )
                if placement is None:  # options were placeable when built; kept as a guard
                    holds.append(Hold(q.key, "no capacity for the chosen configuration"))
                    break
                predicted_ms = c.latency_ms
                if self._review is not None:
                    due = self._deadline(batch[0]) - sum(p.latency_ms for p in dec.plan)
                    verdict = self._review.review(c, placement, view, now_ms, due)
                    if isinstance(verdict, str):
                        holds.append(Hold(q.key, verdict))
                        break
                    placement, predicted_ms = verdict
                view.commit(placement, c.config.vcpus, c.config.gpu_share, now_ms + predicted_ms)
                if shared is not None:
                    shared.dispatched(batch)
                dispatches.append(
                    Dispatch(
                        q.key,
                        tuple(j.job_id for j in batch),
                        c.config,
                        c.hardware,
                        placement,
                        predicted_ms,
                        tuple((p.stage, p.config, p.hardware) for p in dec.plan),
                        dec.at_risk,
                        self._reason(c, dec, placement.rule),
                    )
                )
                sent.append((wf, c.stage, len(batch)))
                if self._prewarm is not None and not dec.at_risk and not placement.cold:
                    left = self._deadline(batch[0]) - now_ms - sum(p.latency_ms for p in dec.plan)
                    candidates.append((q.key, c, left))
        if self._lookahead is not None:
            workflows = tuple(snapshot.workflows.values())
            self._lookahead.starts(
                sent, workflows, view, lambda st: self.placeable_resources(st, view, now_ms), starts, now_ms
            )
        # Pre-warm starts take what the round's dispatches left: every queue is served first.
        for key, c, left in candidates:
            assert self._prewarm is not None
            start = self._prewarm.start(key, c, left, view, self.placeable_resources(key.stage, view, now_ms), starts)
            if start is not None:
                starts.append(start)
        retire: tuple[str, ...] = ()
        if self._planner is not None:
            spare = self._spare_starter(snapshot, view, starts) if self.settings.stage_plan_retire_cheap_spare else None
            retire = self._planner.surplus(view, now_ms, spare)
        return SchedulingResult(tuple(dispatches), tuple(holds), tuple(rejects), tuple(stats), tuple(starts), retire)

    @staticmethod
    def _spare_starter(snapshot: Snapshot, view: ClusterView, starts: list[Start]) -> StartSpare:
        """The start of a held stage's cheap spare (``stage_plan_retire_cheap_spare``): one start of a stage at a
        time, for the first workflow's queue of the stage, with room and without stopping anyone; appended to
        ``starts``."""

        def start(stage: str, cfg: Config, hardware: str, reason: str) -> None:
            key = next((QueueKey(n, stage) for n, wf in snapshot.workflows.items() if stage in wf.stages), None)
            if key is None or starting(stage, view, starts):
                return
            got = start_cold(key, cfg, hardware, view, reason)
            if got is not None:
                starts.append(got)

        return start

    @staticmethod
    def _bounded_wait(q: QueueState, jobs: list[Job], cap_ms: float, now_ms: float) -> QueueState:
        """``q``, or ``q`` with no arrival rate (no wait options) once waiting would pass ``max_batch_wait_ms``.

        The rate's projection reads a clump of arrivals (a flow's fan-out, a
        batch's results reaching the next stage) as a stream and keeps
        promising jobs that do not come; the bound caps what that costs.
        """
        gap_ms = 1000.0 / q.arrival_rate_per_s
        if gap_ms <= cap_ms and now_ms - min(j.ready_ms for j in jobs) + gap_ms <= cap_ms:
            return q
        return _no_rate(q.key, q.jobs, 0.0)

    def _edf(self, q: QueueState) -> list[Job]:
        """The queue's jobs in EDF order; the order is kept while the queue holds the same jobs."""
        key = ("edf", q.key)
        got: list[Job] | None = self._memo.get(key, q.jobs)
        if got is None:
            got = self._memo.put(key, sorted(q.jobs, key=self._edf_key), q.jobs)
        return list(got)

    def _deadline(self, job: Job) -> float:
        return getattr(job, self._deadline_field)  # type: ignore[no-any-return]

    def _reason(self, c: Choice, dec: QueueDecision, rule: int) -> str:
        where = {
            1: "warm worker on the inputs' node",
            2: "warm worker",
            3: "cold start on the inputs' node",
            4: "cold start, best fit",
        }[rule]
        if dec.at_risk:
            tol = self.settings.best_effort_tolerance
            pick = f"cheapest option within {tol:.0%} of the fastest" if tol > 0 else "fastest option"
            return f"no plan meets the slack: {pick}, best effort ({where})"
        return f"cheapest plan within the slack over {dec.stats.horizon} stage(s) ({where})"
