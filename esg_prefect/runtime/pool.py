"""The pool: AFW queues of stage calls from many flow runs, batched by a scheduler onto workers.

One pool serves every flow run of a process (the embedded default) or, behind
the pool service, of many processes. Its state lives on one asyncio event
loop in a thread of its own (the controller): callers hand it calls from any
thread with :meth:`Pool.submit` and get a :class:`concurrent.futures.Future`.

The controller runs a scheduling round (``scheduler.decide(snapshot, now_ms)``,
the very call the simulator makes) when calls arrive, when batches finish and
on a timer tick while calls wait. Rounds are coalesced: a burst of arrivals in
one loop iteration costs one round. It applies the decisions: dispatches start
batches on warm or new workers, rejections fail their calls with the reason.

Failure isolation, so that nothing is lost or delivered twice:

* a batch whose function raises is split in halves and each half re-run on the
  same worker, down to single items: only the poison input's call fails, with
  the original error type, message and traceback;
* a worker that dies mid-batch is dropped (billed up to its death) and the
  batch's unfinished calls go back to their queue marked *solo*: whatever
  batch they join next, the pool runs the other calls first as one batch and
  then each solo call alone, so an input that kills its worker twice, alone,
  fails with :class:`~esg_prefect.exceptions.WorkerCrashedError` and the
  others complete;
* every call's future is resolved exactly once; a duplicate ``call_id`` (a
  client retrying) joins the first call or gets its stored result.

Costs: busy time of each batch (cold start included) and idle time of warm
workers are recorded as :class:`~esg_prefect.model.attribution.BatchRecord`
and :class:`~esg_prefect.model.attribution.IdleRecord`, ready for
:func:`~esg_prefect.model.attribution.attribute_costs`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import itertools
import logging
import math
import sys
import threading
import time
from collections import OrderedDict, defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from esg_prefect.control.calls import StageCall, StageResult
from esg_prefect.control.records import (
    BatchDone,
    BatchListener,
    CallRecord,
    CorrectionRow,
    PoolSnapshot,
    RequestRow,
    RunListener,
    RunRecords,
    RunStub,
    WorkerRow,
    request_records,
    stage_records,
)
from esg_prefect.exceptions import (
    CallConflictError,
    InvalidInputError,
    PoolClosedError,
    StageCallError,
    StageFailedError,
    StageRejectedError,
    WorkerCrashedError,
)
from esg_prefect.model.attribution import BatchItem, BatchRecord, IdleRecord
from esg_prefect.model.cluster import ClusterSnapshot, Worker
from esg_prefect.model.config import CPU, Config, ConfigSpace
from esg_prefect.model.correction import LatencyCorrection
from esg_prefect.model.jobs import Job, QueueKey
from esg_prefect.model.pricing import PriceSheet
from esg_prefect.model.profile import LatencyProfile, ProfilePoint
from esg_prefect.model.report import Report, summarize
from esg_prefect.model.size_model import SizeModel
from esg_prefect.model.workflow import Workflow
from esg_prefect.runtime.bindings import StageBindings
from esg_prefect.runtime.stages import input_size
from esg_prefect.runtime.workers import (
    BatchOutcome,
    LocalProcessBackend,
    WorkerBackend,
    WorkerDiedError,
    WorkerHandle,
    WorkerLoadError,
    WorkerSpec,
)
from esg_prefect.runtime.workflows import WorkflowRegistry
from esg_prefect.scheduling import (
    DecisionStats,
    Dispatch,
    ESGSettings,
    Placement,
    QueueState,
    Snapshot,
    Start,
    create_scheduler,
)
from esg_prefect.scheduling.tables import CandidateTables
from esg_prefect.workload.rate import ArrivalRateEWMA

logger = logging.getLogger(__name__)

_DONE_MEMORY = 2_000  # finished calls a duplicate id still joins (their outputs are held that long)
_HOP_MEMORY = 50_000  # task runs whose delivery time is kept, to measure the hop to their downstream calls
_LOAD_DEATHS = 3  # a call whose worker died while loading this often (no input ran) fails
_REPLAN_EVERY_MS = 1000.0  # at most one re-plan from a corrected profile per second


def wall_ms() -> float:
    """Wall-clock time in ms: comparable across the processes of one machine."""
    return time.time() * 1000.0


def perf_ms() -> float:
    """Monotonic time in ms, injected into the scheduler for its time budget."""
    return time.perf_counter() * 1000.0


@dataclass(slots=True)
class _Pending:
    """A call waiting in its queue (owned by the controller loop)."""

    call: StageCall
    future: concurrent.futures.Future[StageResult]
    job: Job
    solo: bool = False  # after a crash: run alone, so a poison input finds itself
    crashes: int = 0
    load_deaths: int = 0  # workers that died loading this call's stage before any input ran


@dataclass(slots=True)
class _WorkerState:
    spec: WorkerSpec
    stage: str
    handle: WorkerHandle | None = None
    busy: bool = True
    idle_since_ms: float | None = None
    started_ms: float = 0.0
    starting: bool = False  # loading for a pre-warm start (scheduling.base.Start), no batch yet


@dataclass(slots=True)
class _HopOverhead:
    """Smoothed time between a stage call's result and its downstream call's arrival, per workflow.

    Between two pooled stages of one request the caller's own machinery runs: under
    Prefect, the upstream task run finishes and the downstream one is created and
    started (about 0.1-0.3 s on the 2-core development machine under load). That time
    is spent against the request's SLO but outside the pool, where the profile cannot
    see it. The pool measures it and reserves it (see :meth:`Pool._reserve_ms`): the
    smoothed mean plus twice the smoothed mean deviation, the estimator TCP uses for
    its retransmission timer (RFC 6298, with a smaller multiplier), because a hop that
    takes longer than planned is a missed SLO.
    """

    alpha: float
    mean_ms: float | None = None
    dev_ms: float = 0.0

    def observe(self, gap_ms: float) -> None:
        gap_ms = max(0.0, gap_ms)
        if self.mean_ms is None:
            self.mean_ms, self.dev_ms = gap_ms, gap_ms / 2
            return
        self.dev_ms = (1 - self.alpha) * self.dev_ms + self.alpha * abs(gap_ms - self.mean_ms)
        self.mean_ms = (1 - self.alpha) * self.mean_ms + self.alpha * gap_ms

    @property
    def ms(self) -> float | None:
        """Time to reserve per hop, or None before the first observation."""
        return None if self.mean_ms is None else self.mean_ms + 2.0 * self.dev_ms


@dataclass(slots=True)
class _Request:
    arrival_ms: float
    run_id: str
    workflow: str
    segment_start: dict[int, float] = field(default_factory=dict)
    last_end_ms: float = 0.0
    open_calls: int = 0
    failed: bool = False
    at_risk: bool = False


DEFAULT_PROFILES = ("examples_cpu.csv", "nvidia_gpu.csv")
DEFAULT_SIZE_SAMPLES = "profiler_examples_cpu_samples.csv"
"""Shipped profiles the default pool loads: the example pipelines on this CPU, published GPU tables."""


def load_default_profile(
    names: tuple[str, ...] = DEFAULT_PROFILES, size_samples: str | None = DEFAULT_SIZE_SAMPLES
) -> LatencyProfile:
    """The shipped latency profiles ``names`` (from ``esg_prefect/data/profiles``), merged; missing ones skipped.

    The size model (Cypress) is fitted from the profiler's per-call samples
    ``size_samples`` (the example stages on this project's CPU): a size
    *factor* is a ratio to the typical item, so it carries over to the
    table it rescales even though that table was measured in another run.
    """
    from importlib import resources

    points: list[ProfilePoint] = []
    cold: dict[tuple[str, str], float] = {}
    folder = resources.files("esg_prefect") / "data" / "profiles"
    for name in names:
        entry = folder / name
        if entry.is_file():
            with resources.as_file(entry) as path:
                prof = LatencyProfile.from_csv(path)
            points.extend(prof.points)
            for p in prof.points:
                cold[(p.stage, p.hardware)] = prof.cold_start_ms(p.stage, p.hardware)
    sizes = None
    if size_samples is not None and (folder / size_samples).is_file():
        with resources.as_file(folder / size_samples) as path:
            sizes = SizeModel.from_samples_csv(path)
    return LatencyProfile(points, cold, sizes)


class Pool:
    """AFW queues, an ESG controller and a worker backend, shared by many flow runs.

    Args:
        profile: latency model; defaults to the profiles shipped with esg-prefect.
        prices: price sheet; defaults to :meth:`PriceSheet.default`.
        scheduler: registered scheduler name (``esg-prefect schedulers`` lists them).
        settings: ESG knobs.
        backend: where workers run; defaults to local processes. Where it caps
            the vCPUs of one worker (``LocalProcessBackend.max_worker_vcpus``),
            configurations above the cap are left out of the settings' space.
        switch_interval_s: when the pool starts, lower the interpreter's thread
            switch interval (``sys.setswitchinterval``, 5 ms by default) to this;
            None (the default) leaves the process's setting alone. Worth asking
            for where tens of flow runs share the pool's process: the pool's
            controller waits for the GIL behind their threads on every completion
            (``ESGTaskRunner`` asks for 1 ms; docs/results.md, "switch interval").

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
    ) -> None:
        if switch_interval_s is not None and not (0 < switch_interval_s <= 1):
            raise InvalidInputError(f"switch_interval_s must be in (0, 1] seconds or None, got {switch_interval_s!r}")
        self.switch_interval_s = switch_interval_s
        self.base_profile = profile if profile is not None else load_default_profile()
        self.profile = self.base_profile  # the base profile rescaled by the online correction
        self.prices = prices or PriceSheet.default()
        self.backend: WorkerBackend = backend if backend is not None else LocalProcessBackend()
        self.settings = _within_backend(settings or ESGSettings(), self.backend)
        self.scheduler_name = scheduler
        self.scheduler = create_scheduler(scheduler, self.profile, self.prices, self.settings, clock=perf_ms)
        self.tables = CandidateTables(self.profile, self.prices, self.settings)
        alpha = self.settings.correction_alpha
        self.correction: LatencyCorrection | None = LatencyCorrection(alpha) if alpha > 0 else None
        self._applied: dict[tuple[str, str], float] = {}  # factors self.profile was scaled with
        self._replanned_ms = -math.inf
        self._start_lock = threading.Lock()  # guards starting the loop thread once
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        # Everything below is owned by the controller loop: touched only from its thread.
        self._queues: dict[QueueKey, list[_Pending]] = {}
        self._stage_paths: dict[QueueKey, str] = {}  # queue -> its stage's import path, for pre-warm starts
        self._rates: dict[QueueKey, ArrivalRateEWMA] = {}  # the simulator's estimator too
        self._workers: dict[str, _WorkerState] = {}
        self._inflight: dict[str, concurrent.futures.Future[StageResult]] = {}
        self._done: OrderedDict[str, concurrent.futures.Future[StageResult]] = OrderedDict()
        self._identity: dict[str, tuple[str, ...]] = {}  # call id -> what it names (in flight or in _done)
        self._bindings = StageBindings()
        self._requests: dict[str, _Request] = {}
        self._registry = WorkflowRegistry()
        self._hops: dict[str, _HopOverhead] = {}  # workflow -> inter-stage overhead outside the pool
        self._delivered: OrderedDict[str, float] = OrderedDict()  # task run id -> when its result went back
        self._round_pending = False
        self._paused = False  # dispatching held (pause/resume): calls queue, nothing is decided
        self._keep_alive: tuple[frozenset[str], dict[str, float]] | None = None  # (types present, keep-alive ms)
        self._tick_handle: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._ids = itertools.count(1)
        self._calls: list[CallRecord] = []
        self._batches: list[BatchRecord] = []
        self._idles: list[IdleRecord] = []
        self._decisions: deque[DecisionStats] = deque(maxlen=100_000)
        self._calls_of_run: defaultdict[str, list[int]] = defaultdict(list)  # run -> indices in _calls
        self._batches_of_run: defaultdict[str, list[int]] = defaultdict(list)  # run -> indices in _batches
        self._listeners: list[RunListener] = []
        self._batch_listeners: list[BatchListener] = []
        self._idle_cursor = 0  # idle records already handed to run listeners
        self._batch_idle_cursor = 0  # ... and to batch listeners
        self._backlog: list[BatchDone] = []  # completed batches not yet handed to batch listeners
        self._backlog_lock = threading.Lock()  # the loop appends, the listeners' thread drains
        self._drain_scheduled = False
        self._recorded: dict[str, concurrent.futures.Future[None]] = {}  # batch id -> done once listened to
        self._notifier = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="esg-run-listeners")

    # ---- thread-safe API -------------------------------------------------------------------

    def submit(self, call: StageCall) -> concurrent.futures.Future[StageResult]:
        """Queue a stage call; the future resolves to its :class:`StageResult` or raises a StageCallError."""
        fut: concurrent.futures.Future[StageResult] = concurrent.futures.Future()
        if self._closed:
            fut.set_exception(PoolClosedError("the pool is closed"))
            return fut
        loop = self._ensure_started()
        loop.call_soon_threadsafe(self._on_submit, call, fut)
        return fut

    def add_run_listener(self, listener: RunListener) -> None:
        """Call ``listener(records)`` on a background thread each time a flow run ends (artifacts, cost store)."""
        self._listeners.append(listener)

    def add_batch_listener(self, listener: BatchListener) -> None:
        """Call ``listener(batches)`` on the listeners' thread with the batches completed since its last call.

        For records that must survive the pool's process being killed: the cost
        store writes batches as they complete, not only when their runs end.
        Batches that complete while the listener is busy come together in its
        next call, so a slow listener (a remote database) does not fall behind.
        """
        self._batch_listeners.append(listener)

    def end_run(self, run_id: str) -> None:
        """Tell the pool a flow run finished: its requests are closed and the run listeners called."""
        if self._loop is not None and not self._closed:
            self._loop.call_soon_threadsafe(self._on_end_run, run_id)

    def pause(self) -> None:
        """Hold dispatching: calls keep queueing (none is lost or failed), no batch starts until :meth:`resume`.

        Batches already running finish, idle workers still expire. For an
        operator: release a burst as one decision, or keep the queues while a
        device is serviced or the profile replaced. Thread-safe; idempotent.
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

    @property
    def paused(self) -> bool:
        """Whether dispatching is held (:meth:`pause`)."""
        return self._paused

    def snapshot(self, timeout_s: float = 30.0) -> PoolSnapshot:
        """Consistent copies of the records (calls, batches, idle time, decisions, queues, workers)."""
        if self._loop is None:
            return PoolSnapshot((), (), (), (), {}, {}, ())
        return asyncio.run_coroutine_threadsafe(self._snapshot(), self._loop).result(timeout_s)

    def report(self, timeout_s: float = 30.0) -> Report:
        """SLO hit rate, latencies, batch sizes, costs and decision times so far (one ``summarize``)."""
        snap = self.snapshot(timeout_s)
        return summarize(
            request_records(snap),
            stage_records(snap),
            snap.batches,
            snap.idles,
            self.prices,
            snap.decisions,
            self.settings.cost_split,
            self.settings.idle_billing,
        )

    def close(self, timeout_s: float = 30.0) -> None:
        """Fail waiting calls with PoolClosedError, stop all workers and the controller."""
        with self._start_lock:
            if self._closed:
                return
            self._closed = True
        if self._loop is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout_s)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(timeout_s)
            # Run listeners (cost store, artifacts) finish the runs they were handed before close
            # returns: at interpreter exit their API clients could no longer start.
            drained = self._notifier.submit(lambda: None)
            with contextlib.suppress(concurrent.futures.TimeoutError):
                drained.result(timeout_s)
            self._notifier.shutdown(wait=False)

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- controller loop -----------------------------------------------------------------------

    def _ensure_started(self) -> asyncio.AbstractEventLoop:
        with self._start_lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
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
                    asyncio.run_coroutine_threadsafe(warm_up(), loop)
            return self._loop

    def _spawn_task(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)  # keep a reference: the loop holds tasks only weakly
        task.add_done_callback(self._tasks.discard)

    def _on_submit(self, call: StageCall, fut: concurrent.futures.Future[StageResult]) -> None:
        try:
            self._admit(call, fut)
        except Exception as exc:  # whatever goes wrong, this call is answered and holds no place
            if self._inflight.get(call.call_id) is fut:
                self._inflight.pop(call.call_id, None)
                self._identity.pop(call.call_id, None)
            if not fut.done():
                if not isinstance(exc, StageCallError):
                    logger.exception("call %s could not be queued", call.call_id)
                    exc = StageRejectedError(f"call {call.call_id!r} could not be queued: {exc!r}")
                fut.set_exception(exc)

    def _admit(self, call: StageCall, fut: concurrent.futures.Future[StageResult]) -> None:
        """Queue a call; every check runs before any state changes, so a refused call leaves no trace."""
        if self._closed:
            raise PoolClosedError("the pool is closed")
        # Idempotency: a call id seen before joins the first call, or gets its stored outcome.
        first = self._inflight.get(call.call_id) or self._done.get(call.call_id)
        if first is not None:
            if self._identity.get(call.call_id) != call.identity():
                raise CallConflictError(
                    f"call id {call.call_id!r} was used for another call {self._identity.get(call.call_id)}; "
                    f"this one is {call.identity()}"
                )
            _chain(first, fut)
            return
        now = wall_ms()
        size = call.input_size if call.input_size is not None else max(input_size(call.item), 1e-6)
        self._registry.check(call.workflow)
        wf_name = call.workflow.name
        binding = self._bindings.resolve(wf_name, call.stage, call.stage_path)
        if binding.new:
            if binding.aliased:
                self._alias(binding.name, call.stage)
                self._registry.rename(wf_name, call.stage, binding.name)
            self._bindings.commit(wf_name, binding)
        stage = binding.name
        workflow = self._registry.observe(call, stage)
        req = self._requests.get(call.request_id)
        if req is None:
            arrival = call.arrival_ms if 0 < call.arrival_ms <= now else now
            req = _Request(arrival, call.run_id, workflow.name)
            self._requests[call.request_id] = req
        key = QueueKey(workflow.name, stage)
        hardware = frozenset({"cpu", *(d.hardware for d in self.backend.devices())})
        try:
            dist = self.tables.slo(workflow, hardware)
            seg = dist.segment_of(stage)
            start = req.segment_start.get(seg.index, now)
            deadline = dist.deadline_after(stage, req.arrival_ms, start)
        except Exception as exc:  # e.g. a stage with no profile: its calls are rejected with the reason
            req.failed = True
            raise StageRejectedError(str(exc)) from None
        self._observe_hop(workflow.name, call, now)
        reserve = self._reserve_ms(workflow, stage)
        job = Job(
            call.call_id,
            call.request_id,
            call.run_id,
            key,
            req.arrival_ms,
            max(now, req.arrival_ms),
            max(now, deadline - reserve),
            max(now, req.arrival_ms + workflow.slo_ms - reserve),
            None,
            size,
        )
        req.segment_start.setdefault(seg.index, start)
        req.open_calls += 1
        self._inflight[call.call_id] = fut
        self._identity[call.call_id] = call.identity()
        self._queues.setdefault(key, []).append(_Pending(call, fut, job))
        self._stage_paths[key] = call.stage_path
        rate = self._rates.setdefault(key, ArrivalRateEWMA(self.settings.rate_ewma_alpha))
        with contextlib.suppress(InvalidInputError):  # the wall clock stepped back: skip this one
            rate.observe(now)
        self._request_round()

    def _alias(self, name: str, stage: str) -> None:
        """Plan the pool's stage ``name`` with the profile of ``stage`` (a second code under one name)."""
        self.base_profile = self.base_profile.aliased({name: stage})
        self._replan(self.base_profile.scaled(self._applied) if self._applied else self.base_profile)

    def _replan(self, profile: LatencyProfile) -> None:
        """Plan with ``profile`` from the next round on (a new scheduler and tables; no state is lost)."""
        self.profile = profile
        self.scheduler = create_scheduler(self.scheduler_name, self.profile, self.prices, self.settings, clock=perf_ms)
        self.tables = CandidateTables(self.profile, self.prices, self.settings)

    def _observe_hop(self, workflow: str, call: StageCall, now: float) -> None:
        ends = [self._delivered[u] for u in call.upstream if u in self._delivered]
        if ends and self.settings.reserve_overhead:
            self._hops.setdefault(workflow, _HopOverhead(self.settings.rate_ewma_alpha)).observe(now - max(ends))

    def _reserve_ms(self, workflow: Workflow, stage: str) -> float:
        """Time to keep free after ``stage`` for the caller's work between and after the pooled stages.

        One measured hop per stage on the longest path after ``stage`` to the end of
        the workflow, plus one for the end of the flow run (which the pool does not
        see, and which costs about what a hop costs). Zero until a hop is measured.
        """
        hop = self._hops.get(workflow.name)
        if hop is None or hop.ms is None:
            return 0.0
        return hop.ms * (1 + _stages_after(workflow, stage))

    def _on_end_run(self, run_id: str) -> None:
        reqs = [req for req in self._requests.values() if req.run_id == run_id]
        for req in reqs:
            if req.open_calls == 0:
                req.open_calls = -1  # closed: no more calls expected
        if not self._listeners or not reqs:
            return
        workflows = self._registry.current()
        records = RunRecords(
            run_id,
            reqs[0].workflow,
            tuple(self._calls[i] for i in self._calls_of_run.pop(run_id, [])),
            tuple(self._batches[i] for i in self._batches_of_run.pop(run_id, [])),
            min(r.arrival_ms for r in reqs),
            None if any(r.failed or r.open_calls > 0 for r in reqs) else max(r.last_end_ms for r in reqs),
            workflows[reqs[0].workflow].slo_ms,
            self.prices,
            self.settings.cost_split,
            tuple(self._idles[self._idle_cursor :]),
        )
        self._idle_cursor = len(self._idles)
        for listener in self._listeners:
            self._notifier.submit(_call_listener, listener, records)

    def _hand_batch(self, done: BatchDone) -> None:
        idles = tuple(self._idles[self._batch_idle_cursor :])
        self._batch_idle_cursor = len(self._idles)
        runs: dict[str, RunStub] = {}
        for c in done.calls:
            req = self._requests.get(c.request_id)
            if req is not None and (c.run_id not in runs or req.arrival_ms < runs[c.run_id].arrival_ms):
                runs[c.run_id] = RunStub(c.run_id, req.workflow, req.arrival_ms, self._registry.slo_ms(req.workflow))
        done = dataclasses.replace(done, runs=tuple(runs.values()), new_idles=idles)
        with self._backlog_lock:
            self._backlog.append(done)
            if self._drain_scheduled:
                return
            self._drain_scheduled = True
        self._notifier.submit(self._drain_batches)

    def _drain_batches(self) -> None:
        """On the listeners' thread: hand every batch completed so far to each batch listener, at once."""
        with self._backlog_lock:
            batches, self._backlog = self._backlog, []
            self._drain_scheduled = False
        for listener in self._batch_listeners:
            _call_listener(listener, batches)
        with self._backlog_lock:
            recorded = [self._recorded.pop(b.batch.batch_id, None) for b in batches]
        for fut in recorded:
            if fut is not None:
                fut.set_result(None)

    def recorded(self, batch_id: str) -> concurrent.futures.Future[None] | None:
        """A future done once batch ``batch_id`` was handed to the batch listeners (None: it was, or none listen).

        The pool service waits for it before it stores and sends a call's answer,
        so that a call answered is a call whose cost is in the store, even if the
        service is killed right after.
        """
        with self._backlog_lock:
            return self._recorded.get(batch_id)

    async def _set_paused(self, paused: bool) -> None:
        self._paused = paused
        if not paused:
            self._request_round()

    def _request_round(self) -> None:
        if not self._round_pending:
            self._round_pending = True
            asyncio.get_running_loop().call_soon(self._round)

    def _round(self) -> None:
        self._round_pending = False
        if self._closed:
            return
        now = wall_ms()
        self._expire_idle(now)
        if self._paused:  # resume() asks for the next round; no timer meanwhile
            return
        queues = tuple(
            QueueState(key, tuple(p.job for p in pend), self._rates[key].rate_per_s(now))
            for key, pend in self._queues.items()
            if pend
        )
        if queues:
            snapshot = Snapshot(queues, self._cluster(), self._registry.current())
            result = self.scheduler.decide(snapshot, now)
            self._decisions.extend(result.stats)
            for rej in result.rejects:
                for jid in rej.job_ids:
                    self._fail_queued(rej.queue, jid, StageRejectedError(rej.reason))
            for d in result.dispatches:
                self._dispatch(d, now)
            for st in result.starts:  # after the dispatches, in the order the scheduler placed them
                self._prewarm(st, now)
        if any(self._queues.values()) and self._tick_handle is None:
            loop = asyncio.get_running_loop()
            self._tick_handle = loop.call_later(self.settings.tick_ms / 1000.0, self._tick)

    def _tick(self) -> None:
        self._tick_handle = None
        self._request_round()

    def _cluster(self) -> ClusterSnapshot:
        workers = [
            Worker(
                wid,
                ws.spec.node,
                ws.spec.device_id,
                ws.spec.hardware,
                ws.spec.vcpus,
                ws.spec.gpu_share,
                ws.stage,
                busy=ws.busy,
                idle_since_ms=ws.idle_since_ms,
                starting=ws.starting,
            )
            for wid, ws in self._workers.items()
        ]
        return ClusterSnapshot(self.backend.nodes(), self.backend.devices(), workers)

    def keep_alive_ms(self) -> dict[str, float]:
        """How long an idle worker is kept, per hardware type present (``ESGSettings.keep_alive_by_price``)."""
        return dict(self._keep_alive_table())

    def _keep_alive_table(self) -> dict[str, float]:
        """:meth:`keep_alive_ms`, kept while the hardware types present stay the same (read every round)."""
        present = frozenset({CPU, *(d.hardware for d in self.backend.devices())})
        if self._keep_alive is None or self._keep_alive[0] != present:
            keep_ms = self.settings.keep_alive_s * 1000.0
            if self.settings.keep_alive_by_price:
                table = {hw: keep_ms * scale for hw, scale in self.prices.keep_alive_scales(present).items()}
            else:
                table = dict.fromkeys(present, keep_ms)
            self._keep_alive = (present, table)
        return self._keep_alive[1]

    def _expire_idle(self, now: float) -> None:
        idle = [(wid, ws) for wid, ws in self._workers.items() if not ws.busy and ws.idle_since_ms is not None]
        if not idle:
            return
        base = self.settings.keep_alive_s * 1000.0
        keep = self._keep_alive_table()
        for wid, ws in idle:
            assert ws.idle_since_ms is not None
            if now - ws.idle_since_ms > keep.get(ws.spec.hardware, base):
                self._retire(wid, now)

    def _retire(self, wid: str, now: float) -> None:
        ws = self._workers.pop(wid)
        if ws.idle_since_ms is not None:
            self._record_idle(ws, ws.idle_since_ms, now)
        if ws.handle is not None:
            self._spawn_task(ws.handle.stop())

    def _record_idle(self, ws: _WorkerState, start: float, end: float) -> None:
        if end > start:
            s = ws.spec
            self._idles.append(IdleRecord(s.worker_id, s.vcpus, s.gpu_share, s.hardware, start, end))

    def _take(self, key: QueueKey, job_ids: tuple[str, ...]) -> list[_Pending]:
        wanted = set(job_ids)
        pend = self._queues.get(key, [])
        taken = [p for p in pend if p.job.job_id in wanted]
        self._queues[key] = [p for p in pend if p.job.job_id not in wanted]
        return taken

    def _fail_queued(self, key: QueueKey, job_id: str, exc: Exception) -> None:
        for p in self._take(key, (job_id,)):
            self._finish(p, None, exc, wall_ms(), wall_ms())

    def _dispatch(self, d: Dispatch, now: float) -> None:
        pendings = self._take(d.queue, d.job_ids)
        if not pendings:
            return
        self._evict(d.placement, now)
        if d.placement.worker_id is not None and d.placement.worker_id in self._workers:
            ws = self._workers[d.placement.worker_id]
            if ws.idle_since_ms is not None:
                self._record_idle(ws, ws.idle_since_ms, now)
            ws.busy, ws.idle_since_ms = True, None
        else:
            ws = self._new_worker(
                pendings[0].call.stage_path,
                d.queue.stage,
                d.placement.node,
                d.placement.device_id,
                d.hardware,
                d.config,
                now,
            )
        self._spawn_task(self._run_batch(ws, pendings, d, now))

    def _prewarm(self, st: Start, now: float) -> None:
        """Start a worker with no batch, so that it is warm when the queue next needs it.

        The worker counts as busy (``starting``) while it loads; once loaded it is
        idle and warm, its idle time counted from the start's beginning so that
        the load is billed (as idle time: no run's batch held it). A start that
        fails to load is dropped with a warning: no job was waiting on it.
        """
        path = self._stage_paths.get(st.queue)
        if path is None or st.placement.worker_id is not None:
            return
        self._evict(st.placement, now)
        ws = self._new_worker(
            path, st.queue.stage, st.placement.node, st.placement.device_id, st.hardware, st.config, now
        )
        ws.starting = True
        logger.debug("worker %s: %s", ws.spec.worker_id, st.reason)
        self._spawn_task(self._load(ws, now))

    async def _load(self, ws: _WorkerState, began: float) -> None:
        try:
            ws.handle = await self.backend.start(ws.spec)
        except (WorkerLoadError, WorkerDiedError) as exc:
            self._workers.pop(ws.spec.worker_id, None)
            logger.warning("pre-warm start of worker %s failed (%s); dropped", ws.spec.worker_id, exc)
            return
        finally:
            ws.starting = False
        if ws.spec.worker_id in self._workers:
            ws.busy, ws.idle_since_ms = False, began
        self._request_round()

    def _evict(self, placement: Placement, now: float) -> None:
        """Stop the idle workers a placement makes room by stopping (one still idle; a busy one is left)."""
        for wid in placement.evict:
            if wid in self._workers and not self._workers[wid].busy:
                self._retire(wid, now)

    def _new_worker(
        self, path: str, stage: str, node: str, device: str | None, hardware: str, cfg: Config, now: float
    ) -> _WorkerState:
        wid = f"w{next(self._ids)}"
        spec = WorkerSpec(wid, path, node, device, hardware, cfg.vcpus, cfg.gpu_share)
        ws = _WorkerState(spec, stage, started_ms=now)
        self._workers[wid] = ws
        return ws

    async def _run_batch(self, ws: _WorkerState, pendings: list[_Pending], d: Dispatch, start: float) -> None:
        cold = ws.handle is None
        batch_id = f"b{next(self._ids)}"
        results: dict[int, tuple[Any, BaseException | None]] = {}
        running: list[int] = []  # indices on the worker right now, to blame a crash on
        died: BaseException | None = None
        try:
            if ws.handle is None:
                ws.handle = await self.backend.start(ws.spec)
            normal = [i for i, p in enumerate(pendings) if not p.solo]
            if normal:
                await self._run_items(ws.handle, pendings, normal, results, running)
            for i in (i for i, p in enumerate(pendings) if p.solo):
                await self._run_items(ws.handle, pendings, [i], results, running)
        except WorkerLoadError as exc:
            for i in range(len(pendings)):
                results.setdefault(i, (None, StageFailedError(str(exc), "WorkerLoadError")))
            died = exc
        except WorkerDiedError as exc:
            died = exc
            if ws.handle is None:  # it died loading: no input ran, none is to blame
                for p in pendings:
                    p.load_deaths += 1
        end = wall_ms()
        for run in {p.call.run_id for p in pendings}:
            self._batches_of_run[run].append(len(self._batches))
        self._batches.append(
            BatchRecord(
                batch_id,
                ws.spec.worker_id,
                tuple(BatchItem(p.call.request_id, p.call.run_id, p.job.input_size) for p in pendings),
                Config(len(pendings), ws.spec.vcpus, ws.spec.gpu_share),
                ws.spec.hardware,
                start,
                end,
            )
        )
        runs = len({p.call.run_id for p in pendings})
        first_call = len(self._calls)
        if self._batch_listeners:  # before any caller hears of the batch: it may wait for its records
            with self._backlog_lock:
                self._recorded[batch_id] = concurrent.futures.Future()
        requeue: list[_Pending] = []
        for i, p in enumerate(pendings):
            if i in results:
                out, err = results[i]
                res = None
                if err is None:
                    res = StageResult(
                        p.call.call_id,
                        out,
                        batch_id,
                        len(pendings),
                        ws.spec.worker_id,
                        ws.spec.hardware,
                        ws.spec.vcpus,
                        ws.spec.gpu_share,
                        start - p.job.ready_ms,
                        d.predicted_ms,
                        end - start,
                        cold,
                        d.at_risk,
                        d.reason,
                        runs,
                    )
                self._finish(p, res, err, start, end)
                continue
            # Not finished on a worker that died: back to the queue, to run alone next time.
            if p.solo and running == [i]:
                p.crashes += 1  # it was alone on the worker when it died
            if p.crashes >= 2 or p.load_deaths >= _LOAD_DEATHS:
                what = (
                    "twice while running this input alone"
                    if p.crashes >= 2
                    else f"{p.load_deaths} times while loading the stage's model"
                )
                crash = WorkerCrashedError(f"stage {p.call.stage!r}: the worker died {what} ({died})")
                self._finish(p, None, crash, start, end)
            else:
                p.solo = True
                requeue.append(p)
        if self._batch_listeners:
            calls = tuple(self._calls[first_call:])
            self._hand_batch(BatchDone(self._batches[-1], calls, d.queue.workflow, d.queue.stage, self.prices))
        if requeue:
            self._queues[d.queue] = requeue + self._queues.get(d.queue, [])
        if died is not None:
            self._workers.pop(ws.spec.worker_id, None)
            logger.warning("worker %s lost (%s); %d call(s) requeued", ws.spec.worker_id, died, len(requeue))
        else:
            ws.busy, ws.idle_since_ms = False, end
        self._request_round()

    async def _run_items(
        self,
        handle: WorkerHandle,
        pendings: list[_Pending],
        idx: list[int],
        results: dict[int, tuple[Any, BaseException | None]],
        running: list[int],
    ) -> None:
        """Run items as one batch; on a batch error, bisect until the failing inputs are alone."""
        running[:] = idx
        began = wall_ms()
        outcome: BatchOutcome = await handle.execute([pendings[i].call.item for i in idx])
        running.clear()
        if outcome.ok:
            sizes = [pendings[i].job.input_size for i in idx]
            self._correct(pendings[idx[0]].job.queue.stage, handle.spec, sizes, wall_ms() - began)
            for i, out in zip(idx, outcome.outputs, strict=True):
                results[i] = (out, None)
            return
        if len(idx) == 1:
            stage = pendings[idx[0]].call.stage
            results[idx[0]] = (
                None,
                StageFailedError(
                    f"stage {stage!r} raised {outcome.error_type}: {outcome.error_message}",
                    outcome.error_type,
                    outcome.error_traceback,
                ),
            )
            return
        mid = len(idx) // 2
        await self._run_items(handle, pendings, idx[:mid], results, running)
        await self._run_items(handle, pendings, idx[mid:], results, running)

    def _correct(self, stage: str, spec: WorkerSpec, sizes: list[float], actual_ms: float) -> None:
        """Fold a batch's time as the pool saw it into the online correction; re-plan on drift.

        The time is taken around the worker call (inputs sent, batch run, outputs
        back), not the worker's own compute time: that is what the plan's batch
        latency has to cover. The prediction it is compared with accounts for the
        items' sizes where the profile has a size model, so that a batch of long
        prompts is not mistaken for a slower machine. Re-planning (a rescaled profile, a new scheduler and
        tables) happens when a factor moved by more than 10 % from the one in use,
        at most once a second; the scheduler keeps no state between rounds that
        this would lose (arrival rates live in the pool).
        """
        if self.correction is None:
            return
        cfg = Config(len(sizes), spec.vcpus, spec.gpu_share)
        predicted = self.base_profile.try_latency_ms(stage, cfg, spec.hardware, "mean")
        if predicted is None:
            return
        predicted *= self.base_profile.size_factor(stage, cfg, spec.hardware, sizes)
        self.correction.observe(stage, spec.hardware, predicted, actual_ms)
        now = wall_ms()
        if now - self._replanned_ms >= _REPLAN_EVERY_MS and self.correction.drifted(self._applied):
            self._replanned_ms = now
            self._applied = self.correction.factors()
            self._replan(self.base_profile.scaled(self._applied))
            logger.info(
                "profile corrected from measured batches: %s",
                ", ".join(f"{st}@{hw} x{f:.2f}" for (st, hw), f in sorted(self._applied.items())),
            )

    def _finish(
        self, p: _Pending, res: StageResult | None, err: BaseException | None, start: float, end: float
    ) -> None:
        self._inflight.pop(p.call.call_id, None)
        self._done[p.call.call_id] = p.future
        if len(self._done) > _DONE_MEMORY:
            self._identity.pop(self._done.popitem(last=False)[0], None)
        req = self._requests.get(p.call.request_id)
        if req is not None:
            req.open_calls -= 1
            req.last_end_ms = max(req.last_end_ms, end)
            req.failed |= err is not None
            req.at_risk |= bool(res and res.at_risk)
        self._calls_of_run[p.call.run_id].append(len(self._calls))
        self._calls.append(
            CallRecord(
                p.call.call_id,
                p.call.request_id,
                p.call.run_id,
                p.call.workflow.name,
                p.call.stage,
                p.job.ready_ms,
                start,
                end,
                err is None,
                None if res is None else dataclasses.replace(res, output=None),  # records keep no outputs
                "" if err is None else str(err),
            )
        )
        if p.call.task_run_id:
            self._delivered[p.call.task_run_id] = wall_ms()
            if len(self._delivered) > _HOP_MEMORY:
                self._delivered.popitem(last=False)
        if not p.future.done():  # exactly once
            if err is None:
                assert res is not None
                p.future.set_result(res)
            else:
                p.future.set_exception(err)

    async def _snapshot(self) -> PoolSnapshot:
        now = wall_ms()
        idles = list(self._idles)
        for ws in self._workers.values():  # idle time so far, not yet closed
            if not ws.busy and ws.idle_since_ms is not None and now > ws.idle_since_ms:
                s = ws.spec
                idles.append(IdleRecord(s.worker_id, s.vcpus, s.gpu_share, s.hardware, ws.idle_since_ms, now))
        slo = self._registry.slo_ms
        requests = {
            rid: RequestRow(
                r.run_id,
                r.workflow,
                r.arrival_ms,
                r.last_end_ms if r.open_calls <= 0 and not r.failed else None,
                slo(r.workflow),
                r.at_risk,
            )
            for rid, r in self._requests.items()
        }
        workers = tuple(
            WorkerRow(
                wid,
                ws.stage,
                ws.busy,
                ws.spec.vcpus,
                ws.spec.gpu_share,
                ws.spec.hardware,
                str(getattr(ws.handle, "enforcement", "")),
            )
            for wid, ws in self._workers.items()
        )
        return PoolSnapshot(
            tuple(self._calls),
            tuple(self._batches),
            tuple(idles),
            tuple(self._decisions),
            requests,
            {str(k): len(v) for k, v in self._queues.items()},
            workers,
            self._corrections(),
        )

    def _corrections(self) -> tuple[CorrectionRow, ...]:
        """The online correction's learned factors, and the ones the scheduler plans with now."""
        if self.correction is None:
            return ()
        return tuple(
            CorrectionRow(
                stage,
                hw,
                round(f, 4),
                round(self._applied.get((stage, hw), 1.0), 4),
                self.correction.observations(stage, hw),
            )
            for (stage, hw), f in sorted(self.correction.factors().items())
        )

    async def _shutdown(self) -> None:
        for pend in self._queues.values():
            for p in pend:
                if not p.future.done():
                    p.future.set_exception(PoolClosedError("the pool closed before this call ran"))
        self._queues.clear()
        now = wall_ms()
        for ws in self._workers.values():
            if not ws.busy and ws.idle_since_ms is not None:
                self._record_idle(ws, ws.idle_since_ms, now)
        self._workers.clear()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for p_fut in self._inflight.values():
            if not p_fut.done():
                p_fut.set_exception(PoolClosedError("the pool closed while this call ran"))
        await self.backend.close()


def _within_backend(settings: ESGSettings, backend: WorkerBackend) -> ESGSettings:
    """The settings without worker vCPU options above the backend's ``max_worker_vcpus`` (where it has one)."""
    cap = getattr(backend, "max_worker_vcpus", None)
    space = settings.config_space
    if not isinstance(cap, int) or all(v <= cap for v in space.vcpus):
        return settings
    kept = tuple(v for v in space.vcpus if v <= cap) or (min(space.vcpus),)
    return dataclasses.replace(settings, config_space=ConfigSpace(space.batches, kept, space.gpu_shares))


@functools.lru_cache(maxsize=4096)
def _stages_after(workflow: Workflow, stage: str) -> int:
    """Stages on the longest path from ``stage`` (excluded) to an exit of ``workflow``."""
    succ = workflow.successors(stage)
    return 1 + max(_stages_after(workflow, s) for s in succ) if succ else 0


def _call_listener(listener: Callable[[Any], None], records: RunRecords | list[BatchDone]) -> None:
    try:
        listener(records)
    except Exception:  # a listener's failure must not stop the pool or the other listeners
        logger.exception("listener %r failed for %s", listener, getattr(records, "run_id", "batches"))


def _chain(src: concurrent.futures.Future[StageResult], dst: concurrent.futures.Future[StageResult]) -> None:
    def _copy(f: concurrent.futures.Future[StageResult]) -> None:
        if dst.done():
            return
        exc = f.exception()
        if exc is not None:
            dst.set_exception(exc)
        else:
            dst.set_result(f.result())

    src.add_done_callback(_copy)
