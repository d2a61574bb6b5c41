"""Shared batches (``share_batches``): one stage's batch carries other workflows' waiting calls, times by hand."""

from __future__ import annotations

import collections
from dataclasses import replace

import pytest

from esg_prefect.control.core import Core
from esg_prefect.control.events import BatchFinished, CallArrived, StartBatch
from esg_prefect.control.fleet import Fleet
from esg_prefect.exceptions import ConfigError
from esg_prefect.model import Job, LatencyProfile, PriceSheet, ProfilePoint, QueueKey, Workflow, cpu_cluster
from esg_prefect.model.cluster import Node
from esg_prefect.model.config import Config, ConfigSpace
from esg_prefect.model.size_model import SizeModel, SizeSample
from esg_prefect.scheduling import ESGScheduler, ESGSettings
from esg_prefect.scheduling.base import QueueState, Snapshot
from esg_prefect.scheduling.sharing import SharedBatches
from esg_prefect.scheduling.tables import CandidateTables, Choice
from esg_prefect.simulator.run import simulate
from esg_prefect.simulator.standard import standard_case

# Stage "m" on one vCPU: 10 + 2b ms for a batch of b.
PROFILE = LatencyProfile([ProfilePoint("m", "cpu", b, 1, 0.0, 10.0 + 2 * b) for b in (1, 2, 4)])
SPACE = ConfigSpace((1, 2, 4), (1,), (0.0,))
WFS = {"a": Workflow.chain("a", ["m"], 100.0), "b": Workflow.chain("b", ["m"], 100.0)}
QA, QB = QueueKey("a", "m"), QueueKey("b", "m")


def job(q: QueueKey, i: int, deadline: float, node: str | None = None) -> Job:
    return Job(f"{q.workflow}{i}", f"{q.workflow}-r{i}", f"{q.workflow}-run{i}", q, 0.0, 0.0, deadline, deadline, node)


def esg(share: bool = True) -> ESGScheduler:
    return ESGScheduler(PROFILE, PriceSheet(1e-5, {}), ESGSettings(config_space=SPACE, share_batches=share))


def test_a_dispatch_carries_another_workflows_waiting_call_of_its_stage() -> None:
    # b's call is due first and goes alone at batch 1 (12 ms) with 18 ms to spare; a's call rides
    # at batch 2 (14 ms), well inside both deadlines: one batch, one worker, instead of two.
    snapshot = Snapshot(
        (QueueState(QA, (job(QA, 0, 100.0),)), QueueState(QB, (job(QB, 0, 30.0),))), cpu_cluster(1, 2), WFS
    )
    res = esg().decide(snapshot, 0.0)
    assert [(d.queue, d.job_ids, d.config.batch, d.predicted_ms) for d in res.dispatches] == [
        (QB, ("b0", "a0"), 2, 14.0)
    ]
    off = esg(share=False).decide(snapshot, 0.0)
    assert [(d.queue, d.job_ids) for d in off.dispatches] == [(QB, ("b0",)), (QA, ("a0",))]


def test_no_call_rides_when_the_larger_batch_would_break_the_dispatching_plan() -> None:
    # b's call has 12.5 ms: its batch 1 takes 12, batch 2 would take 14.
    snapshot = Snapshot(
        (QueueState(QA, (job(QA, 0, 100.0),)), QueueState(QB, (job(QB, 0, 12.5),))), cpu_cluster(1, 2), WFS
    )
    res = esg().decide(snapshot, 0.0)
    assert [(d.queue, d.job_ids) for d in res.dispatches] == [(QB, ("b0",)), (QA, ("a0",))]


# Stage "enc" has a size model (2 ms per item plus 0.1 ms per unit of size, typical item 100), "m" none.
ENC_SIZES = SizeModel.fit(
    [SizeSample("enc", "cpu", b, 1, 0.0, b * z, 2.0 * b + 0.1 * b * z) for b in (1, 2, 4) for z in (50.0, 100.0, 150.0)]
)
SIZED = LatencyProfile(
    [*PROFILE.points, *(ProfilePoint("enc", "cpu", b, 1, 0.0, 12.0 * b) for b in (1, 2, 4))], sizes=ENC_SIZES
)
QC, QD = QueueKey("c", "enc"), QueueKey("d", "enc")


def test_a_stage_packing_re_sizes_keeps_its_batches_and_the_others_share() -> None:
    wfs = {**WFS, "c": Workflow.chain("c", ["enc"], 100.0), "d": Workflow.chain("d", ["enc"], 100.0)}
    short = [replace(job(QC, i, 30.0), input_size=25.0) for i in range(2)]
    queues = (
        QueueState(QA, (job(QA, 0, 100.0),)),
        QueueState(QB, (job(QB, 0, 30.0),)),
        QueueState(QC, tuple(short)),
        QueueState(QD, (replace(job(QD, 0, 100.0), input_size=25.0),)),
    )
    snapshot = Snapshot(queues, cpu_cluster(1, 4), wfs)

    def decide(**knobs: bool) -> list[tuple[QueueKey, tuple[str, ...], float]]:
        sched = ESGScheduler(SIZED, PriceSheet(1e-5, {}), ESGSettings(config_space=SPACE, **knobs))
        return sorted((d.queue, d.job_ids, d.predicted_ms) for d in sched.decide(snapshot, 0.0).dispatches)

    # "m" has no size fit: a's call rides b's batch. "enc" is packed: c's two short calls take 9 ms
    # (24 for typical ones), and d's call, which a shared batch would take, goes on its own.
    assert decide(share_batches=True) == [
        (QB, ("b0", "a0"), 14.0),
        (QC, ("c0", "c1"), pytest.approx(9.0)),
        (QD, ("d0",), pytest.approx(4.5)),
    ]
    # Without packing, "enc" is shared too, at the table's count-only latencies: d's call rides c's first batch.
    assert decide(share_batches=True, size_aware=False) == [
        (QB, ("b0", "a0"), 14.0),
        (QC, ("c0", "d0"), 24.0),
        (QC, ("c1",), 12.0),
    ]


def tables() -> CandidateTables:
    return CandidateTables(PROFILE, PriceSheet(1e-5, {}), ESGSettings(config_space=SPACE))


def test_a_call_rides_only_inside_its_own_deadline_on_the_batchs_node_and_under_the_largest_batch() -> None:
    shared = SharedBatches(tables(), max_batch=4)
    primary = [job(QB, 0, 100.0, "n0")]
    riders = [job(QA, 0, 13.0, "n0"), job(QA, 1, 50.0, "n1"), job(QA, 2, 60.0, "n0"), job(QA, 3, 70.0, "n0")]
    riders += [job(QA, 4, 80.0, "n0"), job(QA, 5, 90.0, "n0")]
    shared.begin({QB: primary, QA: riders})
    c = Choice("m", Config(1, 1, 0.0), "cpu", 12.0)
    grown, batch = shared.top_up(QB, c, primary, room_ms=80.0, now_ms=0.0)
    # a0 is due before batch 2 would end (14 ms), a1's input is on another node, batch 4 is the largest.
    assert [j.job_id for j in batch] == ["b0", "a2", "a3", "a4"]
    assert grown.config == Config(4, 1, 0.0) and grown.latency_ms == pytest.approx(18.0)
    # The room the plan left bounds the added latency (batch 2 adds 2 ms, batch 3 adds 4).
    same, alone = shared.top_up(QB, c, primary, room_ms=1.0, now_ms=0.0)
    assert same is c and alone == primary
    two, batch2 = shared.top_up(QB, c, primary, room_ms=3.0, now_ms=0.0)
    assert [j.job_id for j in batch2] == ["b0", "a2"] and two.latency_ms == pytest.approx(14.0)
    # A cold start on the choice counts against each rider's deadline.
    cold = Choice("m", Config(1, 1, 0.0), "cpu", 12.0 + 55.0, cold=True)
    _, batch3 = shared.top_up(QB, cold, primary, room_ms=80.0, now_ms=0.0)
    # a2 (60 ms) cannot wait for batch 2's 69 ms; a3 (70) rides; a third call would end at 71, after a3's deadline.
    assert [j.job_id for j in batch3] == ["b0", "a3"]


def test_calls_taken_leave_the_rest_of_the_round() -> None:
    shared = SharedBatches(tables(), max_batch=4)
    shared.begin({QB: [job(QB, 0, 100.0)], QA: [job(QA, 0, 100.0), job(QA, 1, 100.0)]})
    shared.dispatched([job(QA, 0, 100.0)])
    assert [j.job_id for j in shared.free(QA)] == ["a1"]


# ---- through the core ---------------------------------------------------------------------------


def make_core() -> Core:
    settings = ESGSettings(config_space=SPACE, share_batches=True, keep_alive_s=1.0)
    sched = ESGScheduler(PROFILE, PriceSheet(1e-5, {}), settings)
    fleet = Fleet((Node("n0", 2, max_workers=4),), (), 1000.0)
    return Core(sched, sched.tables, fleet, settings.platform, dict(WFS))


def test_the_core_runs_a_shared_batch_and_sends_each_call_back_to_its_own_queue() -> None:
    core = make_core()
    core.arrive(CallArrived("a0", "ra", "run-a", "a", "m", 0.0))
    core.arrive(CallArrived("b0", "rb", "run-b", "b", "m", 0.0))
    (start,) = [a for a in core.settle(0.0) if isinstance(a, StartBatch)]
    assert sorted(j.job_id for j in start.jobs) == ["a0", "b0"] and core.waiting == 0
    assert all(not q.jobs for q in core.queues.values())
    # The worker dies: each call goes back to the queue of its own workflow.
    core.finished(BatchFinished(start.batch_id, 5.0, requeue=("a0", "b0"), lost=True))
    assert {str(k): list(q.jobs) for k, q in core.queues.items()} == {"a/m": ["a0"], "b/m": ["b0"]}
    assert core.waiting == 2
    (again,) = [a for a in core.settle(5.0) if isinstance(a, StartBatch)]
    core.finished(BatchFinished(again.batch_id, 30.0))
    # Each record keeps the workflow of its call; the batch is billed to both runs.
    assert sorted((r.job_id, r.workflow) for r in core.stage_records) == [("a0", "a"), ("b0", "b")]
    assert sorted(i.run_id for i in core.fleet.batches[-1].items) == ["run-a", "run-b"]


def test_share_batches_must_be_a_bool() -> None:
    with pytest.raises(ConfigError, match="share_batches must be a bool, got 'yes'"):
        ESGSettings(share_batches="yes")  # type: ignore[arg-type]


# ---- in the simulator ---------------------------------------------------------------------------


def test_the_standard_case_mixes_workflows_in_batches_and_answers_every_call_once() -> None:
    base = standard_case("esg", duration_s=6.0, warmup_s=2.0)
    stages = {w.name: set(w.stages) for w in base.workflows}
    on = simulate(base.with_(settings=replace(base.settings, share_batches=True)))
    off = simulate(base)
    for run in (on, off):
        per_job = collections.Counter(r.job_id for r in run.stages)
        assert per_job and max(per_job.values()) == 1  # no call answered twice
        done: dict[str, set[str]] = collections.defaultdict(set)
        for r in run.stages:
            done[r.request_id].add(r.stage)
        finished = [q for q in run.requests if q.finish_ms is not None]
        assert len(finished) == len(run.requests)  # nothing lost
        assert all(done[q.request_id] == stages[q.workflow] for q in finished)

    def mixed(run: object) -> int:
        workflows: dict[str, set[str]] = collections.defaultdict(set)
        for r in run.stages:  # type: ignore[attr-defined]
            workflows[r.batch_id].add(r.workflow)
        return sum(len(w) > 1 for w in workflows.values())

    assert mixed(on) > 0 and mixed(off) == 0
    assert len(on.requests) == len(off.requests)  # the same arrivals
