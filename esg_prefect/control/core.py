"""The control core: queues, admission, rounds, worker lifecycle and records, once for every driver.

The runtime's asyncio pool and the simulator's event loop both drive one
:class:`Core`. It has no clock, no threads and no I/O: events come in with
their time (:mod:`esg_prefect.control.events`), actions come out, and the
records (batches, idle time, stage calls, decisions) and their running totals
(:class:`~esg_prefect.control.totals.Totals`) are read from it.

What it owns:

* one AFW queue per (workflow, stage) with its :class:`ArrivalRateEWMA`;
* admission: a call becomes a :class:`Job` carrying the deadline of its SLO
  segment (with slack redistribution, ``ESGSettings.redistribute_slack``) less
  the measured hop reserve (the caller's own time between pooled stages);
* rounds: ``scheduler.decide(snapshot, now)`` after the events of an instant,
  at most one per ``round_interval_ms``, and on a ``tick_ms`` timer while any
  job waits; never when none does, none while paused;
* applying the decisions (:class:`~esg_prefect.control.apply.DecisionApplier`):
  rejects fail the request's queued jobs, dispatches start batches (after
  their evictions), starts pre-warm workers;
* workers through :class:`~esg_prefect.control.fleet.Fleet`: keep-alive,
  expiry at the exact time its keep-alive runs out, billing records;
* load shedding (``shed_after_slo``, off by default): before a round, the
  requests whose calls have waited that many times their SLO fail.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, MutableMapping

from esg_prefect.control.apply import DecisionApplier
from esg_prefect.control.events import (
    Action,
    BatchFinished,
    CallArrived,
    Event,
    RunEnded,
    StopWorker,
    Tick,
    WakeAt,
    WorkerLost,
    WorkerReady,
)
from esg_prefect.control.fleet import Fleet
from esg_prefect.control.state import Flight, Hops, Plan, Queue, Request, stages_after
from esg_prefect.control.totals import Totals
from esg_prefect.exceptions import InvalidInputError
from esg_prefect.model.attribution import BatchItem, BatchRecord
from esg_prefect.model.jobs import Job, QueueKey
from esg_prefect.model.records import StageRecord
from esg_prefect.model.unchecked import unchecked
from esg_prefect.model.workflow import Workflow
from esg_prefect.scheduling.base import DecisionStats, QueueState, Scheduler, Snapshot
from esg_prefect.scheduling.settings import PlatformSettings
from esg_prefect.scheduling.tables import CandidateTables

# The core builds its jobs, states and records from values it made or checked itself (finite times in
# order, its own queue keys, rates from ArrivalRateEWMA): it skips their checks (model.unchecked).
_job = unchecked(Job)
_stage_record = unchecked(StageRecord)
_batch_item = unchecked(BatchItem)
_batch_record = unchecked(BatchRecord)
_queue_state = unchecked(QueueState)
_snapshot = unchecked(Snapshot)
_wake = unchecked(WakeAt)


class Core(DecisionApplier):
    """Queues -> ``scheduler.decide`` -> actions, with the workers' lifecycle and the records.

    Args:
        scheduler: the scheduler (any registered one).
        tables: the tables that give jobs their deadlines (the scheduler's profile and prices).
        fleet: the workers and their capacity.
        settings: the platform's knobs (tick, EWMA alpha, slack redistribution, hop reserve).
        workflows: workflows by name (a driver may add to it as calls declare new ones).
        round_interval_ms: least time between two rounds (0: react at every instant).
        cutoff_ms: no round after this time (a simulated run's drain limit).
        timer: a wall clock in ms to time each ``decide`` call (None: not timed).
        keep_stage_records: keep a :class:`StageRecord` per finished job.
        decision_memory: keep only this many newest decision stats (None: all).
        ended_memory: keep only this many newest requests of ended runs (None: all); a
            long-lived pool would otherwise hold every request it ever served.
        totals: running totals to add each batch, idle interval and decision to (the pool's,
            for metrics); None, the simulator's, keeps none: nothing reads them there.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        tables: CandidateTables,
        fleet: Fleet,
        settings: PlatformSettings,
        workflows: MutableMapping[str, Workflow],
        *,
        round_interval_ms: float = 0.0,
        cutoff_ms: float = math.inf,
        timer: Callable[[], float] | None = None,
        keep_stage_records: bool = True,
        decision_memory: int | None = None,
        ended_memory: int | None = None,
        totals: Totals | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.tables = tables
        self.fleet = fleet
        fleet.configure(settings, tables.profile.cold_start_ms, tables.prices)  # the keep-alive policy, idle prices
        self.totals = fleet.totals = totals  # the fleet adds its idle time, the core its batches and decisions
        self.settings = settings
        self.workflows = workflows
        self.round_interval_ms = round_interval_ms
        self.cutoff_ms = cutoff_ms
        self.timer = timer
        self.keep_stage_records = keep_stage_records
        self.paused = False
        self.queues: dict[QueueKey, Queue] = {}
        self.requests: dict[str, Request] = {}
        self._run_requests: dict[str, list[Request]] = {}  # run id -> its requests, until the run ends
        self._ended: deque[str] = deque()  # request ids of ended runs, oldest first (with ended_memory)
        self.ended_memory = ended_memory
        self.flights: dict[str, Flight] = {}
        self.stage_records: list[StageRecord] = []
        self.decisions: deque[DecisionStats] = deque(maxlen=decision_memory)
        self.decide_ms: list[float] = []
        self.rounds = 0
        self.prewarms = 0  # workers started without jobs (Start decisions)
        self.at_risk_cold_starts = 0  # new workers started for best-effort (at-risk) dispatches
        self.waiting = 0
        self._plans: dict[str, Plan] = {}
        self._job_req: dict[str, Request] = {}
        self._hops = Hops(settings.rate_ewma_alpha)  # delivery times and nodes, each workflow's hop
        self._task_of: dict[str, str] = {}  # job id -> its task run id, while it is open
        self._dirty = False
        self._last_round_ms = -math.inf
        self._wake_at: float | None = None  # the pending round timer
        self._expiry_wake: float | None = None  # the pending wake-up for a keep-alive
        self._batches = 0

    # ---- events ---------------------------------------------------------------------------

    def on(self, event: Event) -> list[Action]:
        """Handle one event; a :class:`Tick` returns the actions due (the others return none)."""
        if isinstance(event, Tick):
            return self.settle(event.t)
        if isinstance(event, CallArrived):
            self.arrive(event)
        elif isinstance(event, BatchFinished):
            self.finished(event)
        elif isinstance(event, WorkerReady):
            self.worker_ready(event.worker_id, event.t)
        elif isinstance(event, WorkerLost):
            self.worker_lost(event.worker_id)
        elif isinstance(event, RunEnded):
            self.end_run(event.run_id)
        return []

    def arrive(self, ev: CallArrived) -> Job:
        """Admit a call: it waits in its queue with its segment's deadline; the next round sees it.

        Raises:
            KeyError: for a workflow the core was not given.
            WorkflowError: when a stage has no latency profile on the fleet's hardware.
        """
        t = ev.t
        req = self.requests.get(ev.request_id)
        if req is None:
            arrival = ev.arrival_ms if ev.arrival_ms is not None and ev.arrival_ms <= t else t
            req = Request(ev.request_id, ev.run_id, ev.workflow, arrival)
        plan = self._plan(ev.workflow)
        stage = ev.stage
        seg = plan.segment[stage]
        if self.settings.redistribute_slack:
            start = req.seg_start.get(seg, t) if plan.region[stage] else t
            deadline = plan.dist.deadline_after(stage, req.arrival_ms, start)
        else:
            start = t
            deadline = plan.dist.deadline_ms(stage, req.arrival_ms)
        e2e = req.arrival_ms + plan.workflow.slo_ms
        if ev.upstream:
            reserve = self._reserve(ev, plan.workflow, t)
            if reserve > 0:  # never before now, for the reserve's sake
                deadline = max(min(deadline, t), deadline - reserve)
                e2e = max(min(e2e, t), e2e - reserve)
        home = ev.home
        if home is None and ev.upstream:
            home = self._hops.home(ev.upstream)
        key = plan.keys[stage]
        job = _job(ev.job_id, req.request_id, req.run_id, key, req.arrival_ms, t, deadline, e2e, home, ev.input_size)
        # Every check passed: change state.
        if ev.request_id not in self.requests:
            self.requests[ev.request_id] = req
            self._run_requests.setdefault(req.run_id, []).append(req)
        if plan.region[stage]:
            req.seg_start.setdefault(seg, start)
        q = self.queues.get(key)
        if q is None:
            q = self.queues[key] = Queue(key, self.settings.rate_ewma_alpha)
        q.jobs[ev.job_id] = job
        q.state = None
        if self.fleet.adaptive is not None:
            self.fleet.adaptive.waves.observe(key.stage, t)
        try:  # noqa: SIM105 (suppress() costs a context manager per call)
            q.rate.observe(t)
        except InvalidInputError:  # a clock that stepped back: skip this gap
            pass
        req.queued[ev.job_id] = key
        req.open += 1
        self._job_req[ev.job_id] = req
        if ev.task_run_id:
            self._task_of[ev.job_id] = ev.task_run_id
        self.waiting += 1
        self._dirty = True
        return job

    def withdraw(self, job_id: str) -> Job | None:
        """Take a waiting job out of its queue, its caller gone (a task's timeout); None if it is not waiting.

        A job already dispatched runs on: its batch is the other calls' too.
        """
        req = self._job_req.get(job_id)
        key = req.queued.pop(job_id, None) if req is not None else None
        if req is None or key is None:
            return None
        q = self.queues[key]
        job = q.jobs.pop(job_id)
        q.state = None
        self.waiting -= 1
        self._dirty = True
        del self._job_req[job_id]
        self._task_of.pop(job_id, None)
        req.open -= 1
        return job

    def finished(self, ev: BatchFinished) -> Flight:
        """A batch ended: bill it, free or drop its worker, close or re-queue its jobs; returns the flight."""
        fl = self.flights.pop(ev.batch_id)
        d, w, t = fl.dispatch, fl.worker, ev.t
        requeue = set(ev.requeue)
        done = [j for j in fl.jobs if j.job_id not in requeue] if requeue else fl.jobs
        record = _batch_record(
            fl.batch_id,
            w.worker_id,
            tuple([_batch_item(j.request_id, j.run_id, j.input_size) for j in fl.jobs]),
            d.config,
            d.hardware,
            fl.start_ms,
            t,
        )
        if ev.lost:
            self.fleet.lose(w, record)
        else:
            self._expiring(self.fleet.finish(w, record, t))
        stage = d.queue.stage
        if self.totals is not None:
            self.totals.batch(stage, record, ev.cold_ms)
        size = len(fl.jobs)
        keep = self.keep_stage_records
        for job in done:
            req = self._job_req.pop(job.job_id)
            req.open -= 1
            if t > req.last_end_ms:
                req.last_end_ms = t
            if ev.failed and job.job_id in ev.failed:
                req.failed = True
            task = self._task_of.pop(job.job_id, None) if self._task_of else None
            if task is not None:
                self._hops.delivered(task, t, w.node)
            if keep:
                self.stage_records.append(
                    _stage_record(
                        job.job_id,
                        job.request_id,
                        job.queue.workflow,
                        stage,
                        fl.batch_id,
                        size,
                        w.worker_id,
                        d.hardware,
                        d.config.gpu_share,
                        d.config.vcpus,
                        job.ready_ms,
                        fl.start_ms,
                        t,
                        d.predicted_ms,
                        ev.cold_ms,
                        ev.transfer_ms,
                    )
                )
        if requeue:  # each call back to the front of its own queue (a shared batch mixes queues)
            back: dict[QueueKey, dict[str, Job]] = {}
            for j in fl.jobs:
                if j.job_id in requeue:
                    back.setdefault(j.queue, {})[j.job_id] = j
            for key, jobs in back.items():
                q = self.queues[key]
                q.jobs = {**jobs, **q.jobs}
                q.state = None
                for jid in jobs:
                    self._job_req[jid].queued[jid] = key
                self.waiting += len(jobs)
        self._dirty = True
        return fl

    def worker_ready(self, worker_id: str, t: float) -> None:
        """A pre-warm start finished loading: the worker is idle and warm (its load billed as idle time)."""
        w = self.fleet.workers.get(worker_id)
        if w is not None and w.starting is not None:
            self._expiring(self.fleet.warmed(w, t))
            self._dirty = True

    def worker_lost(self, worker_id: str) -> None:
        """A worker with no batch running died (or failed to load): its capacity is free."""
        w = self.fleet.workers.get(worker_id)
        if w is not None:
            self.fleet.lose(w)
            self._dirty = True

    def end_run(self, run_id: str) -> list[Request]:
        """A flow run ended: its requests are closed; returns them.

        With ``ended_memory``, the oldest ended runs' requests beyond it are
        forgotten (their calls still in flight keep theirs until they finish).
        """
        reqs = self._run_requests.pop(run_id, [])
        for r in reqs:
            r.closed = True
        if self.ended_memory is not None:
            self._ended.extend(r.request_id for r in reqs)
            while len(self._ended) > self.ended_memory:
                self.requests.pop(self._ended.popleft(), None)
        return reqs

    def forget(self, request_id: str) -> Request | None:
        """Drop a finished request from the records (a driver that keeps its own: the simulator's callers)."""
        req = self.requests.pop(request_id, None)
        if req is not None:
            run = self._run_requests.get(req.run_id)
            if run is not None:
                run.remove(req)
                if not run:
                    del self._run_requests[req.run_id]
        return req

    def _expiring(self, at: float) -> None:
        if self._expiry_wake is None or at < self._expiry_wake:
            self._expiry_wake = None  # settle() asks for the earlier wake-up

    # ---- admission helpers ----------------------------------------------------------------------

    def _plan(self, workflow: str) -> Plan:
        wf = self.workflows[workflow]
        plan = self._plans.get(workflow)
        if plan is None or plan.workflow is not wf:
            plan = self._plans[workflow] = Plan(wf, self.tables.slo(wf, self.fleet.hardware_types()))
        return plan

    def _reserve(self, ev: CallArrived, workflow: Workflow, t: float) -> float:
        if self.settings.reserve_overhead:
            self._hops.observe(workflow.name, ev.upstream, t)
        return self.reserve_ms(workflow, ev.stage)

    def reserve_ms(self, workflow: Workflow, stage: str) -> float:
        """Time kept free after ``stage`` for the caller's work between and after the pooled stages.

        One measured hop per stage on the longest path after ``stage`` to the end
        of the workflow, plus one for the end of the flow run (which the pool does
        not see). Zero until a hop is measured.
        """
        hop = self._hops.hop_ms(workflow.name)
        return 0.0 if hop is None else hop * (1 + stages_after(workflow, stage))

    def hop_ms(self, workflow: str) -> float | None:
        """The measured hop of ``workflow`` (None before the first)."""
        return self._hops.hop_ms(workflow)

    def replan(self, scheduler: Scheduler, tables: CandidateTables) -> None:
        """Plan with another scheduler and tables from the next round on (a corrected profile); no state is lost."""
        self.scheduler, self.tables = scheduler, tables
        self._plans.clear()

    # ---- rounds ----------------------------------------------------------------------------------

    def settle(self, now: float) -> list[Action]:
        """After the events of an instant: expiries, a round if one is due, and the next wake-up."""
        actions: list[Action] = []
        fleet = self.fleet
        if fleet._expiries and fleet._expiries[0][0] <= now:
            actions.extend([StopWorker(w.worker_id, now) for w in fleet.expire(now)])
            self._expiry_wake = None
        if self.waiting and not self.paused and now <= self.cutoff_ms:
            if self._dirty:  # something changed: decide now, or as soon as the core may
                due = max(now, self._last_round_ms + self.round_interval_ms)
            else:  # the timer
                due = self._last_round_ms + self.settings.tick_ms
            if due <= now:
                self._dirty = False
                self._round(now, actions)
                if self.waiting:
                    self._wake(now + self.settings.tick_ms, actions)
            else:
                self._wake(due, actions)
        else:
            self._dirty = False
        if self._expiry_wake is None or self._expiry_wake <= now:
            nxt = fleet.next_expiry_ms()
            self._expiry_wake = nxt
            if nxt is not None:
                actions.append(_wake(nxt))
        return actions

    def tick_due(self, t: float) -> bool:
        """Whether ``t`` is the pending round timer (a driver may drop older wake-ups)."""
        if t == self._wake_at:
            self._wake_at = None
            return True
        return False

    def _wake(self, t: float, actions: list[Action]) -> None:
        if t <= self.cutoff_ms and (self._wake_at is None or t < self._wake_at):
            self._wake_at = t
            actions.append(_wake(t))

    def _shed(self, now: float, actions: list[Action]) -> None:
        """Fail the requests whose calls still wait ``shed_after_slo`` times their SLO after they arrived.

        Every waiting call is checked (a queue's order is the order its calls
        became ready, not their requests' arrival), so no call is dispatched
        later than that; past capacity the queues, and a round's work, stay bounded.
        """
        k = self.settings.shed_after_slo
        late: dict[str, tuple[Request, float]] = {}
        for q in self.queues.values():
            slo = self.workflows[q.key.workflow].slo_ms
            limit = now - k * slo
            for job in [j for j in q.jobs.values() if j.arrival_ms < limit]:
                req = self._job_req.get(job.job_id)
                if req is not None:
                    late[req.request_id] = (req, slo)
        for req, slo in late.values():  # a request a stage error failed still has these calls waiting: shed too
            waited = now - req.arrival_ms
            self._fail_request(
                req,
                f"shed: request {req.request_id} still queued {waited:.0f} ms after it arrived, past "
                f"shed_after_slo={k:g} x its {slo:g} ms SLO",
                actions,
            )

    def _round(self, now: float, actions: list[Action]) -> None:
        if self.settings.shed_after_slo > 0:
            self._shed(now, actions)
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
        snapshot = _snapshot(tuple(states), self.fleet.snapshot(), self.workflows)
        self.rounds += 1
        self._last_round_ms = now
        if self.timer is not None:
            t0 = self.timer()
            result = self.scheduler.decide(snapshot, now)
            self.decide_ms.append(self.timer() - t0)
        else:
            result = self.scheduler.decide(snapshot, now)
        self.decisions.extend(result.stats)
        if self.totals is not None:
            self.totals.decided(result.stats)
        self._apply_decisions(result, now, actions)

    # ---- reading -------------------------------------------------------------------------------

    def drain(self) -> list[Job]:
        """Take every waiting job out of its queue (a pool closing); returns them."""
        jobs = [j for q in self.queues.values() for j in q.jobs.values()]
        for q in self.queues.values():
            q.jobs.clear()
            q.state = None
        self.waiting = 0
        return jobs
