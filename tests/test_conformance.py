"""Exact conformance: the runtime pool and the simulator make the same decisions on the same arrivals.

Both drive one control core (:mod:`esg_prefect.control.core`); what could
still differ is how each driver feeds it events and carries out its actions.
So the live :class:`~esg_prefect.runtime.pool.Pool` runs here on a virtual
clock: a :class:`VirtualClock` owns its timers, time jumps to the next timer
only once the pool's asyncio loop has nothing left to do, and the pool's
scheduling tick runs only then (as the simulator settles after all the events
of an instant). A fake backend finishes every batch at the time the simulator
predicts for it (mean service time, the profile's cold start on a new worker,
no interference), and a fake caller submits each request's next stage when its
upstream calls' results arrive, as a flow does. The two runs must produce the
same batch records (ids, workers, jobs, configurations, hardware, start and
end to the last bit), the same idle records, the same decision statistics and
the same request finish times, for every registered scheduler.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from esg_prefect.control.calls import StageCall, StageResult, WorkflowDecl
from esg_prefect.exceptions import StageRejectedError
from esg_prefect.model import PriceSheet, Workflow
from esg_prefect.model.cluster import Device, Node
from esg_prefect.model.config import Config
from esg_prefect.model.profile import LatencyProfile
from esg_prefect.runtime.batch_output import LogLine
from esg_prefect.runtime.pool import Pool, PoolClock
from esg_prefect.runtime.workers import BatchOutcome, WorkerSpec
from esg_prefect.scheduling.registry import scheduler_names
from esg_prefect.simulator import Case, SimSpec, simulate
from esg_prefect.simulator.case import ClusterSpec, NodeSpec
from esg_prefect.simulator.standard import tiny_case
from tests.test_control_core import CHAIN, SETTINGS
from tests.test_keepalive import COLD_PROFILE


class _Timer:
    __slots__ = ("args", "callback", "cancelled")

    def __init__(self, callback: Callable[..., object], args: tuple[object, ...]) -> None:
        self.callback, self.args, self.cancelled = callback, args, False

    def cancel(self) -> None:
        self.cancelled = True


class VirtualClock(PoolClock):
    """Time that moves only to the next timer, once the loop is idle; the pool's ticks run at idle points."""

    deterministic = True

    def __init__(self) -> None:
        self.t = 0.0
        self._timers: list[tuple[float, int, _Timer]] = []
        self._seq = 0
        self._idle: list[Callable[[], object]] = []

    def now(self) -> float:
        return self.t

    def call_at(self, t_ms: float, callback: Callable[..., object], *args: object) -> _Timer:
        timer = _Timer(callback, args)
        self._seq += 1
        heapq.heappush(self._timers, (max(t_ms, self.t), self._seq, timer))
        return timer

    def call_soon(self, callback: Callable[[], object]) -> None:
        self._idle.append(callback)

    async def sleep_until(self, t_ms: float) -> None:
        fut = asyncio.get_running_loop().create_future()
        self.call_at(t_ms, fut.set_result, None)
        await fut

    async def run(
        self,
        at_instant_end: Callable[[float], bool],
        limit_ms: float = math.inf,
        stuck: Callable[[], str] = str,
    ) -> None:
        """Process timers in time order; after an instant's events, ``at_instant_end(t)`` (True: stop) and the ticks.

        Past ``limit_ms`` of virtual time it raises, saying what is ``stuck``: a scheduler that never
        dispatches some waiting calls keeps the pool's ticks going for ever, and would otherwise show only as
        the wall-clock timeout of the test.
        """
        loop = asyncio.get_running_loop()
        while True:
            if self.t > limit_ms:
                raise AssertionError(f"still running at {self.t:.0f} ms of virtual time: {stuck()}")
            # Let everything the last step scheduled run (the loop's ready queue is private API: a test-only peek).
            while loop._ready:
                await asyncio.sleep(0)
            if self._timers and self._timers[0][0] <= self.t:
                _, _, timer = heapq.heappop(self._timers)
                if not timer.cancelled:
                    timer.callback(*timer.args)
                continue
            if self._idle:
                if at_instant_end(self.t):
                    return
                idle, self._idle = self._idle, []
                for cb in idle:
                    cb()
                continue
            if not self._timers:
                return
            self.t = self._timers[0][0]


class _Handle:
    """A worker that takes exactly the simulator's predicted time (mean service time, cold start when new)."""

    def __init__(self, backend: FakeBackend, spec: WorkerSpec, warm: bool) -> None:
        self.backend, self.spec, self.fresh = backend, spec, not warm
        self.load_ms = 0.0  # its cold start is taken by its first batch, as the simulator counts it
        self.enforcement = "fake (virtual clock)"
        self.out_of_process = False  # its batches take exactly their time on the clock: no overhead
        self.load_lines: tuple[LogLine, ...] = ()  # its load prints nothing

    async def execute(self, items: list[Any]) -> BatchOutcome:
        b, s = self.backend, self.spec
        cfg = Config(len(items), s.vcpus, s.gpu_share)
        stage = s.stage_path.split(":", 1)[1]
        exec_ms = b.profile.latency_ms(stage, cfg, s.hardware, "mean")
        cold = b.profile.cold_start_ms(stage, s.hardware) if self.fresh else 0.0
        self.fresh = False
        await b.clock.sleep_until(b.clock.t + (cold + 0.0 + exec_ms))  # the simulator's sum, in its order
        return BatchOutcome(True, [x + 1 for x in items], exec_ms)

    async def stop(self) -> None:
        return None


class FakeBackend:
    """The case's nodes and devices; workers whose loads and batches take the profile's times on the clock."""

    def __init__(self, case: Case, clock: VirtualClock) -> None:
        snap = case.cluster.snapshot()
        self._nodes, self._devices = snap.nodes, snap.devices
        self.profile: LatencyProfile = case.load_profile()
        self.clock = clock
        self.pool: Pool | None = None

    def nodes(self) -> tuple[Node, ...]:
        return self._nodes

    def devices(self) -> tuple[Device, ...]:
        return self._devices

    async def start(self, spec: WorkerSpec) -> _Handle:
        assert self.pool is not None
        prewarm = self.pool.core.fleet.workers[spec.worker_id].starting is not None
        if prewarm:  # a start with no batch: loading takes the cold start (a batch's start counts it itself)
            stage = spec.stage_path.split(":", 1)[1]
            await self.clock.sleep_until(self.clock.t + self.profile.cold_start_ms(stage, spec.hardware))
        return _Handle(self, spec, prewarm)

    async def close(self) -> None:
        return None


def run_pool(
    case: Case, arrivals: list[tuple[float, str]], errors: list[BaseException] | None = None
) -> tuple[Pool, dict[str, float | None]]:
    """The case's arrivals through a live pool on the virtual clock; the pool (closed) and each request's end.

    ``errors`` collects the exceptions the failed calls raised in the caller.
    """
    clock = VirtualClock()
    backend = FakeBackend(case, clock)
    pool = Pool(case.load_profile(), case.prices, case.scheduler, case.settings, backend, clock=clock)  # type: ignore[arg-type]
    backend.pool = pool
    workflows = case.workflow_map()
    decls = {n: WorkflowDecl(n, wf.slo_ms, tuple(wf.edges)) for n, wf in workflows.items()}
    ends: dict[str, float | None] = {}
    state: dict[str, Any] = {"arrived": 0, "open": 0}

    def submit(rid: str, wf: Workflow, stage: str, pending: dict[str, int], exits: list[int]) -> None:
        preds = tuple(f"{rid}:{p}" for p in wf.predecessors(stage))
        call = StageCall(
            f"{rid}:{stage}",
            stage,
            f"stages:{stage}",
            decls[wf.name],
            rid,
            rid,
            0,
            input_size=1.0,
            task_run_id=f"{rid}:{stage}",
            upstream=preds,
        )
        pool.submit(call).add_done_callback(lambda f: done(f, rid, wf, stage, pending, exits))

    def done(
        f: concurrent.futures.Future[StageResult],
        rid: str,
        wf: Workflow,
        stage: str,
        pending: dict[str, int],
        exits: list[int],
    ) -> None:
        if f.exception() is not None:
            if errors is not None:
                errors.append(f.exception())  # type: ignore[arg-type]
            if rid not in ends:
                ends[rid] = None
                state["open"] -= 1
            return
        if rid in ends:
            return
        if stage in wf.exits:
            exits[0] -= 1
            if exits[0] == 0:
                ends[rid] = clock.t
                state["open"] -= 1
                return
        for nxt in wf.successors(stage):
            pending[nxt] -= 1
            if pending[nxt] == 0:
                submit(rid, wf, nxt, pending, exits)

    def arrive(name: str) -> None:
        state["arrived"] += 1
        state["open"] += 1
        rid, wf = f"r{state['arrived']}", workflows[name]
        pending = {s: len(wf.predecessors(s)) for s in wf.stages}
        exits = [len(wf.exits)]
        for s in wf.entries:
            submit(rid, wf, s, pending, exits)

    def finished(t: float) -> bool:  # the simulator's end of a run, checked where it checks it
        if state["arrived"] < len(arrivals) or state["open"] or pool.core.flights:
            return False
        if any(w.starting is not None for w in pool.core.fleet.workers.values()):
            return False
        pool.core.fleet.retire_idle(t)
        return True

    def stuck() -> str:  # on the pool's loop: the core's queues read directly, not through a snapshot
        waiting = {str(k): len(q.jobs) for k, q in pool.core.queues.items() if q.jobs}
        return f"scheduler {case.scheduler!r} left calls waiting in {waiting or 'no queue'}"

    async def drive() -> None:
        for t, name in arrivals:
            clock.call_at(t, arrive, name)
        last = arrivals[-1][0] if arrivals else 0.0
        await clock.run(finished, last + case.sim.drain_s * 1000.0, stuck)  # the simulator's own end of a run

    loop = pool._ensure_started()
    try:
        asyncio.run_coroutine_threadsafe(drive(), loop).result(300)
    finally:
        pool.close()
    return pool, ends


def conformance_case(scheduler: str) -> Case:
    """Two workflows (a chain and a fork-join) on one node with two T4s, 3 s of Poisson arrivals."""
    dag = Workflow(
        "fan",
        ("resnet50", "bert-base", "transformer-xl"),
        (("resnet50", "bert-base"), ("resnet50", "transformer-xl")),
        400.0,
    )
    chain = Workflow.chain("classify", ["resnet50", "resnext101"], 150.0)
    case = tiny_case(scheduler, [chain, dag])
    sim = SimSpec(service_time="mean", interference_per_corunner=0.0, round_interval_ms=0.0)
    # No online latency correction: the simulated platform's times are the profile's (the correction
    # is the runtime's answer to a platform that is not).
    return replace(case, sim=sim, duration_s=3.0, settings=replace(case.settings, correction_alpha=0.0))


@pytest.mark.parametrize("scheduler", scheduler_names())
def test_pool_and_simulator_make_identical_decisions(scheduler: str) -> None:
    case = conformance_case(scheduler)
    arrivals = list(case.arrivals(case.seed))
    sim = simulate(case, arrivals=arrivals)
    pool, ends = run_pool(case, arrivals)
    core = pool.core
    assert len(sim.batches) > 20  # a case with something to decide
    assert list(core.fleet.batches) == list(sim.batches)
    assert list(core.fleet.idles) == list(sim.idles)
    assert list(core.decisions) == list(sim.decisions)
    assert ends == {r.request_id: r.finish_ms for r in sim.requests}
    assert (core.rounds, core.fleet.cold_starts, core.prewarms) == (sim.rounds, sim.cold_starts, sim.prewarm_starts)


def test_a_scheduler_that_strands_calls_fails_naming_them_not_by_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    from esg_prefect.scheduling.base import SchedulingResult
    from esg_prefect.scheduling.baselines import FaSTGShareScheduler

    # A broken scheduler: it never dispatches. The pool's ticks go on; the virtual clock's limit ends the run.
    monkeypatch.setattr(FaSTGShareScheduler, "decide", lambda self, snapshot, now_ms: SchedulingResult((), (), (), ()))
    case = conformance_case("fast-gshare")
    with pytest.raises(AssertionError, match=r"scheduler 'fast-gshare' left calls waiting in \{'classify/resnet50'"):
        run_pool(case, list(case.arrivals(case.seed))[:5])


def test_shared_batches_are_the_same_in_pool_and_simulator() -> None:
    # Both workflows run resnet50: with share_batches its batches mix them, in the pool as in the simulator.
    case = conformance_case("esg")
    case = replace(case, settings=replace(case.settings, share_batches=True))
    arrivals = list(case.arrivals(case.seed))
    sim = simulate(case, arrivals=arrivals)
    pool, ends = run_pool(case, arrivals)
    runs = {r.request_id: r.workflow for r in sim.requests}
    mixed = [b for b in sim.batches if len({runs[i.request_id] for i in b.items}) > 1]
    assert mixed  # the case exercises it
    assert list(pool.core.fleet.batches) == list(sim.batches)
    assert list(pool.core.decisions) == list(sim.decisions)
    assert ends == {r.request_id: r.finish_ms for r in sim.requests}


def test_shedding_is_the_same_in_pool_and_simulator() -> None:
    # Ten times the conformance case's rate: calls that wait past twice their SLO fail, in both drivers.
    case = conformance_case("esg")
    case = replace(
        case,
        duration_s=1.0,
        workload=replace(case.workload, rate_per_s=400.0),
        settings=replace(case.settings, shed_after_slo=2.0),
    )
    arrivals = list(case.arrivals(case.seed))
    sim = simulate(case, arrivals=arrivals)
    errors: list[BaseException] = []
    pool, ends = run_pool(case, arrivals, errors)
    shed = [r for r in sim.requests if r.finish_ms is None]
    assert len(shed) > len(sim.requests) / 10  # the case sheds
    assert ends == {r.request_id: r.finish_ms for r in sim.requests}
    assert list(pool.core.fleet.batches) == list(sim.batches)
    assert errors and all(isinstance(e, StageRejectedError) for e in errors)
    assert all(str(e).startswith("shed: request ") and "shed_after_slo=2 x its" in str(e) for e in errors)


def _cpu_case(scheduler: str, idle_vcpus: bool) -> Case:
    """One 4-vCPU node, no GPU, a two-stage chain with 10 ms cold starts; idle vCPUs billed or not (``idle_vcpus``)."""
    settings = replace(SETTINGS, keep_alive_s=10.0, idle_vcpus=idle_vcpus, correction_alpha=0.0)
    base = conformance_case(scheduler)
    cluster = ClusterSpec((NodeSpec("n0", 4, ()),))
    base = replace(base, workflows=(CHAIN,), profile=COLD_PROFILE, prices=PriceSheet(1e-5, {}), cluster=cluster)
    return replace(base, settings=settings, duration_s=8.0)


@pytest.mark.parametrize("scheduler", ["esg", "triton", "infless"])
def test_a_worker_whose_idle_time_is_free_keeps_its_window_in_pool_and_simulator(scheduler: str) -> None:
    # Bursts of 12 calls every second. With idle vCPUs unbilled a CPU worker's idle time is free, so neither the
    # gaps' histogram nor scale-down stops it early: fewer cold starts than when its idle time is billed, the
    # same in both drivers.
    arrivals = [(1000.0 * k + 0.5 * i, "wf") for k in range(8) for i in range(12)]
    colds: dict[bool, int] = {}
    for idle_vcpus in (True, False):
        case = _cpu_case(scheduler, idle_vcpus)
        sim = simulate(case, arrivals=arrivals)
        pool, ends = run_pool(case, arrivals)
        assert list(pool.core.fleet.batches) == list(sim.batches)
        assert list(pool.core.fleet.idles) == list(sim.idles)
        assert ends == {r.request_id: r.finish_ms for r in sim.requests}
        assert pool.core.fleet.cold_starts == sim.cold_starts
        colds[idle_vcpus] = sim.cold_starts
    assert colds[False] <= colds[True]
    if scheduler == "esg":
        assert (colds[True], colds[False]) == (16, 5)
