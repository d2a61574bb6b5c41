"""One cost figure per flow run, the same everywhere (``docs/decisions/one-cost.md``).

A run's cost is its share of the busy time of its batches plus its share of
the warm idle time they caused (idle goes to the batch that ended just before
it on its worker; a worker's idle time before its first batch goes to that
batch; only a worker that never ran a batch leaves idle time on the separate
line). Here: a live pool (fake backend, a clock the test moves) whose per-run
costs in the cost store add up to its whole bill and equal what its artifacts
say, published only once each run's cost is final, and at the pool's close for
those still pending. The definition worked by hand, the same figure from the
linear grouping, the simulator's report and the live ledger:
tests/test_one_cost_definition.py.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
import json
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from esg_prefect.control.calls import StageCall, StageResult, WorkflowDecl
from esg_prefect.control.records import RunRecords
from esg_prefect.integration.artifacts import RunPublisher, _money, publish_run, run_summary, run_table
from esg_prefect.integration.run_views import money_text
from esg_prefect.model import LatencyProfile, PriceSheet, ProfilePoint
from esg_prefect.model.attribution import attribute_costs, idle_cost
from esg_prefect.model.cluster import Device, Node
from esg_prefect.runtime.batch_output import LogLine
from esg_prefect.runtime.pool import Pool, PoolClock
from esg_prefect.runtime.pool_records import final_records
from esg_prefect.runtime.workers import BatchOutcome, WorkerSpec
from esg_prefect.scheduling import (
    ESGSettings,
    register_scheduler,
)
from esg_prefect.store import CostStore, attach_store
from esg_prefect.store.attach import StoreAttachment
from tests.test_pool import _PrewarmFirst
from tests.toy_calls import flow_call
from tests.toy_stages import toy_profile

# ---- a live pool on a clock the test moves -------------------------------------------------------


class _Timer:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock(PoolClock):
    """Time that moves only when the test (or a fake batch) moves it; due timers then fire on the pool's loop."""

    deterministic = True

    def __init__(self, start_ms: float = 1.7e12) -> None:
        self.t = start_ms
        self._lock = threading.Lock()
        self._timers: list[tuple[float, int, _Timer, Callable[..., object], tuple[object, ...]]] = []
        self._seq = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    def now(self) -> float:
        return self.t

    def call_at(self, t_ms: float, callback: Callable[..., object], *args: object) -> _Timer:
        self._loop = asyncio.get_running_loop()
        timer = _Timer()
        with self._lock:
            self._seq += 1
            heapq.heappush(self._timers, (t_ms, self._seq, timer, callback, args))
        self._loop.call_soon(self._fire)
        return timer

    def call_soon(self, callback: Callable[[], object]) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.call_soon(callback)

    def advance(self, ms: float) -> None:
        """Move time on (from any thread); timers now due fire on the loop."""
        with self._lock:
            self.t += ms
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._fire)

    def _fire(self) -> None:
        while True:
            with self._lock:
                if not self._timers or self._timers[0][0] > self.t:
                    return
                _, _, timer, callback, args = heapq.heappop(self._timers)
            if not timer.cancelled:
                callback(*args)


class _Handle:
    def __init__(self, clock: ManualClock, spec: WorkerSpec) -> None:
        self.clock, self.spec = clock, spec
        self.load_ms = 5.0  # what FakeBackend.start takes on the clock
        self.enforcement = "fake (test clock)"
        self.out_of_process = False  # its batches take exactly their time on the clock: no overhead
        self.load_lines: tuple[LogLine, ...] = ()  # its load prints nothing

    async def execute(self, items: list[Any]) -> BatchOutcome:
        ms = 10.0 + 2.0 * len(items)
        self.clock.advance(ms)  # the batch takes its time on the test's clock
        return BatchOutcome(True, [x + 1 for x in items], ms)

    async def stop(self) -> None:
        return None


class FakeBackend:
    """One node (with a T4 if asked); workers load in 5 ms and run a batch of n in 10 + 2n ms, on the test's clock."""

    def __init__(self, clock: ManualClock, gpu: bool = False) -> None:
        self.clock = clock
        self.gpu = gpu

    def nodes(self) -> tuple[Node, ...]:
        return (Node("node", 64, 64),)

    def devices(self) -> tuple[Device, ...]:
        return (Device("node/gpu0", "node", "T4"),) if self.gpu else ()

    async def start(self, spec: WorkerSpec) -> _Handle:
        self.clock.advance(5.0)
        return _Handle(self.clock, spec)

    async def close(self) -> None:
        return None


class FakeClient:
    """What the publisher would send to Prefect: the artifacts it creates."""

    def __init__(self) -> None:
        self.created: list[Any] = []
        self.tags: dict[str, list[str]] = {}  # flow run id -> its tags, as the publisher set them
        self._lock = threading.Lock()

    def create_artifact(self, artifact: Any) -> Any:
        with self._lock:
            self.created.append(artifact)
        return SimpleNamespace(id=uuid.uuid4())

    def read_flow_run(self, flow_run_id: Any) -> Any:
        """A flow run with no tags of its own."""
        return SimpleNamespace(id=flow_run_id, tags=self.tags.get(str(flow_run_id), []))

    def update_flow_run(self, flow_run_id: Any, tags: list[str]) -> None:
        with self._lock:
            self.tags[str(flow_run_id)] = list(tags)

    def sent(self) -> dict[str, dict[str, Any]]:
        """Per flow run: its table rows and markdown."""
        out: dict[str, dict[str, Any]] = {}
        with self._lock:
            for a in self.created:
                run = out.setdefault(str(a.flow_run_id), {})
                run["table" if a.type == "table" else "markdown"] = json.loads(a.data) if a.type == "table" else a.data
        return out


def _t4_profile() -> LatencyProfile:
    """The toy stages on half a T4 only (an idle worker then holds a share, so its idle time costs)."""
    points = [
        ProfilePoint(stage, "T4", b, v, 0.5, (5.0 + 0.5 * b) / (1.5 if v == 2 else 1.0))
        for stage in ("double", "inc")
        for v in (1, 2)
        for b in (1, 2, 4, 8, 16, 32)
    ]
    return LatencyProfile(points, {(stage, "T4"): 20.0 for stage in ("double", "inc")})


def _results(clock: ManualClock, futs: Sequence[concurrent.futures.Future[StageResult]]) -> list[StageResult]:
    """Wait for the calls, moving the clock on a millisecond at a time if they wait for a timer."""
    for _ in range(5_000):
        done, _ = concurrent.futures.wait(futs, timeout=0.02)
        if len(done) == len(futs):
            return [f.result() for f in futs]
        clock.advance(1.0)
    raise AssertionError("calls did not finish")


def _run_flows(pool: Pool, clock: ManualClock, runs: list[str]) -> None:
    """Each run: double then inc, the runs' calls together (so they share batches); then end the runs."""
    firsts = _results(clock, [pool.submit(flow_call("double", r, i)) for i, r in enumerate(runs)])
    _results(clock, [pool.submit(flow_call("inc", r, res.output)) for r, res in zip(runs, firsts, strict=True)])
    for r in runs:
        pool.end_run(r)


def _wait_for(condition: Callable[[], bool], clock: ManualClock | None = None, step_ms: float = 0.0) -> None:
    """Wait until ``condition()`` holds (moving the clock on by ``step_ms`` each time); fail after 60 s."""
    give_up = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < give_up, "condition not met"
        if clock is not None and step_ms:
            clock.advance(step_ms)
        time.sleep(0.02)


def _whole_bill(pool: Pool) -> tuple[float, float]:
    """The pool's whole bill (every worker billed busy + idle at its rate) and the idle of never-used workers."""
    final = final_records(pool)
    assert final is not None
    batches, idles = final
    used = {b.worker_id for b in batches}
    bill = sum(pool.prices.batch_cost(b.config, b.hardware, b.duration_ms) for b in batches)
    bill += sum(idle_cost(i, pool.prices) for i in idles)
    never = sum(idle_cost(i, pool.prices) for i in idles if i.worker_id not in used)
    return bill, never


def wired_t4_pool(
    clock: ManualClock, store: CostStore, settings: ESGSettings
) -> tuple[Pool, FakeClient, list[RunRecords], StoreAttachment]:
    """A pool of fake half-T4 workers on ``clock``, its runs' costs stored in ``store`` and published to a fake API.

    Half-T4 workers: their warm idle time costs (the share's price), so the runs' idle parts are not
    zero. Returns the pool, the fake API, the runs as published, and the store's attachment.
    """
    pool = Pool(_t4_profile(), PriceSheet(1e-5, {"T4": 1e-4}), settings=settings,
                backend=FakeBackend(clock, gpu=True), clock=clock)  # type: ignore[arg-type]  # fmt: skip
    client = FakeClient()
    published: list[RunRecords] = []

    def publish(records: RunRecords) -> None:
        published.append(records)
        publish_run(records, client)  # type: ignore[arg-type]

    attachment = attach_store(pool, store)
    publisher = RunPublisher(pool, publish=publish, on_idles=attachment.store_idles, poll=False)
    pool.add_run_listener(publisher)
    pool.add_batch_listener(publisher.on_batches)
    return pool, client, published, attachment


@pytest.fixture
def store(tmp_path: Path) -> Iterator[CostStore]:
    s = CostStore(f"sqlite:///{tmp_path / 'costs.db'}")
    yield s
    s.close()


def test_live_runs_cost_the_whole_bill_and_their_artifacts_say_what_the_store_says(store: CostStore) -> None:
    clock = ManualClock()
    pool, client, settled, _ = wired_t4_pool(clock, store, ESGSettings(wait_for_batch=False))
    waves = [[str(uuid.uuid4()) for _ in range(5)] for _ in range(3)]
    try:
        for wave in waves:
            _run_flows(pool, clock, wave)
            clock.advance(5_000.0)  # the workers idle warm, within their 60 s keep-alive, then serve the next wave
        # The last wave's batches are followed by open idle time: none of its runs is published yet.
        _wait_for(lambda: store.costs("run")[-1].idle and len(store.costs("run")) == 16)
        time.sleep(0.05)
        # Earlier waves' runs are published as the next wave's batches run on their warm workers.
        _wait_for(lambda: len(settled) > 0)
        early = {r.run_id for r in settled}
        assert all(r.settled for r in settled)
        live = final_records(pool)
        assert live is not None
        closed_before = list(live[1])  # the idle intervals closed while the pool ran
    finally:
        pool.close()  # the idle time closes: the store and the publisher write what was pending
    # A run published before the close had the idle time after each batch of its closed before it:
    # a later batch on the same worker (most are the earlier waves'; a wave whose calls came apart on
    # a loaded machine can hold such runs too), or the worker stopped (a surplus worker such a wave
    # started goes once the load no longer needs it); the last batch of a live worker kept its runs
    # until the close.
    done = final_records(pool)
    assert done is not None
    batches = done[0]
    for run_id in early:
        mine = [b for b in batches if any(i.run_id == run_id for i in b.items)]
        assert mine and all(
            any(o.worker_id == b.worker_id and o.start_ms >= b.end_ms and o is not b for o in batches)
            or any(i.worker_id == b.worker_id and i.start_ms >= b.end_ms for i in closed_before)
            for b in mine
        ), run_id
    runs = [r for wave in waves for r in wave]
    assert sorted(r.run_id for r in settled) == sorted(runs)  # each run published once
    rows = {r.key: r for r in store.costs("run")}
    line = rows.pop("(unattributed idle)")
    bill, never_used = _whole_bill(pool)
    assert set(rows) == set(runs)
    assert any(len(b.items) > 1 for b in final_records(pool)[0])  # type: ignore[index]  # runs shared batches
    assert math.isclose(sum(r.cost for r in rows.values()) + line.cost, bill, rel_tol=1e-9)
    assert line.cost == pytest.approx(never_used, rel=1e-9, abs=1e-18)
    if never_used == 0.0:  # every worker ran a batch: the runs alone are the whole bill
        assert math.isclose(sum(r.cost for r in rows.values()), bill, rel_tol=1e-9)
    assert any(r.idle_cost > 0 for r in rows.values()) and all(r.unit == "$" for r in rows.values())
    sent = client.sent()
    for rec in settled:
        row = rows[rec.run_id]
        cost = rec.cost()
        assert cost.total == pytest.approx(row.cost, rel=1e-9)
        assert (cost.busy, cost.idle) == (pytest.approx(row.busy_cost, rel=1e-9), pytest.approx(row.idle_cost))
        total = sent[rec.run_id]["table"][-1]
        assert total == run_table(rec)[-1]
        assert (total["cost $"], total["busy $"], total["idle $"]) == (
            _money(row.cost),
            _money(row.busy_cost),
            _money(row.idle_cost),
        )
        summary = sent[rec.run_id]["markdown"]
        assert summary == run_summary(rec)
        cost_line = (
            f"**Cost**: ${money_text(row.cost)} (busy ${money_text(row.busy_cost)} + idle ${money_text(row.idle_cost)})"
        )
        assert cost_line in summary
        assert client.tags[rec.run_id][0] == f"esg:${money_text(row.cost)}"  # the runs list shows the same figure
        assert "Final: the idle time after each of its batches has closed" in summary


def test_artifacts_wait_for_the_cost_to_settle_and_pending_ones_are_flushed_at_close(store: CostStore) -> None:
    register_scheduler("one-cost-prewarm", lambda *a: _PrewarmFirst(predicted_ms=12.0), "test only", replace=True)
    clock = ManualClock()
    pool = Pool(toy_profile(), PriceSheet(1e-5, {}), scheduler="one-cost-prewarm",
                backend=FakeBackend(clock), clock=clock)  # type: ignore[arg-type]  # fmt: skip
    published: dict[str, RunRecords] = {}
    lock = threading.Lock()

    def publish(records: RunRecords) -> None:
        with lock:
            published[records.run_id] = records

    def seen() -> set[str]:
        with lock:
            return set(published)

    attachment = attach_store(pool, store)
    publisher = RunPublisher(pool, publish=publish, on_idles=attachment.store_idles, grace_ms=100.0)
    pool.add_run_listener(publisher)
    pool.add_batch_listener(publisher.on_batches)
    r1, r2, r3 = (str(uuid.uuid4()) for _ in range(3))
    inc = WorkflowDecl("inc-only", 5000, ())
    try:
        # r1: its call waits for a pre-warmed worker, then runs on it (b1); the worker idles after it.
        _results(clock, [pool.submit(StageCall("c1", "inc", "x:inc", inc, r1, r1, 1))])
        pool.end_run(r1)
        clock.advance(1_000.0)
        time.sleep(0.1)
        assert seen() == set()  # the idle time after b1 is open: r1's cost is not final
        # r2 runs on the same warm worker (b2): the idle after b1 has closed, r1 is published.
        _results(clock, [pool.submit(StageCall("c2", "inc", "x:inc", inc, r2, r2, 2))])
        pool.end_run(r2)
        _wait_for(lambda: r1 in seen())
        assert r2 not in seen()
        # The pool goes quiet: the worker's keep-alive runs out; the publisher finds that in a snapshot.
        clock.advance(60_000.0)
        _wait_for(lambda: r2 in seen(), clock, 100.0)
        # r3 starts a new worker (pre-warmed again) and ends; the pool closes before its keep-alive is out.
        _results(clock, [pool.submit(StageCall("c3", "inc", "x:inc", inc, r3, r3, 3))])
        pool.end_run(r3)
        time.sleep(0.1)
        assert r3 not in seen()
    finally:
        pool.close()
    assert seen() == {r1, r2, r3}  # r3 was published during the close
    final = final_records(pool)
    assert final is not None
    batches, idles = final
    ref = attribute_costs(batches, idles, pool.prices)
    assert ref.idle_unattributed == 0.0  # each worker's pre-warm idle time went to its first batch
    lead = [i for i in idles if i.start_ms < min(b.start_ms for b in batches if b.worker_id == i.worker_id)]
    assert len(lead) == 2
    rows = {r.key: r for r in store.costs("run") if not r.idle}
    for run in (r1, r2, r3):
        rec = published[run]
        assert rec.settled and rec.cost().total == pytest.approx(ref.per_run[run], rel=1e-9)
        assert rows[run].cost == pytest.approx(ref.per_run[run], rel=1e-9)
    assert any(i in lead for i in published[r1].caused_idles)  # r1 paid for the warm worker it used first
    assert math.isclose(sum(ref.per_run.values()), _whole_bill(pool)[0], rel_tol=1e-9)


AT_EXIT = """
import json, sys, uuid
from esg_prefect.control.calls import StageCall, WorkflowDecl
from esg_prefect.integration import artifacts, recording
from esg_prefect.model import LatencyProfile, PriceSheet, ProfilePoint
from esg_prefect.model.cluster import Device
from esg_prefect.runtime.pool import Pool
from esg_prefect.runtime.workers import InlineBackend

out, url = sys.argv[1], sys.argv[2]

def publish_run(records, client=None):  # stands in for the Prefect API
    cost = records.cost()
    with open(out, "a") as f:
        f.write(json.dumps([records.run_id, records.settled, cost.total, cost.idle]) + "\\n")

class T4Inline(InlineBackend):  # a T4 to place half-T4 workers on: their idle time costs the share's price
    def devices(self):
        return (Device("inline/gpu0", self.nodes()[0].name, "T4"),)

stages = ("double", "inc")
points = [ProfilePoint(s, "T4", b, 1, 0.5, 5.0 + 0.5 * b) for s in stages for b in (1, 2, 4, 8)]
profile = LatencyProfile(points, {(s, "T4"): 20.0 for s in stages})
artifacts.publish_run = publish_run
pool = Pool(profile, PriceSheet(1e-5, {"T4": 1e-4}), backend=T4Inline(vcpus=2))
recording.attach_recorders(pool, artifacts=True, store=url)
run = str(uuid.uuid4())
toy = WorkflowDecl("toy", 800, (("double", "inc"),))
x = pool.submit(StageCall("c1", "double", "tests.toy_stages:double", toy, run, run, 3)).result(30).output
pool.submit(StageCall("c2", "inc", "tests.toy_stages:inc", toy, run, run, x)).result(30)
pool.end_run(run)
print(run)
# The script ends with the pool open and its workers idle: the run's cost settles at interpreter exit.
"""


def test_a_run_pending_at_interpreter_exit_is_still_published_and_stored(tmp_path: Path) -> None:
    import subprocess
    import sys

    out, url = tmp_path / "published.jsonl", f"sqlite:///{tmp_path / 'exit.db'}"
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", AT_EXIT, str(out), url], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    run = done.stdout.split()[-1]
    ((run_id, settled, total, idle),) = [json.loads(line) for line in out.read_text().splitlines()]
    assert (run_id, settled) == (run, True) and idle > 0
    with CostStore(url) as s:
        (row,) = [r for r in s.costs("run") if not r.idle]
    assert row.key == run and row.cost == pytest.approx(total, rel=1e-9)
    assert row.idle_cost == pytest.approx(idle, rel=1e-9)
