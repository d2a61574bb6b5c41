"""The pool without Prefect: batching across runs, poison inputs, crashes, idempotency, records."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from esg_prefect.control.calls import StageCall, StageResult, WorkflowDecl
from esg_prefect.exceptions import (
    InvalidInputError,
    PoolClosedError,
    StageFailedError,
    StageRejectedError,
    WorkerCrashedError,
)
from esg_prefect.model import ConfigSpace, PriceSheet, attribute_costs
from esg_prefect.model.cluster import Device
from esg_prefect.model.config import Config
from esg_prefect.model.jobs import QueueKey
from esg_prefect.runtime.pool import Pool
from esg_prefect.runtime.workers import InlineBackend, LocalProcessBackend
from esg_prefect.scheduling import (
    Dispatch,
    ESGSettings,
    Hold,
    Placement,
    SchedulingResult,
    Snapshot,
    Start,
    register_scheduler,
)
from esg_prefect.scheduling.esg import ESGScheduler
from tests.toy_calls import PRICES, TOY, toy_call, toy_pool
from tests.toy_stages import CRASH, HANG, POISON, UNPICKLABLE, FakeClock, settle, toy_profile, wait_until


def call(i: int, stage: str = "inc", run: str | None = None, call_id: str | None = None) -> StageCall:
    """Call ``i`` of ``stage``: id ``{stage}-{i}``, run ``run{i}``, unless given."""
    return toy_call(i, stage, call_id=call_id or f"{stage}-{i}", run=run or f"run{i}")


@pytest.fixture
def inline_pool() -> Iterator[Pool]:
    """A toy pool on 2 vCPUs."""
    with toy_pool(vcpus=2) as pool:
        yield pool


def test_calls_of_many_runs_share_batches(inline_pool: Pool) -> None:
    items = [i for i in range(41) if i != POISON * 2]
    futs = [inline_pool.submit(call(i)) for i in items]
    results = settle(futs)
    assert [r.output for r in results if isinstance(r, StageResult)] == [i + 1 for i in items]
    sizes = [r.batch_size for r in results if isinstance(r, StageResult)]
    assert max(sizes) > 1  # batched
    mixed = [r for r in results if isinstance(r, StageResult) and r.co_batched_runs > 1]
    assert mixed, "some batch should hold calls of several runs"
    snap = inline_pool.snapshot()
    assert sum(len(b.items) for b in snap.batches) == 40  # every call ran exactly once
    assert len({c.call_id for c in snap.calls}) == 40 and all(c.ok for c in snap.calls)


def test_a_paused_pool_queues_calls_and_releases_them_together(inline_pool: Pool) -> None:
    """While paused nothing runs and nothing is failed; on resume the calls that queued (one per run)
    go out in shared batches, each exactly once."""
    assert inline_pool.submit(call(0)).result(30).output == 1  # a warm worker, so the pause is the only hold
    inline_pool.pause()
    inline_pool.pause()  # idempotent
    assert inline_pool.paused
    futs = [inline_pool.submit(call(i)) for i in range(1, 9)]
    time.sleep(0.3)  # many controller ticks
    assert not any(f.done() for f in futs)
    snap = inline_pool.snapshot()
    assert snap.queue_depths == {"toy/inc": 8} and snap.queues == {QueueKey("toy", "inc"): 8}
    inline_pool.resume()
    assert not inline_pool.paused
    results = settle(futs)
    assert [r.output for r in results if isinstance(r, StageResult)] == list(range(2, 10))
    assert max(r.batch_size for r in results if isinstance(r, StageResult)) >= 4
    assert all(r.co_batched_runs == r.batch_size for r in results if isinstance(r, StageResult))
    assert sum(len(b.items) for b in inline_pool.snapshot().batches) == 9  # every call ran exactly once


def test_pausing_a_closed_pool_is_refused() -> None:
    pool = Pool(toy_profile(), PRICES, backend=InlineBackend())
    pool.close()
    with pytest.raises(PoolClosedError, match="closed"):
        pool.pause()
    with pytest.raises(PoolClosedError, match="closed"):
        pool.resume()


def test_poison_input_fails_only_its_own_call(inline_pool: Pool) -> None:
    items = [*range(27, 43), POISON * 2]  # 26 is the poison for 'inc'
    futs = [inline_pool.submit(call(i)) for i in items]
    results = settle(futs)
    for i, r in zip(items, results, strict=True):
        if i == POISON * 2:
            assert isinstance(r, StageFailedError)
            assert r.error_type == "ValueError" and "poison input 26" in str(r) and "Traceback" in r.remote_traceback
            assert "In the stage's worker" in r.__notes__[0] and "toy_stages.py" in r.__notes__[0]  # shown in logs
        else:
            assert isinstance(r, StageResult) and r.output == i + 1


def test_duplicate_call_id_is_run_once(inline_pool: Pool) -> None:
    first = inline_pool.submit(call(5, call_id="same"))
    second = inline_pool.submit(call(5, call_id="same"))
    assert first.result(30).output == second.result(30).output == 6
    third = inline_pool.submit(call(5, call_id="same"))  # after completion: the stored result
    assert third.result(30).batch_id == first.result().batch_id
    assert sum(len(b.items) for b in inline_pool.snapshot().batches) == 1


def test_unprofiled_stage_is_rejected_with_its_name(inline_pool: Pool) -> None:
    decl = WorkflowDecl("other", 1000)
    bad = StageCall("c1", "mystery", "tests.toy_stages:double", decl, "r", "r", 1)
    with pytest.raises(StageRejectedError, match="'mystery'"):
        inline_pool.submit(bad).result(30)


def test_closed_pool_fails_new_calls() -> None:
    pool = Pool(toy_profile(), PRICES, backend=InlineBackend())
    assert pool.submit(call(1)).result(30).output == 2
    pool.close()
    with pytest.raises(PoolClosedError):
        pool.submit(call(2)).result(60)


def test_costs_attributed_to_runs_add_up_to_worker_time(inline_pool: Pool) -> None:
    futs = [inline_pool.submit(call(i, run=f"run{i % 3}", call_id=f"c{i}")) for i in range(30) if i != POISON * 2]
    settle(futs)
    time.sleep(0.05)  # some idle time on the warm workers
    snap = inline_pool.snapshot()
    report = attribute_costs(snap.batches, snap.idles, PRICES)
    busy = sum(PRICES.batch_cost(b.config, b.hardware, b.duration_ms) for b in snap.batches)
    # idle: the GPU share all along, the vCPUs only while a pre-warm load runs
    idle = sum(
        (
            i.gpu_share * PRICES.gpu_price_s(i.hardware) * (i.end_ms - i.start_ms)
            + i.vcpus * PRICES.price_per_vcpu_s * i.loading_ms
        )
        / 1000
        for i in snap.idles
    )
    assert snap.idles  # the warm workers idled; on these CPU workers only a pre-warm load of theirs is billed
    assert set(report.per_run) == {"run0", "run1", "run2"}
    assert math.isclose(sum(report.per_run.values()) + report.idle_unattributed, busy + idle, rel_tol=1e-9)


def test_learned_workflow_edges_come_from_upstream_calls() -> None:
    pool = Pool(toy_profile(), PRICES, backend=InlineBackend())
    decl = WorkflowDecl("learned", 800)
    try:
        a = StageCall("a1", "first", "tests.toy_stages:first", decl, "r1", "r1", 1, task_run_id="t-a1")
        assert pool.submit(a).result(30).output == 10
        b = StageCall("b1", "second", "tests.toy_stages:second", decl, "r1", "r1", 10, upstream=("t-a1",))
        assert pool.submit(b).result(30).output == 11
        wf = pool._registry.current()["learned"]
        assert wf.edges == (("first", "second"),) and wf.entries == ("first",)
    finally:
        pool.close()


# ---- real worker processes ---------------------------------------------------------------------


@pytest.fixture
def process_pool() -> Pool:
    settings = ESGSettings(wait_for_batch=False)
    pool = Pool(toy_profile(), PRICES, settings=settings, backend=LocalProcessBackend(vcpus=2, spares=0, preload=()))
    yield pool
    pool.close()


@pytest.mark.service
def test_worker_crash_requeues_others_and_fails_the_killer(process_pool: Pool) -> None:
    # CRASH*2 makes 'inc' call os._exit: its batch's other calls must complete, exactly once.
    items = [*range(50, 62), CRASH * 2]
    futs = [process_pool.submit(call(i)) for i in items]
    results = settle(futs, timeout=120)
    for i, r in zip(items, results, strict=True):
        if i == CRASH * 2:
            assert isinstance(r, WorkerCrashedError) and "died twice" in str(r)
            assert "exited with code 3" in str(r), r  # how it died, not "EOFError()"
        else:
            assert isinstance(r, StageResult) and r.output == i + 1, (i, r)
    snap = process_pool.snapshot()
    done = [c for c in snap.calls if c.ok]
    assert sorted(c.call_id for c in done) == sorted(f"inc-{i}" for i in items if i != CRASH * 2)


@pytest.mark.service
def test_a_call_that_never_returns_fails_alone_and_the_others_complete() -> None:
    # HANG*2 makes 'inc' sleep an hour: past the limit its worker is stopped, as if it had died; the
    # batch's other calls run again and complete, and the hanging input, stuck twice alone, fails.
    backend = LocalProcessBackend(vcpus=2, spares=0, preload=())
    pool = Pool(toy_profile(), PRICES, settings=ESGSettings(wait_for_batch=False), backend=backend, hung_batch_s=2.0)
    try:
        items = [*range(90, 96), HANG * 2]
        results = settle([pool.submit(call(i)) for i in items], timeout=120)
    finally:
        pool.close()
    for i, r in zip(items, results, strict=True):
        if i == HANG * 2:
            assert isinstance(r, WorkerCrashedError) and "ran past its limit of 2 s" in str(r), r
        else:
            assert isinstance(r, StageResult) and r.output == i + 1, (i, r)
    with pytest.raises(InvalidInputError, match="hung_batch_s must be"):
        Pool(toy_profile(), PRICES, backend=InlineBackend(), hung_batch_s=0)


@pytest.mark.service
def test_what_cannot_pickle_fails_its_own_call_and_no_worker(
    process_pool: Pool, caplog: pytest.LogCaptureFixture
) -> None:
    # An output that cannot travel back (a lock) and an input that cannot travel there: each fails its
    # own call with the reason; the batch's other calls complete, and no worker dies for it.
    caplog.set_level("WARNING", logger="esg_prefect")
    items = [*range(70, 76), UNPICKLABLE * 2]
    futs = [process_pool.submit(call(i)) for i in items]
    lock_in = StageCall("lock-in", "inc", "tests.toy_stages:inc", TOY, "rl", "rl", threading.Lock())
    futs.append(process_pool.submit(lock_in))
    results = settle(futs, timeout=120)
    for i, r in zip(items, results[:-1], strict=True):
        if i == UNPICKLABLE * 2:
            assert isinstance(r, StageFailedError) and "outputs cannot be sent back to the pool" in str(r), r
        else:
            assert isinstance(r, StageResult) and r.output == i + 1, (i, r)
    assert isinstance(results[-1], StageFailedError) and "inputs cannot be sent to its worker" in str(results[-1])
    assert not any(isinstance(r, WorkerCrashedError) for r in results)
    assert process_pool.submit(call(80)).result(120).output == 81  # the workers still serve
    assert not [r.message for r in caplog.records if " lost (" in r.message]  # no worker died


@pytest.mark.service
def test_kill_9_mid_batch_loses_nothing(process_pool: Pool) -> None:
    # Warm a worker, then kill -9 it while it runs a batch of slow calls.
    assert process_pool.submit(call(1, stage="double")).result(120).output == 2
    futs = [process_pool.submit(call(i, stage="double", call_id=f"k{i}")) for i in range(100, 160)]
    killed = threading.Event()

    def killer() -> None:
        for _ in range(400):
            pids = process_pool.backend.pids()  # type: ignore[attr-defined]
            if pids and any(not f.done() for f in futs):
                os.kill(next(iter(pids.values())), signal.SIGKILL)
                killed.set()
                return
            time.sleep(0.005)

    t = threading.Thread(target=killer)
    t.start()
    results = settle(futs, timeout=120)
    t.join()
    assert killed.is_set()
    assert [r.output for r in results if isinstance(r, StageResult)] == [2 * i for i in range(100, 160)]
    ok_ids = [c.call_id for c in process_pool.snapshot().calls if c.ok and c.call_id.startswith("k")]
    assert len(ok_ids) == len(set(ok_ids)) == 60  # none lost, none delivered twice


@pytest.mark.parametrize(
    ("how", "named"),
    [
        ("1", r"exited while starting \(exit code 1\).*if __name__ == '__main__'"),
        ("signal", r"was killed while starting \(signal 15\)$"),  # no guard hint: not the script's fault
    ],
)
def test_a_worker_that_dies_while_starting_is_named_with_the_likely_cause(how: str, named: str) -> None:
    from esg_prefect.runtime.workers import WorkerLoadError

    backend = LocalProcessBackend(spares=0, preload=("tests.dies_on_import",), start_method="spawn")
    with pytest.raises(WorkerLoadError, match=named):
        backend._spawn({"DIE_ON_IMPORT": how})


def test_a_closing_backend_starts_no_spare_and_a_failed_spare_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import asyncio

    backend = LocalProcessBackend(spares=1, preload=("tests.dies_on_import",), start_method="spawn")
    backend._spawn = lambda env=None: LocalProcessBackend._spawn(backend, {"DIE_ON_IMPORT": "1"})  # type: ignore[method-assign]
    with caplog.at_level("WARNING", logger="esg_prefect.runtime.workers"):
        backend._refill_quietly()  # on a thread in the pool: must not raise there
    assert any("a spare worker process did not start" in r.getMessage() for r in caplog.records)
    asyncio.run(backend.close())
    backend._refill()
    assert backend._spares == []  # closed: nothing started


def test_process_backend_start_method_is_checked() -> None:
    with pytest.raises(InvalidInputError, match="'fork'"):
        LocalProcessBackend(start_method="fork", spares=0)


@pytest.mark.service
@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_process_backend_start_methods_run_calls(method: str) -> None:
    backend = LocalProcessBackend(vcpus=1, spares=0, preload=(), start_method=method)
    assert backend.start_method == method
    pool = Pool(toy_profile(), PRICES, settings=ESGSettings(wait_for_batch=False), backend=backend)
    try:
        assert [f.result(120).output for f in [pool.submit(call(i, call_id=f"{method}-{i}")) for i in (3, 4)]] == [4, 5]
    finally:
        pool.close()


def test_process_backend_defaults_to_the_fork_server_where_there_is_one() -> None:
    import multiprocessing as mp

    expected = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    assert LocalProcessBackend(spares=0).start_method == expected


def test_the_fork_server_starts_in_the_background_when_a_process_backend_is_made(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """So that the first cold start does not wait for its imports; never for spawn or inline, and a failure is quiet."""
    from esg_prefect.runtime import workers

    calls: list[str] = []
    done = threading.Event()

    def ensure_running() -> None:
        calls.append(threading.current_thread().name)
        done.set()
        raise OSError("no unix sockets here")

    monkeypatch.setattr(workers.forkserver, "ensure_running", ensure_running)
    caplog.set_level(logging.DEBUG, logger="esg_prefect.runtime.workers")
    InlineBackend()
    LocalProcessBackend(vcpus=1, spares=0, preload=(), start_method="spawn")
    assert calls == []
    LocalProcessBackend(vcpus=1, spares=0, preload=(), start_method="forkserver")
    assert done.wait(30) and calls == ["esg-forkserver-start"]
    assert wait_until(lambda: any("fork server did not start" in r.getMessage() for r in caplog.records))


def _chain_request(pool: Pool, r: int, pause_s: float, clock: FakeClock | None = None) -> None:
    """double -> (caller pauses) -> inc, as a flow run between two task runs would.

    With ``clock`` (the pool's), the pause moves that clock on instead of sleeping.
    """
    a = StageCall(f"d{r}", "double", "tests.toy_stages:double", TOY, f"q{r}", f"q{r}", r, task_run_id=f"t-d{r}")
    assert pool.submit(a).result(30).output == 2 * r
    if clock is not None:
        clock.advance(1000 * pause_s)
    else:
        time.sleep(pause_s)
    b = StageCall(f"i{r}", "inc", "tests.toy_stages:inc", TOY, f"q{r}", f"q{r}", 2 * r, upstream=(f"t-d{r}",))
    assert pool.submit(b).result(30).output == 2 * r + 1


def test_time_between_stages_is_measured_and_reserved() -> None:
    # On a clock that only the pauses move: the pool's own time is nil, whatever the machine's load.
    clock = FakeClock()
    settings = ESGSettings(wait_for_batch=False)
    pool = Pool(toy_profile(), PRICES, settings=settings, backend=InlineBackend(vcpus=2), clock=clock)
    try:
        for r in range(4):
            _chain_request(pool, r, 0.15, clock)
        wf = pool._registry.current()["toy"]
        hop = pool.core.hop_ms("toy")
        assert hop is not None and 150 <= hop < 600, hop  # the pause and a margin
        # double has one stage after it, plus the end of the run; inc only the end of the run.
        assert pool.core.reserve_ms(wf, "double") == pytest.approx(2 * hop)
        assert pool.core.reserve_ms(wf, "inc") == pytest.approx(hop)
    finally:
        pool.close()


def test_reserving_can_be_turned_off() -> None:
    settings = ESGSettings(wait_for_batch=False, reserve_overhead=False)
    pool = Pool(toy_profile(), PRICES, settings=settings, backend=InlineBackend(vcpus=2))
    try:
        for r in range(2):
            _chain_request(pool, r, 0.05)
        assert pool.core.hop_ms("toy") is None
        assert pool.core.reserve_ms(pool._registry.current()["toy"], "double") == 0.0
    finally:
        pool.close()


def test_pool_lowers_the_switch_interval_once_started_and_checks_it() -> None:
    import sys

    with pytest.raises(InvalidInputError, match="switch_interval_s"):
        Pool(toy_profile(), PRICES, backend=InlineBackend(), switch_interval_s=0.0)
    before = sys.getswitchinterval()
    pool = Pool(toy_profile(), PRICES, backend=InlineBackend(), switch_interval_s=0.002)
    try:
        assert sys.getswitchinterval() == before  # nothing changes until the pool starts
        assert pool.submit(call(1)).result(30).output == 2
        assert sys.getswitchinterval() == pytest.approx(min(before, 0.002))
    finally:
        pool.close()
        sys.setswitchinterval(before)


def test_hop_estimate_adds_a_margin_for_variable_hops() -> None:
    from esg_prefect.control.state import HopOverhead

    steady = HopOverhead(0.2)
    for _ in range(60):
        steady.observe(100.0)
    assert steady.ms == pytest.approx(100.0, abs=0.1)  # no variation left: no margin
    jumpy = HopOverhead(0.2)
    for k in range(60):
        jumpy.observe(50.0 if k % 2 else 150.0)
    assert jumpy.mean_ms == pytest.approx(100.0, abs=15.0)
    assert jumpy.ms is not None and jumpy.ms > jumpy.mean_ms + 2 * 40.0  # mean + 2 x deviation (~50)


def test_one_worker_gets_at_most_half_the_cores_by_default() -> None:
    """Batches are not preempted: with two or more cores, two batches can always run at once."""
    assert LocalProcessBackend(vcpus=2, spares=0).max_worker_vcpus == 1
    assert LocalProcessBackend(vcpus=8, spares=0).max_worker_vcpus == 4
    assert LocalProcessBackend(vcpus=1, spares=0).max_worker_vcpus == 1
    assert LocalProcessBackend(vcpus=8, spares=0, max_worker_vcpus=8).max_worker_vcpus == 8
    with pytest.raises(InvalidInputError, match="max_worker_vcpus"):
        LocalProcessBackend(max_worker_vcpus=0)
    pool = Pool(toy_profile(), PRICES, backend=LocalProcessBackend(vcpus=2, spares=0))
    assert pool.settings.config_space.vcpus == (1,)
    assert pool.settings.config_space.batches == ESGSettings().config_space.batches
    roomy = Pool(toy_profile(), PRICES, backend=LocalProcessBackend(vcpus=8, spares=0))
    assert roomy.settings.config_space.vcpus == (1, 2, 4)
    inline = Pool(toy_profile(), PRICES, backend=InlineBackend(vcpus=2))  # no cap: the space as given
    assert inline.settings.config_space.vcpus == ESGSettings().config_space.vcpus


def test_pool_runs_with_paldia_features_on() -> None:
    """The runtime pool drives the same scheduler hooks as the simulator: hardware selection and hybrid sharing."""
    settings = ESGSettings(hardware_selection=True, hybrid_sharing=True)
    pool = Pool(toy_profile(), PRICES, settings=settings, backend=InlineBackend(vcpus=2))
    try:
        items = [i for i in range(40) if i != POISON * 2]
        futs = []
        for i in items:  # arrivals 5 ms apart: the queue's rate estimate is the selector's load
            futs.append(pool.submit(call(i)))
            time.sleep(0.005)
        results = settle(futs)
        assert [r.output for r in results if isinstance(r, StageResult)] == [i + 1 for i in items]
        assert max(r.batch_size for r in results if isinstance(r, StageResult)) > 1
        esg = pool.scheduler
        assert isinstance(esg, ESGScheduler)
        assert esg._hardware is not None and esg._review is not None
        sel = esg._hardware.selection(QueueKey("toy", "inc"))
        assert sel is not None and sel.hardware == "cpu"  # the only type present, chosen from the observed load
    finally:
        pool.close()


class _PrewarmFirst:
    """A scheduler that starts a worker for a queue, holds its jobs until it is warm, then uses it."""

    name = "prewarm-first"

    def __init__(self, predicted_ms: float = 7.0) -> None:
        self.predicted_ms = predicted_ms  # what each dispatch predicts
        self.seen_starting: list[bool] = []  # the busy workers' ``starting`` flags, round after round

    def decide(self, snapshot: Snapshot, now_ms: float) -> SchedulingResult:
        holds, dispatches, starts = [], [], []
        for q in snapshot.queues:
            mine = [w for w in snapshot.cluster.workers if w.stage == q.key.stage]
            warm = [w for w in mine if not w.busy]
            self.seen_starting += [w.starting for w in mine if w.busy]
            if warm:
                w, jobs = warm[0], q.jobs[:4]
                placement = Placement(w.node, None, w.worker_id, 1)
                ids = tuple(j.job_id for j in jobs)
                dispatches.append(Dispatch(q.key, ids, Config(len(jobs), 1, 0.0), "cpu", placement, self.predicted_ms))
            elif mine:
                holds.append(Hold(q.key, "waiting for the worker"))
            else:
                node = snapshot.cluster.nodes[0].name
                starts.append(Start(q.key, Config(1, 1, 0.0), "cpu", Placement(node, None, None, 4), "test"))
                holds.append(Hold(q.key, "starting a worker"))
        return SchedulingResult(tuple(dispatches), tuple(holds), (), (), tuple(starts))


def test_a_prewarm_start_loads_a_worker_that_then_serves_warm() -> None:
    sched = _PrewarmFirst()
    register_scheduler("prewarm-first", lambda *a: sched, "test only", replace=True)
    pool = Pool(toy_profile(), PRICES, scheduler="prewarm-first", backend=InlineBackend(vcpus=2))
    try:
        heavy = WorkflowDecl("warmup", 5000, ())
        calls = [StageCall(f"h{i}", "heavy", "tests.toy_stages:heavy", heavy, f"r{i}", f"r{i}", i) for i in range(3)]
        results = settle([pool.submit(c) for c in calls])
        assert [r.output for r in results] == [1, 2, 3]  # type: ignore[union-attr]
        assert {(r.worker_id, r.cold_start) for r in results} == {("w1", False)}  # type: ignore[union-attr]
        snap = pool.snapshot()
    finally:
        pool.close()
    assert [w.worker_id for w in snap.workers] == ["w1"]
    # While it loaded, the scheduler saw it busy and starting (it may also have seen it busy running).
    assert sched.seen_starting[:1] == [True]
    # The load ran before the first batch and is billed as the worker's idle time from its start.
    first_batch = min(b.start_ms for b in snap.batches)
    assert snap.idles and snap.idles[0].worker_id == "w1" and snap.idles[0].start_ms < first_batch


class _TwoGPUTypes(InlineBackend):
    """Reports a T4 and an A100 (no stage here runs on them: only the keep-alive reads them)."""

    def devices(self) -> tuple[Device, ...]:
        node = self.nodes()[0].name
        return (Device(f"{node}/gpu0", node, "T4"), Device(f"{node}/gpu1", node, "A100"))


def test_keep_alive_by_price_per_hardware_type() -> None:
    settings = ESGSettings(keep_alive_s=10.0, keep_alive_by_price=True)
    pool = Pool(toy_profile(), PriceSheet.default(), settings=settings, backend=_TwoGPUTypes(vcpus=2))
    try:
        assert pool.keep_alive_ms() == {"cpu": 10_000.0, "T4": 10_000.0, "A100": pytest.approx(10_000.0 * 0.35 / 3.67)}
    finally:
        pool.close()
    assert ESGSettings().keep_alive_by_price  # the default
    flat = ESGSettings(keep_alive_s=10.0, keep_alive_by_price=False)
    plain = Pool(toy_profile(), PriceSheet.default(), settings=flat, backend=_TwoGPUTypes())
    try:
        assert plain.keep_alive_ms() == {"cpu": 10_000.0, "T4": 10_000.0, "A100": 10_000.0}
    finally:
        plain.close()
    # A GPU type the price sheet does not price (the toy profile covers neither GPU) keeps the whole
    # keep-alive: the knob is on by default, and such a machine must still serve.
    unpriced = Pool(toy_profile(), PriceSheet(1e-5, {"T4": 1e-4}), settings=settings, backend=_TwoGPUTypes(vcpus=2))
    try:
        assert unpriced.keep_alive_ms() == {"cpu": 10_000.0, "T4": 10_000.0, "A100": 10_000.0}
        assert unpriced.submit(call(3)).result(30).output == 4
    finally:
        unpriced.close()


@pytest.mark.service
def test_a_worker_exits_when_its_pool_process_is_killed(tmp_path: Path) -> None:
    # Before, a worker in the middle of a batch outlived a pool killed with SIGKILL, running on under
    # its fork server (which Python leaves running when the pool's process is killed).
    script = (
        "import asyncio, os\n"
        "from multiprocessing import forkserver\n"
        "from esg_prefect.runtime.workers import LocalProcessBackend, WorkerSpec\n"
        "async def main():\n"
        "    be = LocalProcessBackend(vcpus=1, spares=0, preload=())\n"
        "    handle = await be.start(WorkerSpec('w1', 'tests.toy_stages:inc', 'local', None, 'cpu', 1, 0.0))\n"
        "    print(handle.proc.pid, forkserver._forkserver._forkserver_pid, flush=True)\n"
        f"    asyncio.ensure_future(handle.execute([{HANG * 2}]))  # a batch that sleeps an hour\n"
        "    await asyncio.sleep(1.0)\n"
        "    os.kill(os.getpid(), 9)\n"
        "asyncio.run(main())\n"
    )
    out = tmp_path / "pids.txt"
    with out.open("w") as f:  # a file, not a pipe: the fork server keeps its end open
        subprocess.run([sys.executable, "-c", script], stdout=f, timeout=120, cwd=Path(__file__).parent.parent)
    worker, server = (int(x) for x in out.read_text().split())
    try:
        for _ in range(300):  # the worker checks on the pool's process every second
            try:
                os.kill(worker, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"worker {worker} outlived its pool process")
    finally:
        for pid in (worker, server):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_ten_batches_run_at_once() -> None:
    # Each batch in flight holds a thread of the pool loop's executor; asyncio's default (cores + 4) held
    # a 2-core machine to 6, and the barrier in 'meet' broke after 30 s.
    space = ConfigSpace((1,), (1,), (0.0,))
    settings = ESGSettings(config_space=space, wait_for_batch=False, prewarm=False)
    backend = InlineBackend(vcpus=16, max_workers=16)
    pool = Pool(toy_profile(), PRICES, "per-invocation", settings=settings, backend=backend)  # a worker per call
    decl = WorkflowDecl("together", 60_000)
    try:
        futs = [
            pool.submit(StageCall(f"m{i}", "meet", "tests.toy_stages:meet", decl, f"r{i}", f"r{i}", i))
            for i in range(10)
        ]
        assert [f.result(120).output for f in futs] == list(range(10))
    finally:
        pool.close()


def test_a_long_lived_pool_keeps_bounded_records(monkeypatch: pytest.MonkeyPatch) -> None:
    # Before, a pool kept every call record and every request it ever served, and each run's end scanned
    # them all (a service slowed 2-5x within 60,000 calls). Now: the newest RECORD_MEMORY of each.
    import esg_prefect.runtime.pool as pool_module

    monkeypatch.setattr(pool_module, "RECORD_MEMORY", 5)
    pool = Pool(toy_profile(), PRICES, backend=InlineBackend())
    try:
        for i in range(100, 130):
            assert pool.submit(call(i)).result(30).output == i + 1
            pool.end_run(f"run{i}")
        full, recent = pool.snapshot(), pool.snapshot(recent=3)
        core = pool.core
        assert len(full.requests) <= 5 and 5 <= len(full.calls) < 10  # trimmed in halves
        assert [c.call_id for c in full.calls][-1] == "inc-129"
        assert not core._run_requests and not pool._book._calls_of_run  # ended runs leave no index behind
        assert len(recent.calls) == len(recent.batches) == 3 and recent.requests == {}
        fleet = core.fleet  # batch and idle records: the newest kept, numbered among all of them
        assert len(fleet.batches) >= 30 and 5 <= len(list(fleet.batches)) < 10
        assert full.first_batch == fleet.batches.first > 0 and full.batches[-1] is fleet.batches[-1]  # type: ignore[union-attr]
        assert recent.first_batch == len(fleet.batches) - 3
        assert pool.report().overall.count <= 5  # reports read what is kept
    finally:
        pool.close()


def test_a_ring_answers_positions_as_a_list_would() -> None:
    from esg_prefect.control.ring import Ring

    ring: Ring[int] = Ring(keep=3)
    plain: list[int] = []
    for i in range(20):
        ring.append(i)
        plain.append(i)
        assert len(ring) == len(plain) and ring[-1] == plain[-1]
        assert ring[ring.first :] == plain[ring.first :] and ring[len(ring) - 2 :] == plain[-2:]
    assert 3 <= len(list(ring)) < 6 and ring[5:] == plain[ring.first :]  # a slice starts at the oldest kept
    with pytest.raises(IndexError, match="record 0 is not kept"):
        ring[0]


def test_at_info_the_pool_logs_each_batch_and_worker_start(inline_pool: Pool, caplog: pytest.LogCaptureFixture) -> None:
    """What an operator reads with `pool serve --log-level info`: one line per batch, naming its calls and time."""
    with caplog.at_level(logging.INFO, logger="esg_prefect.runtime.pool"):
        assert inline_pool.submit(call(1)).result(60).output == 2
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("batch b1:")]
    assert len(lines) == 1, caplog.records
    assert lines[0].startswith("batch b1: inc, 1 call(s) from 1 run(s) on worker w1 [cpu, share 0.00, ")
    assert ", cold start " in lines[0] and "(predicted " in lines[0]


def test_a_batch_function_with_one_output_per_batch_is_told_in_every_call_it_slowed(inline_pool: Pool) -> None:
    """Bisection makes each output right (alone, one output is one per input), and each call's log says why."""
    wf = WorkflowDecl("lumpy", 800, (), ("lumped",))
    calls = [
        StageCall(f"l{i}", "lumped", "tests.toy_stages:lumped", wf, f"r{i}", f"r{i}", i, profile_stage="inc")
        for i in range(6)
    ]
    assert inline_pool.submit(calls[0]).result(30).output == 1  # a warm worker, so the pause is the only hold
    inline_pool.pause()
    futs = [inline_pool.submit(c) for c in calls[1:]]
    assert wait_until(lambda: inline_pool.snapshot().queue_depths == {"lumpy/lumped": 5})
    inline_pool.resume()
    results = settle(futs)
    assert [r.output for r in results if isinstance(r, StageResult)] == [2, 3, 4, 5, 6]
    dispatched = max(len(b.items) for b in inline_pool.snapshot().batches)
    assert dispatched >= 2  # the core batched them; each ran alone in the end
    told = [r for r in results if isinstance(r, StageResult) and r.lines]
    assert told and all(r.batch_size == 1 for r in told)
    (level, name, text) = told[0].lines[0]
    assert level == logging.WARNING and name == "esg_prefect.runtime.execution"
    assert "stage 'lumped': a batch of" in text and "returned 1 output for" in text
    assert "it must return one output per input, in order" in text


def test_a_users_stage_planned_with_a_shipped_example_profile_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    """No profile given: the shipped profiles plan the example stages; a user's 'classify' gets a warning, once."""
    from esg_prefect.runtime.profiles import load_default_profile, warn_if_shipped

    shipped = load_default_profile()
    assert warn_if_shipped("classify", "esg_prefect.examples.pipelines:classify", "classify", shipped) is False
    assert warn_if_shipped("mine", "my.module:mine", "mine", shipped) is False  # not covered: refused later, by name
    pool = Pool(backend=InlineBackend())
    try:
        wf = WorkflowDecl("vision", 5_000, (), ("classify",))
        calls = [
            StageCall(f"v{i}", "classify", "tests.toy_stages:classify_vision", wf, f"r{i}", f"r{i}", i) for i in (1, 2)
        ]
        with caplog.at_level(logging.WARNING, logger="esg_prefect.runtime.profiles"):
            for c in calls:
                pool.submit(c).result(60)
    finally:
        pool.close()
    warned = [r.getMessage() for r in caplog.records if r.name == "esg_prefect.runtime.profiles"]
    assert warned == [
        "stage 'classify' (tests.toy_stages:classify_vision) is planned with the latency profile shipped for "
        "esg-prefect's example stage 'classify', not one of its own: profile it (`esg-prefect profile`) and pass "
        "the CSV (ESGTaskRunner(profile=...), pool serve --profile)"  # a service's operator gives --profile
    ]


@pytest.mark.parametrize("then", ["resume", "close"])
def test_a_future_its_caller_cancelled_holds_up_no_other_call(then: str) -> None:
    """A caller may cancel the future ``submit`` gave it (the service's task at its shutdown did): the
    other calls of the batch are answered, the pool closes, and a retry of the id joined to it ends too."""
    pool = Pool(toy_profile(), PRICES, backend=InlineBackend(vcpus=2))
    try:
        pool.pause()
        futs = [pool.submit(call(i)) for i in range(4)]
        assert wait_until(lambda: sum(pool.snapshot().queue_depths.values()) == 4)
        assert futs[0].cancel()
        joined = pool.submit(call(0))
        if then == "resume":
            pool.resume()
            assert [f.result(30).output for f in futs[1:]] == [2, 3, 4]
        else:
            pool.close()  # raised CancelledError, leaving the other calls unanswered
            assert all(isinstance(f.exception(30), PoolClosedError) for f in futs[1:])
        assert wait_until(joined.done)  # never left waiting: cancelled as its first, or refused by the close
        assert joined.cancelled() or isinstance(joined.exception(), PoolClosedError)
    finally:
        pool.close()


def test_a_closed_pool_answers_snapshots_and_reports_with_its_last_state() -> None:
    """Its loop has stopped: a snapshot (a metrics scrape, a report) used to wait out its timeout."""
    pool = Pool(toy_profile(), PRICES, backend=InlineBackend())
    assert pool.submit(call(1)).result(30).output == 2
    pool.close()
    snap = pool.snapshot(timeout_s=0.001)  # no loop to ask: an answer at once, not a TimeoutError
    assert [len(b.items) for b in snap.batches] == [1] and [c.call_id for c in snap.calls] == ["inc-1"]
    assert snap.totals is not None and snap.totals.calls == {"inc": 1}
    report = pool.report(timeout_s=0.001)
    assert report.overall.count == 1 and report.busy_cost > 0
