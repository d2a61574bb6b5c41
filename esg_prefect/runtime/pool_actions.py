"""The pool's actions half: what the control core decides, carried out on real workers.

:class:`~esg_prefect.runtime.pool.Pool` feeds the core its events (calls,
timers, finished batches) on its loop; the core answers with actions, and this
half carries them out there: start a batch on a worker (through
:func:`~esg_prefect.runtime.execution.execute`, which isolates failures),
load a pre-warmed worker, stop one, fail calls the core refused, arm timers.
Each finished batch goes back to the core, its calls' futures are resolved
exactly once, and its time feeds the online latency correction.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from esg_prefect.control.calls import StageResult
from esg_prefect.control.events import (
    Action,
    BatchFinished,
    FailJobs,
    StartBatch,
    StartWorker,
    StopWorker,
    WakeAt,
)
from esg_prefect.control.records import BatchDone
from esg_prefect.control.worker import FleetWorker
from esg_prefect.exceptions import StageRejectedError
from esg_prefect.runtime.bindings import StageBindings
from esg_prefect.runtime.execution import Pending, execute
from esg_prefect.runtime.workers import WorkerDiedError, WorkerLoadError, WorkerSpec

HUNG_FACTOR = 20.0  # a batch may run this many times its predicted time (at least hung_batch_s) before it is stopped

if TYPE_CHECKING:
    from esg_prefect.control.core import Core
    from esg_prefect.model.jobs import QueueKey
    from esg_prefect.model.pricing import PriceSheet
    from esg_prefect.runtime.call_ids import CallIds
    from esg_prefect.runtime.clock import Cancellable, PoolClock
    from esg_prefect.runtime.listeners import Listeners
    from esg_prefect.runtime.planner import Planner
    from esg_prefect.runtime.pool_records import CallBook
    from esg_prefect.runtime.workers import WorkerBackend, WorkerHandle
    from esg_prefect.runtime.workflows import WorkflowRegistry

__all__ = ["PoolActions"]

logger = logging.getLogger("esg_prefect.runtime.pool")


class PoolActions:
    """Carries out the core's actions; mixed into :class:`~esg_prefect.runtime.pool.Pool`, whose state it uses.

    Every method runs on the pool's loop.
    """

    backend: WorkerBackend
    clock: PoolClock
    hung_batch_s: float | None
    planner: Planner
    prices: PriceSheet
    _closed: bool
    _pending: dict[str, Pending]
    _handles: dict[str, WorkerHandle]
    _stage_paths: dict[QueueKey, str]
    _bindings: StageBindings
    _timers: dict[float, Cancellable]
    _ids: CallIds
    _book: CallBook
    _listen: Listeners
    _registry: WorkflowRegistry

    if TYPE_CHECKING:

        @property
        def core(self) -> Core: ...

        def _spawn(self, coro: Any) -> None: ...

        def _settle_soon(self) -> None: ...

        def _on_timer(self, t: float) -> None: ...

        def _replanned(self) -> None: ...

    def _apply(self, actions: list[Action], now: float) -> None:
        for a in actions:
            if isinstance(a, StartBatch):
                self._spawn(self._run_batch(a, [self._pending[j.job_id] for j in a.jobs]))
            elif isinstance(a, WakeAt):
                if a.t not in self._timers:
                    self._timers[a.t] = self.clock.call_at(a.t, self._on_timer, a.t)
            elif isinstance(a, StopWorker):
                handle = self._handles.pop(a.worker_id, None)
                if handle is not None:
                    logger.info("worker %s stopped (idle past its keep-alive, or its room was needed)", a.worker_id)
                    self._spawn(handle.stop())
            elif isinstance(a, FailJobs):
                for job in a.jobs:
                    self._fail(job.job_id, StageRejectedError(a.reason), now)
            elif isinstance(a, StartWorker):
                self._spawn(self._load(a))

    def _fail(self, call_id: str, exc: Exception, now: float) -> None:
        p = self._pending.pop(call_id, None)
        if p is not None:
            self._finish(p, None, exc, now, now)

    def _spec(self, w: FleetWorker, path: str) -> WorkerSpec:
        return WorkerSpec(w.worker_id, path, w.node, w.device_id, w.hardware, w.vcpus, w.share)

    async def _load(self, a: StartWorker) -> None:
        """A pre-warm start: load the worker off the requests' path; a start that fails is dropped."""
        # the queue's own path, or the stage's from another workflow (a start ahead of the queue's first call)
        wid, path = a.worker.worker_id, self._stage_paths.get(a.queue) or self._bindings.path_of(a.queue.stage)
        try:
            if path is None:
                raise WorkerLoadError(f"no stage path known for {a.queue}")
            handle = await self.backend.start(self._spec(a.worker, path))
        except (WorkerLoadError, WorkerDiedError) as exc:
            logger.warning("pre-warm start of worker %s failed (%s); dropped", wid, exc)
            self.core.worker_lost(wid)
            self._settle_soon()
            return
        if self._closed or wid not in self.core.fleet.workers:
            await handle.stop()
            return
        self._handles[wid] = handle
        logger.info("worker %s started ahead of calls for %s: %s", wid, a.queue.stage, a.reason)
        for level, name, text in handle.load_lines:  # no call waited for this load: the pool's log
            logger.log(level, "worker %s, loading its model: %s%s", wid, f"{name}: " if name else "", text)
        self.core.worker_ready(wid, self.clock.now())
        self._settle_soon()

    async def _run_batch(self, a: StartBatch, pendings: list[Pending]) -> None:
        w, d, start = a.worker, a.dispatch, a.t
        stage = d.queue.stage

        def measured(idx: list[int], ms: float, own_ms: float | None) -> None:
            self._correct(stage, w, [pendings[i].job.input_size for i in idx], ms, own_ms)

        handle = self._handles.get(w.worker_id)
        limit = None if self.hung_batch_s is None else max(self.hung_batch_s, HUNG_FACTOR * d.predicted_ms / 1000.0)
        out = await execute(
            self.backend, handle, self._spec(w, pendings[0].call.stage_path), pendings, self.clock.now, measured, limit
        )
        end = self.clock.now()
        failed = frozenset(pendings[i].call.call_id for i, (_, err) in out.results.items() if err is not None)
        requeue = tuple(pendings[i].call.call_id for i in out.requeue)
        lost = out.died is not None
        core = self.core
        core.finished(BatchFinished(a.batch_id, end, failed, requeue, lost, out.cold_ms))
        if lost:
            self._handles.pop(w.worker_id, None)
            logger.warning("worker %s lost (%s); %d call(s) requeued", w.worker_id, out.died, len(requeue))
        elif out.handle is not None:
            self._handles[w.worker_id] = out.handle
        runs = {p.call.run_id for p in pendings}
        if logger.isEnabledFor(logging.INFO):
            logger.info(
                "batch %s: %s, %d call(s) from %d run(s) on worker %s [%s, share %.2f, %d vCPU]%s in %.1f ms "
                "(predicted %.1f)%s",
                a.batch_id, stage, len(pendings), len(runs), w.worker_id, w.hardware, w.share, w.vcpus,
                f", cold start {out.cold_ms:.0f} ms" if a.cold else "", end - start, d.predicted_ms,
                f"; {len(failed)} failed" if failed else "",
            )  # fmt: skip
        self._book.batch(len(core.fleet.batches) - 1, runs)  # the record finished() just made
        self._listen.expect(a.batch_id)  # before any caller hears of the batch: it may wait for its records
        first_call = len(self._book.calls)
        runs_in: dict[tuple[int, ...], int] = {}  # per run of the batch (its calls' indices): the flow runs in it
        for i, p in enumerate(pendings):
            if i not in out.results:
                continue  # back in its queue (solo)
            value, err = out.results[i]
            res = None
            if err is None:
                # The run it was part of: the whole batch, or a part of it run again (a failed input, a crash)
                group = out.ran_with[i]
                if group not in runs_in:
                    runs_in[group] = len({pendings[j].call.run_id for j in group})
                res = StageResult(
                    p.call.call_id,
                    value,
                    a.batch_id,
                    len(group),
                    w.worker_id,
                    w.hardware,
                    w.vcpus,
                    w.share,
                    start - p.job.ready_ms,
                    d.predicted_ms,
                    end - start,
                    a.cold,
                    d.at_risk,
                    d.reason,
                    runs_in[group],
                    lines=out.lines.get(i, ()),
                )
            self._pending.pop(p.call.call_id, None)
            self._finish(p, res, err, start, end)
        if self._listen.batches:
            calls = tuple(self._book.calls[first_call:])
            done = BatchDone(core.fleet.batches[-1], calls, d.queue.workflow, stage, self.prices)
            self._listen.batch_done(self._book.batch_done(done, core, self._registry.slo_ms))
        self._settle_soon()

    def _finish(self, p: Pending, res: StageResult | None, err: BaseException | None, start: float, end: float) -> None:
        self._ids.finish(p.call.call_id, p.future)
        self._book.call(p.call, p.job.ready_ms, res, err, start, end)
        if not p.future.done():  # exactly once
            if err is None:
                assert res is not None
                p.future.set_result(res)
            else:
                p.future.set_exception(err)

    def _correct(self, stage: str, w: FleetWorker, sizes: list[float], actual_ms: float, own_ms: float | None) -> None:
        """Fold a batch's round trip (and its worker's own time) into the online correction; re-plan on drift."""
        if self.planner.correct(stage, w.hardware, w.vcpus, w.share, sizes, actual_ms, self.clock.now(), own_ms):
            self._replanned()
