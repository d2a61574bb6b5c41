"""The wiring between requests, AFW queues, the scheduler and the simulated cluster.

This is the simulator's counterpart of the runtime's pool: it does what the
pool does and nothing the scheduler does. It keeps one AFW queue per
(workflow, stage) with an arrival-rate estimator, turns each request into jobs
as their upstream stages finish (each carrying the deadline of its SLO
segment from the scheduler's own :class:`~esg_prefect.scheduling.tables.CandidateTables`),
calls ``scheduler.decide(snapshot, now_ms)`` and applies the decisions to the
cluster. All planning (batch sizes, resources, placement, waiting) is the
scheduler's: the controller never second-guesses a decision (STYLE.md, after
AlpaServe: never copy controller logic into the simulator).

When rounds happen (the runtime makes the same calls):

* after an arrival, a batch completion or the end of a pre-warm start (a
  worker loaded off the requests' path, ``Start``); events of one instant are
  coalesced into one round, and so are events that come less than
  ``SimSpec.round_interval_ms`` after the previous round (a real controller
  cannot decide faster than its decisions take; 0 reacts at every instant);
* on the timer: while any job waits, a round runs at least every
  ``settings.tick_ms`` (the timer restarts at every round, so a round that
  just ran for an arrival is not repeated for nothing);
* never when no job waits (every scheduler then decides nothing).

The run ends when the last request has finished (or failed) after the last
arrival: idle workers are billed up to that instant and then stopped. (A
platform serving a steady stream would keep them busy; billing the
keep-alive tail of a finite run would charge the workload for the run's end.)
Requests still unfinished ``SimSpec.drain_s`` after the last arrival fail; no
round runs after that cutoff.

Deadlines: a job of stage ``s`` ready at ``t`` carries
``dist.deadline_after(s, arrival, segment_start)`` with slack redistribution
on (``segment_start`` is ``t`` for a single-stage segment, and the time the
region's first jobs became ready for a fork-join region), else
``dist.deadline_ms(s, arrival)``; its end-to-end deadline is arrival + SLO.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from esg_prefect.exceptions import InvalidInputError, WorkflowError
from esg_prefect.model.attribution import BatchItem, BatchRecord
from esg_prefect.model.jobs import Job, QueueKey
from esg_prefect.model.records import RequestRecord, StageRecord
from esg_prefect.model.slo import SLODistribution
from esg_prefect.model.unchecked import unchecked
from esg_prefect.model.workflow import Workflow
from esg_prefect.scheduling.base import DecisionStats, Dispatch, QueueState, Scheduler, Snapshot, Start
from esg_prefect.scheduling.search import Clock
from esg_prefect.scheduling.settings import ESGSettings
from esg_prefect.scheduling.tables import CandidateTables
from esg_prefect.simulator.cluster import BatchTiming, SimCluster, SimWorker
from esg_prefect.simulator.engine import EventLoop
from esg_prefect.workload.rate import ArrivalRateEWMA

# Event kinds, in the order events of one instant are handled.
DONE, ARRIVAL, EXPIRE, TICK, WARM = 0, 1, 2, 3, 4

# The controller builds its jobs and records from values it made itself (finite times in order,
# normalised shares, sizes checked by the runner): it skips their checks (esg_prefect.model.unchecked).
_job = unchecked(Job)
_stage_record = unchecked(StageRecord)
_request_record = unchecked(RequestRecord)
_batch_item = unchecked(BatchItem)
_batch_record = unchecked(BatchRecord)


# A QueueState without its O(jobs) check: the controller gives every job of a queue the queue's own
# key object and its rate comes from ArrivalRateEWMA (finite, >= 0), so the check holds by
# construction; under a backlog of thousands of jobs it cost more than the scheduling round. Tests
# build checked states from the same values.
_queue_state = unchecked(QueueState)
# A Snapshot without its check: queue keys come from the controller's own plans.
_snapshot = unchecked(Snapshot)


class _Plan:
    """What the controller precomputes per workflow."""

    __slots__ = (
        "dist",
        "entries",
        "exits",
        "in_degree",
        "keys",
        "region",
        "segment",
        "successors",
        "workflow",
    )

    def __init__(self, workflow: Workflow, dist: SLODistribution) -> None:
        self.workflow = workflow
        self.dist = dist
        self.successors = {s: workflow.successors(s) for s in workflow.stages}
        self.in_degree = {s: len(workflow.predecessors(s)) for s in workflow.stages}
        self.exits = frozenset(workflow.exits)
        self.segment = {s: dist.segment_of(s).index for s in workflow.stages}
        self.region = {s: dist.segment_of(s).is_region for s in workflow.stages}
        self.keys = {s: QueueKey(workflow.name, s) for s in workflow.stages}
        self.entries = workflow.entries  # (a property that asks the graph: kept here, read per arrival)


class _Request:
    """A request in flight."""

    __slots__ = (
        "arrival_ms",
        "at_risk",
        "exits_left",
        "failed",
        "pending",
        "plan",
        "pred_nodes",
        "queued",
        "request_id",
        "seg_start",
        "size",
    )

    def __init__(self, request_id: str, plan: _Plan, arrival_ms: float, size: float = 1.0) -> None:
        self.request_id = request_id
        self.size = size  # relative to a typical request (esg_prefect.workload.sizes)
        self.plan = plan
        self.arrival_ms = arrival_ms
        self.pending = dict(plan.in_degree)
        self.exits_left = len(plan.exits)
        self.seg_start: dict[int, float] = {}
        self.pred_nodes: dict[str, list[str]] = {}
        self.queued: set[str] = set()
        self.failed = False
        self.at_risk = False


class _Queue:
    """An AFW queue: waiting jobs (in arrival order) and the arrival-rate estimate."""

    __slots__ = ("jobs", "key", "rate", "state")

    def __init__(self, key: QueueKey, alpha: float) -> None:
        self.key = key
        self.jobs: dict[str, Job] = {}
        self.rate = ArrivalRateEWMA(alpha)
        self.state: QueueState | None = None


@dataclass(frozen=True, slots=True)
class _Running:
    """A batch in flight."""

    batch_id: str
    worker: SimWorker
    jobs: tuple[Job, ...]
    dispatch: Dispatch
    start_ms: float
    timing: BatchTiming


_running = unchecked(_Running)


class Controller:
    """Requests -> queues -> ``scheduler.decide`` -> the simulated cluster.

    Args:
        loop: the event loop (its clock is the run's clock).
        cluster: the simulated cluster.
        scheduler: the very scheduler object a runtime would use.
        workflows: workflows by name.
        tables: the tables that give jobs their deadlines.
        settings: the knobs shared with the runtime (tick, EWMA alpha, keep-alive, slack redistribution).
        clock: wall clock in ms to time each ``decide`` call (None: not timed).

    Raises:
        WorkflowError: when a stage has no latency profile on the cluster's hardware.
    """

    def __init__(
        self,
        loop: EventLoop,
        cluster: SimCluster,
        scheduler: Scheduler,
        workflows: dict[str, Workflow],
        tables: CandidateTables,
        settings: ESGSettings,
        clock: Clock | None = None,
    ) -> None:
        self.loop = loop
        self.cluster = cluster
        self.scheduler = scheduler
        self.workflows = workflows
        self.settings = settings
        self.clock = clock
        hardware = cluster.hardware_types()
        self.plans: dict[str, _Plan] = {}
        for name, wf in workflows.items():
            for s in wf.stages:
                if not (cluster.profile.hardware_types(s) & hardware):
                    raise WorkflowError(
                        f"workflow {name!r}: stage {s!r} has no latency profile on the cluster's hardware "
                        f"{sorted(hardware)} (profiled on {sorted(cluster.profile.hardware_types(s)) or 'nothing'})"
                    )
            self.plans[name] = _Plan(wf, tables.slo(wf, hardware))
        self.queues: dict[QueueKey, _Queue] = {}
        self.requests: dict[str, _Request] = {}
        self.request_records: list[RequestRecord] = []
        self.stage_records: list[StageRecord] = []
        self.decisions: list[DecisionStats] = []
        self.rounds = 0
        self.decide_ms: list[float] = []
        self.cutoff_ms = float("inf")
        self._waiting = 0
        self._dirty = False  # an arrival or completion since the latest round
        self._last_round_ms = -math.inf
        self._wake_at: float | None = None  # the pending wake-up (TICK) event
        self.round_interval_ms = 0.0  # least time between rounds (SimSpec.round_interval_ms)
        self._n_requests = 0
        self._n_batches = 0
        self._job_index: dict[str, _Request] = {}
        self.arrivals_left = 0  # set by the runner: arrivals scheduled and not yet handled
        self.request_sizes: Sequence[float] = ()  # set by the runner: relative size of each arrival, in order
        # Each stage's typical item (what its profile was measured with), to turn relative sizes into the
        # stage's own unit; the size model's truth applies only where the profile carries one.
        sizes = cluster.profile.sizes
        self._sized = sizes is not None
        self._typical: dict[str, float] = {}
        if sizes is not None:
            for wf in workflows.values():
                for s in wf.stages:
                    self._typical[s] = sizes.typical_item_size(s) or 1.0
        self._open = 0  # requests neither finished nor failed
        self._in_flight = 0  # batches running
        self._starting = 0  # pre-warm starts loading
        self.prewarms = 0  # workers started without jobs (Start decisions)
        self.at_risk_cold_starts = 0  # new workers started for best-effort (at-risk) dispatches

    # ---- events ------------------------------------------------------------------------

    def handle(self, kind: int, payload: object) -> None:
        """One event (called by the loop)."""
        now = self.loop.now_ms
        if kind == DONE:
            assert isinstance(payload, _Running)
            self._done(payload, now)
            self._dirty = True
        elif kind == ARRIVAL:
            assert isinstance(payload, str)
            self._arrive(payload, now)
            self._dirty = True
        elif kind == EXPIRE:
            assert isinstance(payload, tuple)
            self.cluster.expire(str(payload[0]), int(payload[1]), now)
        elif kind == WARM:
            assert isinstance(payload, SimWorker)
            token = self.cluster.warmed(payload)
            self._starting -= 1
            self.loop.at(now + self.cluster.keep_alive_of(payload), EXPIRE, (payload.worker_id, token))
            self._dirty = True
        elif payload == self._wake_at:  # TICK: the pending wake-up (older ones are stale)
            self._wake_at = None

    def settle(self, now_ms: float) -> None:
        """After the events of an instant: a scheduling round if one is due; the end of the run."""
        if self.arrivals_left == 0 and self._open == 0 and self._in_flight == 0 and self._starting == 0:
            self.cluster.retire_idle(now_ms)
            self.loop.stop()
            return
        if not self._waiting or now_ms > self.cutoff_ms:
            self._dirty = False
            return
        if self._dirty:  # something changed: decide now, or as soon as the controller may
            due = max(now_ms, self._last_round_ms + self.round_interval_ms)
        else:  # the timer
            due = self._last_round_ms + self.settings.tick_ms
        if due > now_ms:
            self._wake(due)
            return
        self._dirty = False
        self._round(now_ms)
        if self._waiting:
            self._wake(now_ms + self.settings.tick_ms)

    def _wake(self, t_ms: float) -> None:
        """Make sure a wake-up event exists at or before ``t_ms``."""
        if t_ms <= self.cutoff_ms and (self._wake_at is None or t_ms < self._wake_at):
            self._wake_at = t_ms
            self.loop.at(t_ms, TICK, t_ms)

    # ---- requests and jobs ----------------------------------------------------------------

    def _arrive(self, workflow: str, now: float) -> None:
        plan = self.plans[workflow]
        self._n_requests += 1
        i = self._n_requests - 1
        size = self.request_sizes[i] if i < len(self.request_sizes) else 1.0
        req = _Request(f"r{self._n_requests}", plan, now, size)
        self.requests[req.request_id] = req
        self.arrivals_left -= 1
        self._open += 1
        for s in plan.entries:
            self._enqueue(req, s, now)

    def _enqueue(self, req: _Request, stage: str, now: float) -> None:
        plan = req.plan
        seg = plan.segment[stage]
        if self.settings.redistribute_slack:
            start = req.seg_start.setdefault(seg, now) if plan.region[stage] else now
            deadline = plan.dist.deadline_after(stage, req.arrival_ms, start)
        else:
            deadline = plan.dist.deadline_ms(stage, req.arrival_ms)
        nodes = req.pred_nodes.get(stage)
        home = max(sorted(set(nodes)), key=nodes.count) if nodes else None
        key = plan.keys[stage]
        job_id = f"{req.request_id}:{stage}"
        job = _job(
            job_id,
            req.request_id,
            req.request_id,
            key,
            req.arrival_ms,
            now,
            deadline,
            req.arrival_ms + plan.workflow.slo_ms,
            home,
            req.size * self._typical.get(stage, 1.0),
        )
        q = self.queues.get(key)
        if q is None:
            q = self.queues[key] = _Queue(key, self.settings.rate_ewma_alpha)
        q.jobs[job_id] = job
        q.state = None
        q.rate.observe(now)
        req.queued.add(job_id)
        self._job_index[job_id] = req
        self._waiting += 1

    def _fail(self, req: _Request, now: float) -> None:
        if req.failed:
            return
        req.failed = True
        self._open -= 1
        for job_id in list(req.queued):
            q = self.queues[QueueKey(req.plan.workflow.name, job_id.split(":", 1)[1])]
            if q.jobs.pop(job_id, None) is not None:
                q.state = None
                self._waiting -= 1
            self._job_index.pop(job_id, None)
        req.queued.clear()

    # ---- the round -----------------------------------------------------------------------

    def _round(self, now: float) -> None:
        states = []
        for q in self.queues.values():
            if not q.jobs:
                continue
            rate = q.rate.rate_per_s(now)
            if q.state is None:
                q.state = _queue_state(q.key, tuple(q.jobs.values()), rate)
            elif q.state.arrival_rate_per_s != rate:  # same jobs: the same tuple (schedulers key caches on it)
                q.state = _queue_state(q.key, q.state.jobs, rate)
            states.append(q.state)
        snapshot = _snapshot(tuple(states), self.cluster.snapshot(), self.workflows)
        self.rounds += 1
        self._last_round_ms = now
        t0 = self.clock() if self.clock is not None else 0.0
        result = self.scheduler.decide(snapshot, now)
        if self.clock is not None:
            self.decide_ms.append(self.clock() - t0)
        self.decisions.extend(result.stats)
        for r in result.rejects:
            for job_id in r.job_ids:
                req = self.requests.get(job_id.split(":", 1)[0])
                if req is None:
                    raise InvalidInputError(f"scheduler {self.scheduler.name!r} rejected unknown job {job_id!r}")
                self._fail(req, now)
        for d in result.dispatches:
            self._dispatch(d, now)
        for st in result.starts:  # placed after the round's dispatches, as the scheduler placed them
            self._prewarm(st, now)

    def _prewarm(self, st: Start, now: float) -> None:
        if st.queue not in self.queues:
            raise InvalidInputError(f"scheduler {self.scheduler.name!r} started a worker for unknown queue {st.queue}")
        w = self.cluster.prewarm(st.placement, st.queue.stage, st.config, st.hardware, now)
        self._starting += 1
        self.prewarms += 1
        self.loop.at(now + self.cluster.profile.cold_start_ms(st.queue.stage, st.hardware), WARM, w)

    def _dispatch(self, d: Dispatch, now: float) -> None:
        q = self.queues.get(d.queue)
        if q is None:
            raise InvalidInputError(f"scheduler {self.scheduler.name!r} dispatched from unknown queue {d.queue}")
        if len(d.job_ids) != d.config.batch:
            raise InvalidInputError(f"dispatch of {len(d.job_ids)} jobs with config.batch={d.config.batch}")
        jobs = []
        for job_id in d.job_ids:
            job = q.jobs.pop(job_id, None)
            if job is None:
                raise InvalidInputError(
                    f"scheduler {self.scheduler.name!r} dispatched job {job_id!r}, not waiting in {d.queue}"
                )
            jobs.append(job)
            self._job_index[job_id].queued.discard(job_id)
        q.state = None
        self._waiting -= len(jobs)
        w = self.cluster.acquire(d.placement, d.queue.stage, d.config, d.hardware, now)
        if d.placement.cold and d.at_risk:
            self.at_risk_cold_starts += 1
        remote = 0
        for job in jobs:
            req = self._job_index[job.job_id]
            if d.at_risk:
                req.at_risk = True
            remote += sum(1 for n in req.pred_nodes.get(d.queue.stage, ()) if n != w.node)
        sizes = [j.input_size for j in jobs] if self._sized else None
        timing = self.cluster.timing(w, d.queue.stage, d.config, d.placement.cold, remote, sizes)
        self.cluster.begin(w)
        self._n_batches += 1
        run = _running(f"b{self._n_batches}", w, tuple(jobs), d, now, timing)
        self._in_flight += 1
        self.loop.at(now + timing.total_ms, DONE, run)

    # ---- completions -----------------------------------------------------------------------

    def _done(self, run: _Running, now: float) -> None:
        d, w = run.dispatch, run.worker
        record = _batch_record(
            run.batch_id,
            w.worker_id,
            tuple([_batch_item(j.request_id, j.run_id, j.input_size) for j in run.jobs]),
            d.config,
            d.hardware,
            run.start_ms,
            now,
        )
        token = self.cluster.finish(w, record, now)
        self._in_flight -= 1
        self.loop.at(now + self.cluster.keep_alive_of(w), EXPIRE, (w.worker_id, token))
        stage = d.queue.stage
        size = len(run.jobs)
        for job in run.jobs:
            req = self._job_index.pop(job.job_id)
            self.stage_records.append(
                _stage_record(
                    job.job_id,
                    job.request_id,
                    d.queue.workflow,
                    stage,
                    run.batch_id,
                    size,
                    w.worker_id,
                    d.hardware,
                    d.config.gpu_share,
                    d.config.vcpus,
                    job.ready_ms,
                    run.start_ms,
                    now,
                    d.predicted_ms,
                    run.timing.cold_start_ms,
                    run.timing.transfer_ms,
                )
            )
            if req.failed:
                continue
            self._advance(req, stage, w.node, now)

    def _advance(self, req: _Request, stage: str, node: str, now: float) -> None:
        plan = req.plan
        if stage in plan.exits:
            req.exits_left -= 1
            if req.exits_left == 0:
                self._finish(req, now)
                return
        for nxt in plan.successors[stage]:
            req.pred_nodes.setdefault(nxt, []).append(node)
            req.pending[nxt] -= 1
            if req.pending[nxt] == 0:
                self._enqueue(req, nxt, now)

    def _finish(self, req: _Request, now: float) -> None:
        wf = req.plan.workflow
        self.request_records.append(
            _request_record(req.request_id, req.request_id, wf.name, req.arrival_ms, now, wf.slo_ms, req.at_risk)
        )
        del self.requests[req.request_id]
        self._open -= 1

    def close(self) -> None:
        """At the end of the run: every request not finished is a failure."""
        for req in self.requests.values():
            wf = req.plan.workflow
            self.request_records.append(
                RequestRecord(req.request_id, req.request_id, wf.name, req.arrival_ms, None, wf.slo_ms, req.at_risk)
            )
        self.requests.clear()
        self.request_records.sort(key=lambda r: int(r.request_id[1:]))


ProgressFn = Callable[[float], None]
