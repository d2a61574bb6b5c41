"""The pool: stage calls of many flow runs, batched by the control core onto real workers.

One pool serves every flow run of a process (the embedded default) or, behind
the pool service, of many processes. It is the runtime's driver of the control
core (:class:`~esg_prefect.control.core.Core`, the code the simulator runs):
queues, admission, rounds, keep-alive and records are the core's. The pool
adds what only a live platform has: a thread-safe front (:meth:`Pool.submit`
from any thread, a :class:`concurrent.futures.Future` back), one asyncio event
loop in a thread of its own that feeds the core its events with the wall-clock
time and carries out its actions, batch execution with failure isolation
(:mod:`~esg_prefect.runtime.execution`), the online latency correction and the
listeners.

Nothing is lost or delivered twice: every call's future is resolved exactly
once (an error inside its admission included); a duplicate ``call_id`` (a
client retrying) joins the first call or gets its stored result.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import sys
import threading
from typing import Any

from esg_prefect.control.calls import StageCall, StageResult
from esg_prefect.control.core import Core
from esg_prefect.control.events import (
    CallArrived,
)
from esg_prefect.control.fleet import Fleet
from esg_prefect.control.records import (
    BatchListener,
    PoolSnapshot,
    RunListener,
    RunLookup,
)
from esg_prefect.control.totals import Totals
from esg_prefect.exceptions import (
    InvalidInputError,
    PoolClosedError,
    StageCallError,
    StageRejectedError,
)
from esg_prefect.model.jobs import QueueKey
from esg_prefect.model.pricing import PriceSheet
from esg_prefect.model.profile import LatencyProfile
from esg_prefect.runtime.bindings import StageBindings
from esg_prefect.runtime.call_ids import CallIds
from esg_prefect.runtime.clock import Cancellable, PoolClock, perf_ms, wall_ms
from esg_prefect.runtime.execution import Pending
from esg_prefect.runtime.listeners import Listeners
from esg_prefect.runtime.planner import Planner
from esg_prefect.runtime.pool_actions import PoolActions
from esg_prefect.runtime.pool_records import CallBook
from esg_prefect.runtime.pool_resources import PoolResources, within_backend
from esg_prefect.runtime.pool_views import PoolViews
from esg_prefect.runtime.profiles import DEFAULT_PROFILES, DEFAULT_SIZE_SAMPLES, load_default_profile, warn_if_shipped
from esg_prefect.runtime.stages import input_size
from esg_prefect.runtime.workers import (
    LocalProcessBackend,
    WorkerBackend,
    WorkerHandle,
)
from esg_prefect.runtime.workflows import WorkflowRegistry
from esg_prefect.scheduling import ESGSettings

__all__ = [
    "DEFAULT_PROFILES",
    "DEFAULT_SIZE_SAMPLES",
    "Pool",
    "PoolClock",
    "load_default_profile",
    "perf_ms",
    "wall_ms",
]

logger = logging.getLogger(__name__)

_DONE_MEMORY = 2_000  # finished calls a duplicate id still joins (their outputs are held that long)
_DECISION_MEMORY = 100_000  # scheduling decisions kept for reports


RECORD_MEMORY = 100_000
"""Call, batch and idle records and ended runs' requests a pool keeps in memory, newest (snapshots and
reports read them); the listeners (artifacts, cost store) get every record as it is made."""

EXECUTOR_THREADS = 512
"""Threads of the pool loop's executor: batches in flight and worker starts at once, at most."""


def _bare() -> contextvars.Context:
    """An empty context for the pool's loop work: not the context of whichever task run's thread called in.

    Without it a call's handling, and the batches and loads it leads to, would
    carry the submitting task run's Prefect context, and a print in an inline
    worker would be logged on that one run (``runtime.batch_output``).
    """
    return contextvars.Context()


class Pool(PoolViews, PoolActions, PoolResources):
    """AFW queues, the control core and a worker backend, shared by many flow runs.

    Args:
        profile: latency model; defaults to the profiles shipped with esg-prefect.
        prices: price sheet; defaults to :meth:`PriceSheet.default`.
        scheduler: registered scheduler name (``esg-prefect schedulers`` lists them).
        settings: ESG knobs.
        backend: where workers run; defaults to local processes. Where it caps
            the vCPUs of one worker (``LocalProcessBackend.max_worker_vcpus``),
            configurations above the cap are left out of the settings' space.
        switch_interval_s: when the pool starts, lower the interpreter's thread
            switch interval (``sys.setswitchinterval``) to this; None (the
            default) leaves the process's setting alone. Worth asking for where
            tens of flow runs share the pool's process (``ESGTaskRunner`` asks for 1 ms).
        clock: the time the pool gives the core, and its timers (default: the
            wall clock); tests drive the pool on a controllable one.
        hung_batch_s: a batch still running after this long and 20 times its
            predicted time has its worker stopped, as if it had died: a stage
            call that never returns fails alone (twice, alone) instead of holding
            every call batched with it. None: no limit.

    Examples:
        >>> pool = Pool(backend=InlineBackend())          # doctest: +SKIP
        >>> fut = pool.submit(call); fut.result().output   # doctest: +SKIP
    """

    def __init__(
        self,
        profile: LatencyProfile | None = None,
        prices: PriceSheet | None = None,
        scheduler: str = "esg",
        settings: ESGSettings | None = None,
        backend: WorkerBackend | None = None,
        switch_interval_s: float | None = None,
        clock: PoolClock | None = None,
        hung_batch_s: float | None = 60.0,
    ) -> None:
        if switch_interval_s is not None and not (0 < switch_interval_s <= 1):
            raise InvalidInputError(f"switch_interval_s must be in (0, 1] seconds or None, got {switch_interval_s!r}")
        if hung_batch_s is not None and (isinstance(hung_batch_s, bool) or not hung_batch_s > 0):
            raise InvalidInputError(f"hung_batch_s must be a number of seconds > 0, or None, got {hung_batch_s!r}")
        self.hung_batch_s = hung_batch_s
        self.switch_interval_s = switch_interval_s
        self.clock = clock or PoolClock()
        self.prices = prices or PriceSheet.default()
        self.backend: WorkerBackend = backend if backend is not None else LocalProcessBackend()
        self.settings = within_backend(settings or ESGSettings(), self.backend)
        self.scheduler_name = scheduler
        self._shipped_profile = profile is None  # planned with the example stages' profiles: warn other code
        self.planner = Planner(
            profile if profile is not None else load_default_profile(),
            self.prices,
            self.settings,
            scheduler,
            None if self.clock.deterministic else perf_ms,
        )
        self._start_lock = threading.Lock()  # guards starting the loop thread once
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._listen = Listeners()
        self._listeners = self._listen.runs  # (read by tests and tools)
        # Everything below is owned by the controller loop: touched only from its thread.
        self._core: Core | None = None
        self._resources: tuple[object, object] | None = None
        self._pending: dict[str, Pending] = {}  # call id -> its call, queued or running
        self._handles: dict[str, WorkerHandle] = {}  # worker id -> its handle, once started
        self._stage_paths: dict[QueueKey, str] = {}  # queue -> its stage's import path, for pre-warm starts
        self._ids = CallIds(_DONE_MEMORY)
        self._bindings = StageBindings()
        self._registry = WorkflowRegistry()
        self._settle_pending = False
        self._timers: dict[float, Cancellable] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._book = CallBook(RECORD_MEMORY)
        self._stopped = False  # the loop has stopped (closed): snapshots are read from this thread

    # ---- thread-safe API -------------------------------------------------------------------

    def submit(self, call: StageCall) -> concurrent.futures.Future[StageResult]:
        """Queue a stage call; the future resolves to its :class:`StageResult` or raises a StageCallError."""
        fut: concurrent.futures.Future[StageResult] = concurrent.futures.Future()
        try:
            if self._closed:
                raise PoolClosedError("the pool is closed")
            loop = self._ensure_started()
        except PoolClosedError as exc:
            fut.set_exception(exc)
            return fut
        loop.call_soon_threadsafe(self._on_submit, call, fut, context=_bare())
        return fut

    def add_run_listener(self, listener: RunListener) -> None:
        """Call ``listener(records)`` on a background thread each time a flow run ends (artifacts, cost store)."""
        self._listen.runs.append(listener)

    def add_run_lookup(self, lookup: RunLookup) -> None:
        """Ask ``lookup(run_id)`` for the records of a run that ends here while the pool holds none of its calls.

        A pool service restarted after a run's last call: the cost store holds the run
        under the earlier instance. Records found go to the run listeners as the run's.
        """
        self._listen.lookups.append(lookup)

    def add_batch_listener(self, listener: BatchListener) -> None:
        """Call ``listener(batches)`` on the listeners' thread with the batches completed since its last call.

        For records that must survive the pool's process being killed: the cost
        store writes batches as they complete, not only when their runs end.
        """
        self._listen.batches.append(listener)

    def recorded(self, batch_id: str) -> concurrent.futures.Future[None] | None:
        """A future done once batch ``batch_id`` was handed to the batch listeners (None: it was, or none listen).

        The pool service waits for it before it stores and sends a call's answer,
        so that a call answered is a call whose cost is in the store.
        """
        return self._listen.recorded(batch_id)

    def cancel(self, call_id: str) -> None:
        """Give up a call whose caller no longer waits (its task timed out): dropped if still queued.

        A call already running finishes with its batch; its answer goes nowhere.
        """
        if self._loop is not None and not self._closed:
            self._loop.call_soon_threadsafe(self._on_cancel, call_id, context=_bare())

    def end_run(self, run_id: str) -> None:
        """Tell the pool a flow run finished: its requests are closed and the run listeners called.

        A pool not started yet holds none of the run's calls (a pool service restarted after the
        run's last call): its run lookups may still find the run that an earlier instance served.
        """
        if self._closed:
            return
        if self._loop is None:
            self._listen.ended_unseen(run_id)
        else:
            self._loop.call_soon_threadsafe(self._on_end_run, run_id, context=_bare())

    def start(self) -> None:
        """Start the controller loop and warm the backend (its spare workers) now, not at the first call.

        The first call otherwise waits for both; ``ESGTaskRunner`` starts its shared pool so when a flow
        run starts. Thread-safe and idempotent; a closed pool raises :class:`PoolClosedError`.
        """
        self._ensure_started()

    def pause(self) -> None:
        """Hold dispatching: calls keep queueing (none is lost or failed), no batch starts until :meth:`resume`.

        Batches already running finish, idle workers still expire. Thread-safe; idempotent.
        """
        self._hold(True)

    def resume(self) -> None:
        """End a :meth:`pause`: the queues are scheduled at once (one round for everything that waited)."""
        self._hold(False)

    def _hold(self, paused: bool) -> None:
        if self._closed:
            raise PoolClosedError("the pool is closed")
        loop = self._ensure_started()
        asyncio.run_coroutine_threadsafe(self._set_paused(paused), loop).result(30.0)

    def close(self, timeout_s: float = 30.0) -> None:
        """Fail waiting calls with PoolClosedError, stop all workers and the controller."""
        with self._start_lock:
            if self._closed:
                return
            self._closed = True
        if self._loop is None:  # never started: what end_run handed the run lookups may still be on its way
            self._listen.close(timeout_s)
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout_s)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(timeout_s)
            self._stopped = self._thread is None or not self._thread.is_alive()
            self._listen.close(timeout_s)

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the loop: events in --------------------------------------------------------------------

    def _ensure_started(self) -> asyncio.AbstractEventLoop:
        with self._start_lock:
            if self._loop is None:
                if self._closed:  # closed before it ever started: never start a loop nothing would stop
                    raise PoolClosedError("the pool is closed")
                loop = asyncio.new_event_loop()
                # Every batch in flight holds a thread of the loop's executor for its whole run (a pipe
                # round trip), and so does every worker start: asyncio's default of cores + 4 threads
                # would cap a pool at 6 concurrent batches on 2 cores, 20 on 16. Threads start lazily.
                loop.set_default_executor(
                    concurrent.futures.ThreadPoolExecutor(EXECUTOR_THREADS, thread_name_prefix="esg-pool-io")
                )
                started = threading.Event()

                def _run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(started.set)
                    loop.run_forever()

                if self.switch_interval_s is not None and sys.getswitchinterval() > self.switch_interval_s:
                    sys.setswitchinterval(self.switch_interval_s)
                self._thread = threading.Thread(target=_run, name="esg-pool-controller", daemon=True)
                self._thread.start()
                started.wait()
                self._loop = loop
                warm_up = getattr(self.backend, "warm_up", None)
                if callable(warm_up):  # spare workers start while the first calls queue
                    _bare().run(asyncio.run_coroutine_threadsafe, warm_up(), loop)
            return self._loop

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro, context=_bare())
        self._tasks.add(task)  # keep a reference: the loop holds tasks only weakly
        task.add_done_callback(self._tasks.discard)

    def _the_core(self) -> Core:
        """The core, created on the loop at the first call (the backend's nodes may need the loop's thread)."""
        if self._core is None:
            fleet = Fleet(
                self.backend.nodes(),
                self.backend.devices(),
                self.settings.keep_alive_s * 1000.0,
                record_memory=RECORD_MEMORY,
            )
            self._core = Core(
                self.planner.scheduler,
                self.planner.tables,
                fleet,
                self.settings.platform,
                {},
                keep_stage_records=False,
                decision_memory=_DECISION_MEMORY,
                ended_memory=RECORD_MEMORY,
                totals=Totals(),  # for /metrics' counters; the simulator keeps none
            )
            self._refresh()
        return self._core

    def _on_submit(self, call: StageCall, fut: concurrent.futures.Future[StageResult]) -> None:
        try:
            self._admit(call, fut)
        except Exception as exc:  # whatever goes wrong, this call is answered and holds no place
            self._ids.forget(call.call_id, fut)
            if not fut.done():
                if not isinstance(exc, StageCallError):
                    logger.exception("call %s could not be queued", call.call_id)
                    exc = StageRejectedError(f"call {call.call_id!r} could not be queued: {exc!r}")
                fut.set_exception(exc)

    def _admit(self, call: StageCall, fut: concurrent.futures.Future[StageResult]) -> None:
        """Queue a call; every check runs before any state changes, so a refused call leaves no trace."""
        if self._closed:
            raise PoolClosedError("the pool is closed")
        if self._ids.join(call, fut):  # a retry: the first call's outcome
            return
        now = self.clock.now()
        size = call.input_size if call.input_size is not None else max(input_size(call.item), 1e-6)
        self._registry.check(call.workflow)
        core = self._the_core()
        binding = self._bindings.resolve(call.workflow.name, call.stage, call.stage_path)
        if binding.new:
            profiled = call.profile_stage or call.stage  # the profile's name for this code
            if self._shipped_profile:
                warn_if_shipped(call.stage, call.stage_path, profiled, self.planner.profile)
            if binding.name != profiled:
                self._alias(binding.name, profiled)
            if binding.aliased:
                self._registry.rename(call.workflow.name, call.stage, binding.name)
            self._bindings.commit(call.workflow.name, binding)
        workflow = self._registry.observe(call, binding.name)
        core.workflows[workflow.name] = workflow
        arrival = call.arrival_ms if call.arrival_ms > 0 else None
        c = call
        ev = CallArrived(c.call_id, c.request_id, c.run_id, workflow.name, binding.name, now, size, None, arrival,
                         c.task_run_id or None, tuple(c.upstream))  # fmt: skip
        try:
            job = core.arrive(ev)
        except Exception as exc:  # e.g. a stage with no profile: its calls are rejected with the reason
            raise StageRejectedError(str(exc)) from None
        self._ids.start(call, fut)
        self._pending[call.call_id] = Pending(call, fut, job)
        self._stage_paths[job.queue] = call.stage_path
        self._settle_soon()

    def _on_cancel(self, call_id: str) -> None:
        p = self._pending.get(call_id)
        if p is not None and self._core is not None and self._core.withdraw(p.job.job_id) is not None:
            self._fail(
                call_id,
                PoolClosedError(f"call {call_id!r} was cancelled: its caller stopped waiting"),
                self.clock.now(),
            )

    def _on_end_run(self, run_id: str) -> None:
        reqs = self._core.end_run(run_id) if self._core is not None else []
        if not (self._listen.runs and reqs):
            self._book.forget_run(run_id)
            if not reqs:  # none of its calls came here: an earlier instance may have served it
                self._listen.ended_unseen(run_id)
        else:
            slo = self._registry.slo_ms(reqs[0].workflow)
            s = self.settings
            self._listen.run_ended(
                self._book.run_ended(run_id, reqs, self.core, slo, self.prices, s.cost_split, s.idle_billing)
            )

    async def _set_paused(self, paused: bool) -> None:
        self._the_core().paused = paused
        if not paused:
            self._settle_soon()

    def _settle_soon(self) -> None:
        """Hand the core a tick once this loop iteration's events are in (a burst costs one round)."""
        if not self._settle_pending:
            self._settle_pending = True
            self.clock.call_soon(self._settle)

    def _on_timer(self, t: float) -> None:
        self._timers.pop(t, None)
        if self._core is not None:
            self._core.tick_due(t)
        self._settle_soon()

    def _settle(self) -> None:
        self._settle_pending = False
        if self._closed or self._core is None:
            return
        self._refresh()
        now = self.clock.now()
        try:
            actions = self._core.settle(now)
        except Exception as exc:  # a scheduler's bug: every waiting call is answered, none hangs
            logger.exception("scheduling round failed")
            for job in self._core.drain():
                self._fail(job.job_id, StageRejectedError(f"scheduler {self.scheduler_name!r} failed: {exc!r}"), now)
            return
        self._apply(actions, now)

    # ---- the online correction ------------------------------------------------------------------

    def _alias(self, name: str, stage: str) -> None:
        """Plan the pool's stage ``name`` with the profile of ``stage`` (a second code under one name)."""
        self.planner.alias(name, stage)
        self._replanned()

    def _replanned(self) -> None:
        if self._core is not None:
            self._core.replan(self.planner.scheduler, self.planner.tables)

    # ---- reading and closing --------------------------------------------------------------------

    async def _snapshot(self, recent: int | None = None) -> PoolSnapshot:
        return self._snapshot_now(recent)

    def _snapshot_now(self, recent: int | None = None) -> PoolSnapshot:
        """The snapshot, on the pool's loop (or on any thread once that loop has stopped)."""
        if self._core is None:
            return PoolSnapshot((), (), (), (), {}, ())
        enforcement = {wid: h.enforcement for wid, h in self._handles.items()}
        return self._book.snapshot(
            self._core, self.clock.now(), self._registry.slo_ms, enforcement, self.planner.corrections(), recent
        )

    async def _shutdown(self) -> None:
        now = self.clock.now()
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        if self._core is not None:
            for job in self._core.drain():
                self._fail(job.job_id, PoolClosedError("the pool closed before this call ran"), now)
            self._core.fleet.retire_idle(now)
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._handles.clear()  # the backend stops its workers as it closes
        for fut in self._ids.inflight.values():
            if not fut.done():
                fut.set_exception(PoolClosedError("the pool closed while this call ran"))
        await self.backend.close()
