"""Applying a round's decisions: rejects fail requests, dispatches start batches, starts pre-warm workers,
retirements stop idle workers.

Half of the control core (:class:`~esg_prefect.control.core.Core`), apart
because it is the one place where a scheduler's answer changes the queues and
the fleet: each decision is checked against the core's state (an unknown queue
or job, a batch of the wrong size, an eviction of a busy worker raise) before
it turns into actions, and a placement's evictions are carried out first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, MutableMapping
from typing import TYPE_CHECKING

from esg_prefect.control.events import Action, FailJobs, StartBatch, StartWorker, StopWorker
from esg_prefect.control.fleet import Fleet
from esg_prefect.control.state import Flight, Queue, Request
from esg_prefect.exceptions import InvalidInputError
from esg_prefect.model.jobs import QueueKey
from esg_prefect.model.unchecked import unchecked
from esg_prefect.model.workflow import Workflow
from esg_prefect.scheduling.base import Dispatch, Placement, Scheduler, SchedulingResult
from esg_prefect.scheduling.settings import PlatformSettings
from esg_prefect.scheduling.tables import CandidateTables

__all__ = ["DecisionApplier"]

# Built from the core's own checked values, like the core's other actions (model.unchecked).
_start_batch = unchecked(StartBatch)


class DecisionApplier:
    """Applies a scheduler's decisions; mixed into :class:`~esg_prefect.control.core.Core`, whose state it uses."""

    scheduler: Scheduler
    tables: CandidateTables
    fleet: Fleet
    queues: dict[QueueKey, Queue]
    workflows: MutableMapping[str, Workflow]
    settings: PlatformSettings
    flights: dict[str, Flight]
    prewarms: int
    at_risk_cold_starts: int
    waiting: int
    _job_req: dict[str, Request]
    _batches: int

    if TYPE_CHECKING:

        def _expiring(self, at: float) -> None: ...

    def _apply_decisions(self, result: SchedulingResult, now: float, actions: list[Action]) -> None:
        """Rejects, dispatches, pre-warm starts, then retirements, in the scheduler's order, into ``actions``."""
        gone: set[str] = set()  # jobs failed this round with their request (a reject may name several)
        for r in result.rejects:
            for job_id in r.job_ids:
                req = self._job_req.get(job_id)
                if req is not None:
                    gone.update(self._fail_request(req, r.reason, actions))
                elif job_id not in gone:
                    raise InvalidInputError(f"scheduler {self.scheduler.name!r} rejected unknown job {job_id!r}")
        for d in result.dispatches:
            self._dispatch(d, now, actions)
        for st in result.starts:  # placed after the round's dispatches, as the scheduler placed them
            if st.queue not in self.queues:
                wf = self.workflows.get(st.queue.workflow)
                if wf is None or st.queue.stage not in wf.stages:
                    raise InvalidInputError(
                        f"scheduler {self.scheduler.name!r} started a worker for unknown queue {st.queue}"
                    )
                # a workflow's stage that has had no call yet (a start ahead of the first wave)
                self.queues[st.queue] = Queue(st.queue, self.settings.rate_ewma_alpha)
            w = self.fleet.prewarm(
                self._evictions(st.placement, now, actions), st.queue.stage, st.config, st.hardware, now
            )
            w.free_at_ms = now + self.tables.profile.cold_start_ms(st.queue.stage, st.hardware)
            self.prewarms += 1
            actions.append(StartWorker(w, st.queue, now, st.reason))
        # After the round's dispatches: a worker the round gave a batch is busy.
        self._stop_idle(result.retire, now, actions, f"scheduler {self.scheduler.name!r} retires worker")

    def _evictions(self, placement: Placement, now: float, actions: list[Action]) -> Placement:
        """Stop the idle workers a placement makes room by stopping; the placement left to apply."""
        if not placement.evict:
            return placement
        self._stop_idle(placement.evict, now, actions, "placement evicts")
        return dataclasses.replace(placement, evict=())

    def _stop_idle(self, worker_ids: Iterable[str], now: float, actions: list[Action], who: str) -> None:
        """Stop these idle workers; one that is busy or unknown is refused as ``<who> '<id>', which is busy``."""
        for wid in worker_ids:
            victim = self.fleet.workers.get(wid)
            if victim is None or victim.busy:
                raise InvalidInputError(f"{who} {wid!r}, which is {'busy' if victim else 'unknown'}")
            self.fleet.retire(victim, now)
            actions.append(StopWorker(wid, now))

    def _fail_request(self, req: Request, reason: str, actions: list[Action]) -> list[str]:
        """Fail a request: its queued jobs leave their queues and are answered with ``reason``; their ids."""
        req.failed = True
        gone = []
        for job_id, key in req.queued.items():
            q = self.queues[key]
            job = q.jobs.pop(job_id, None)
            if job is not None:
                q.state = None
                self.waiting -= 1
                gone.append(job)
            self._job_req.pop(job_id, None)
            req.open -= 1
        ids = list(req.queued)
        req.queued.clear()
        if gone:
            actions.append(FailJobs(tuple(gone), reason))
        return ids

    def _dispatch(self, d: Dispatch, now: float, actions: list[Action]) -> None:
        q = self.queues.get(d.queue)
        if q is None:
            raise InvalidInputError(f"scheduler {self.scheduler.name!r} dispatched from unknown queue {d.queue}")
        if len(d.job_ids) != d.config.batch:
            raise InvalidInputError(f"dispatch of {len(d.job_ids)} jobs with config.batch={d.config.batch}")
        jobs = []
        queues = self.queues
        for job_id in d.job_ids:
            job = q.jobs.get(job_id)
            if job is None:  # a shared batch: a call of the same stage waiting in another workflow's queue
                req = self._job_req.get(job_id)
                key = req.queued.get(job_id) if req is not None else None
                if key is not None and key.stage == d.queue.stage:
                    job = queues[key].jobs.get(job_id)
            if job is None:
                raise InvalidInputError(
                    f"scheduler {self.scheduler.name!r} dispatched job {job_id!r}, not waiting in {d.queue}"
                    " or another queue of its stage"
                )
            jobs.append(job)
        w = self.fleet.acquire(self._evictions(d.placement, now, actions), d.queue.stage, d.config, d.hardware, now)
        if self.fleet.rearmed_ms is not None:  # idle workers of the stage got an earlier expiry
            self._expiring(self.fleet.rearmed_ms)
            self.fleet.rearmed_ms = None
        w.free_at_ms, w.view = now + d.predicted_ms, None
        for job in jobs:  # the placement fitted: the jobs leave their queues
            jq = q if job.queue == d.queue else queues[job.queue]
            del jq.jobs[job.job_id]
            jq.state = None
            req = self._job_req[job.job_id]
            del req.queued[job.job_id]
            if d.at_risk:
                req.at_risk = True
        self.waiting -= len(jobs)
        cold = d.placement.cold
        if cold and d.at_risk:
            self.at_risk_cold_starts += 1
            if self.fleet.best_effort_keep_alive > 0:
                self.fleet.best_effort.add(w.worker_id)
        elif not d.at_risk:
            self.fleet.best_effort.discard(w.worker_id)
        self._batches += 1
        batch_id = f"b{self._batches}"
        fl = Flight(batch_id, w, tuple(jobs), d, now)
        self.flights[batch_id] = fl
        actions.append(_start_batch(batch_id, w, fl.jobs, d, cold, now))
