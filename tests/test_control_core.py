"""The control core on its own: events in, actions out, no clock, no loop, times worked by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from esg_prefect.control.core import Core
from esg_prefect.control.events import (
    BatchFinished,
    CallArrived,
    FailJobs,
    StartBatch,
    StartWorker,
    StopWorker,
    Tick,
    WakeAt,
    WorkerReady,
)
from esg_prefect.control.fleet import Fleet
from esg_prefect.control.state import home_node
from esg_prefect.exceptions import InvalidInputError
from esg_prefect.model import LatencyProfile, PriceSheet, ProfilePoint, Workflow
from esg_prefect.model.cluster import Node
from esg_prefect.model.config import Config, ConfigSpace
from esg_prefect.scheduling import ESGSettings
from esg_prefect.scheduling.base import Dispatch, Placement, Reject, SchedulingResult, Snapshot, Start
from esg_prefect.scheduling.tables import CandidateTables

KEEP_MS = 1000.0
CHAIN = Workflow.chain("wf", ["a", "b"], 500.0)
PROFILE = LatencyProfile([ProfilePoint(s, "cpu", b, 1, 0.0, 10.0 + b, 10.0 + b) for s in ("a", "b") for b in (1, 2, 4)])
SETTINGS = ESGSettings(config_space=ConfigSpace((1, 2, 4), (1,), (0.0,)), tick_ms=5.0, keep_alive_s=KEEP_MS / 1000)


class Simple:
    """Every waiting queue as one batch: on an idle worker of its stage, else a new one (or as told)."""

    name = "simple"

    def __init__(self) -> None:
        self.reject: set[str] = set()  # stages whose jobs are rejected
        self.prewarm: set[str] = set()  # stages that get a pre-warm start instead of a dispatch
        self.bogus = False  # dispatch a job that is not waiting
        self.hold: set[str] = set()  # stages whose jobs are left waiting
        self.retire: tuple[str, ...] = ()  # workers to stop at the next round (then forgotten)

    def decide(self, snapshot: Snapshot, now_ms: float) -> SchedulingResult:
        dispatches, rejects, starts = [], [], []
        for q in snapshot.queues:
            ids = tuple(j.job_id for j in q.jobs)
            if q.key.stage in self.hold:
                continue
            if q.key.stage in self.reject:
                rejects.append(Reject(q.key, ids[:1], "too late"))
                continue
            if q.key.stage in self.prewarm:
                self.prewarm.discard(q.key.stage)
                starts.append(Start(q.key, Config(1, 1, 0.0), "cpu", Placement("n0", None, None, 4), "warm up"))
                continue
            if self.bogus:
                ids = ("nobody",)
            idle = [w for w in snapshot.cluster.workers if w.stage == q.key.stage and not w.busy]
            wid = idle[0].worker_id if idle else None
            cfg = Config(len(ids), 1, 0.0)
            dispatches.append(Dispatch(q.key, ids, cfg, "cpu", Placement("n0", None, wid, 1), 10.0 + len(ids)))
        retire, self.retire = self.retire, ()
        return SchedulingResult(tuple(dispatches), (), tuple(rejects), (), tuple(starts), retire)


def make_core(**kw: object) -> tuple[Core, Simple]:
    sched = Simple()
    fleet = Fleet((Node("n0", 4, max_workers=8),), (), KEEP_MS)
    tables = CandidateTables(PROFILE, PriceSheet(1e-5, {}), SETTINGS)
    return Core(sched, tables, fleet, SETTINGS.platform, {"wf": CHAIN}, **kw), sched  # type: ignore[arg-type]


def call(job: str, t: float, stage: str = "a", req: str = "r1", **kw: object) -> CallArrived:
    return CallArrived(job, req, req, "wf", stage, t, **kw)  # type: ignore[arg-type]


def stops(actions: list[object]) -> list[object]:
    return [a for a in actions if isinstance(a, StopWorker)]


def kinds(actions: list[object]) -> list[str]:
    return [type(a).__name__ for a in actions]


def test_a_call_is_dispatched_at_the_next_tick_and_its_worker_expires_on_time() -> None:
    core, _ = make_core()
    assert core.on(call("j1", 0.0)) == []  # events change state; a tick returns the actions
    (start,) = core.on(Tick(0.0))
    assert isinstance(start, StartBatch) and start.cold and [j.job_id for j in start.jobs] == ["j1"]
    assert start.worker.as_worker().free_at_ms == 11.0  # now + the dispatch's predicted time
    core.on(BatchFinished(start.batch_id, 12.0))
    assert start.worker.as_worker().free_at_ms is None
    assert core.on(Tick(12.0)) == [WakeAt(12.0 + KEEP_MS)]  # the keep-alive's end
    assert core.on(Tick(500.0)) == []
    assert core.on(Tick(1012.0)) == [StopWorker("w1", 1012.0)]
    fleet = core.fleet
    assert [(b.start_ms, b.end_ms) for b in fleet.batches] == [(0.0, 12.0)]
    assert [(i.start_ms, i.end_ms) for i in fleet.idles] == [(12.0, 1012.0)]
    assert core.stage_records[0].end_ms == 12.0 and core.requests["r1"].open == 0


def test_a_warm_worker_is_reused_and_its_old_expiry_no_longer_holds() -> None:
    core, _ = make_core()
    core.arrive(call("j1", 0.0))
    (a1,) = core.settle(0.0)
    core.finished(BatchFinished(a1.batch_id, 12.0))  # type: ignore[union-attr]
    assert core.settle(12.0) == [WakeAt(1012.0)]
    core.arrive(call("j2", 800.0, req="r2"))
    (a2,) = core.settle(800.0)
    assert isinstance(a2, StartBatch) and not a2.cold and a2.worker.worker_id == "w1"
    core.finished(BatchFinished(a2.batch_id, 811.0))
    assert core.settle(811.0) == []  # the wake-up at 1012 is pending and comes first
    assert core.settle(1012.0) == [WakeAt(1811.0)]  # nothing expired: w1 was used since
    assert core.settle(1811.0) == [StopWorker("w1", 1811.0)]
    assert [(i.start_ms, i.end_ms) for i in core.fleet.idles] == [(12.0, 800.0), (811.0, 1811.0)]


def test_a_reject_fails_the_requests_other_queued_calls_too() -> None:
    core, sched = make_core()
    sched.reject.add("a")
    core.arrive(call("j1", 0.0))
    core.arrive(call("j2", 0.0, stage="b"))  # the same request, another queue (as a fork would)
    sched.reject.add("b")
    actions = core.settle(0.0)
    (fail,) = [a for a in actions if isinstance(a, FailJobs)]
    assert sorted(j.job_id for j in fail.jobs) == ["j1", "j2"] and fail.reason == "too late"
    assert core.waiting == 0 and core.requests["r1"].failed and core.requests["r1"].open == 0


def test_calls_waiting_past_shed_after_slo_fail_with_their_request_and_no_other() -> None:
    core, sched = make_core()
    core.settings = replace(SETTINGS, shed_after_slo=2.0).platform  # CHAIN's SLO is 500 ms: shed after 1 s
    sched.hold.update(("a", "b"))
    core.arrive(call("j1", 0.0))
    core.arrive(call("j1b", 0.0, stage="b"))  # the same request in another queue (a fork)
    core.arrive(call("j2", 600.0, req="r2"))
    assert not [a for a in core.settle(1000.0) if isinstance(a, FailJobs)]  # at 1,000 ms: not past yet
    actions = core.settle(1005.0)  # the next round (tick_ms 5)
    (fail,) = [a for a in actions if isinstance(a, FailJobs)]
    assert sorted(j.job_id for j in fail.jobs) == ["j1", "j1b"]
    assert fail.reason == (
        "shed: request r1 still queued 1005 ms after it arrived, past shed_after_slo=2 x its 500 ms SLO"
    )
    assert core.requests["r1"].failed and not core.requests["r2"].failed and core.waiting == 1
    assert not [a for a in core.settle(1600.0) if isinstance(a, FailJobs)]
    (late,) = [a for a in core.settle(1605.0) if isinstance(a, FailJobs)]
    assert [j.job_id for j in late.jobs] == ["j2"] and core.waiting == 0


def test_a_request_failed_by_a_stage_error_still_has_its_waiting_calls_shed() -> None:
    core, sched = make_core()
    core.settings = replace(SETTINGS, shed_after_slo=2.0).platform
    sched.hold.add("b")
    core.arrive(call("j1", 0.0))
    core.arrive(call("j1b", 0.0, stage="b"))  # the same request's other call, held
    (start,) = [a for a in core.settle(0.0) if isinstance(a, StartBatch)]
    core.finished(BatchFinished(start.batch_id, 12.0, failed=frozenset({"j1"})))  # its stage raised
    assert core.requests["r1"].failed and core.waiting == 1
    (fail,) = [a for a in core.settle(1005.0) if isinstance(a, FailJobs)]
    assert [j.job_id for j in fail.jobs] == ["j1b"] and fail.reason.startswith("shed: request r1")
    assert core.waiting == 0


def test_with_shedding_off_a_call_waits_as_long_as_it_takes() -> None:
    core, sched = make_core()
    sched.hold.add("a")
    core.arrive(call("j1", 0.0))
    assert not [a for a in core.settle(60_000.0) if isinstance(a, FailJobs)] and core.waiting == 1
    sched.hold.clear()
    (start,) = [a for a in core.settle(60_010.0) if isinstance(a, StartBatch)]
    assert [j.job_id for j in start.jobs] == ["j1"]


def test_requeued_jobs_go_back_to_the_front_of_their_queue() -> None:
    core, _ = make_core()
    core.arrive(call("j1", 0.0))
    core.arrive(call("j2", 0.0, req="r2"))
    (a1,) = core.settle(0.0)
    core.arrive(call("j3", 1.0, req="r3"))
    core.finished(BatchFinished(a1.batch_id, 5.0, requeue=("j2",), lost=True))  # type: ignore[union-attr]
    assert core.fleet.workers == {} and core.waiting == 2
    actions = core.settle(5.0)
    (a2,) = [a for a in actions if isinstance(a, StartBatch)]
    assert [j.job_id for j in a2.jobs] == ["j2", "j3"] and a2.cold  # first back, first served; a new worker
    assert [[i.request_id for i in b.items] for b in core.fleet.batches] == [["r1", "r2"]]  # billed to its death


def test_pause_holds_rounds_and_a_round_interval_spaces_them() -> None:
    core, _ = make_core(round_interval_ms=1.0)
    core.paused = True
    core.arrive(call("j1", 0.0))
    assert core.settle(0.0) == [] and core.waiting == 1
    core.paused = False
    assert kinds(core.settle(0.2)) == ["StartBatch"]
    core.arrive(call("j2", 0.5, req="r2"))
    assert core.settle(0.5) == [WakeAt(1.2)]  # not before round_interval_ms after the last round
    assert core.tick_due(1.2)
    assert kinds(core.settle(1.2)) == ["StartBatch"]


def test_a_prewarm_start_bills_its_load_as_idle_time() -> None:
    core, sched = make_core()
    sched.prewarm.add("a")
    core.arrive(call("j1", 0.0))
    actions = core.settle(0.0)
    (start,) = [a for a in actions if isinstance(a, StartWorker)]
    assert start.worker.starting == 0.0 and core.prewarms == 1
    core.on(WorkerReady(start.worker.worker_id, 40.0))
    assert start.worker.fresh and start.worker.as_worker().fresh  # warm, no batch run yet
    (batch,) = [a for a in core.settle(40.0) if isinstance(a, StartBatch)]
    assert not batch.cold and batch.worker is start.worker and not start.worker.fresh
    assert [(i.start_ms, i.end_ms) for i in core.fleet.idles] == [(0.0, 40.0)]


def test_a_retired_worker_stops_at_the_round_and_its_keep_alive_no_longer_holds() -> None:
    """Two workers of the last stage (the second call comes while the first runs); w2 is retired at 100 ms."""
    core, sched = make_core()
    core.arrive(call("j1", 0.0, stage="b"))
    (b1,) = core.settle(0.0)
    core.arrive(call("j2", 5.0, stage="b", req="r2"))
    (b2,) = core.settle(5.0)  # w1 is busy: a second worker
    assert isinstance(b1, StartBatch) and isinstance(b2, StartBatch)
    assert (b1.worker.worker_id, b2.worker.worker_id) == ("w1", "w2")
    core.finished(BatchFinished(b1.batch_id, 12.0))
    core.finished(BatchFinished(b2.batch_id, 17.0))
    core.settle(17.0)  # both idle: w1 expires at 1012, w2 at 1017
    sched.retire, sched.hold = ("w2",), {"a"}  # a round runs while a call waits (held, so no worker takes it)
    core.arrive(call("j3", 100.0, req="r3"))
    assert stops(core.settle(100.0)) == [StopWorker("w2", 100.0)]
    assert sorted(core.fleet.workers) == ["w1"]
    assert [(i.worker_id, i.start_ms, i.end_ms) for i in core.fleet.idles] == [("w2", 17.0, 100.0)]  # billed to 100
    assert stops(core.settle(1012.0)) == [StopWorker("w1", 1012.0)]
    assert stops(core.settle(1017.0)) == []  # w2's expiry went with it


def test_a_scheduler_that_retires_a_busy_or_unknown_worker_is_refused() -> None:
    core, sched = make_core()
    core.arrive(call("j1", 0.0))
    core.settle(0.0)  # w1 runs j1 until 11 ms
    sched.hold.add("a")
    for wid, what in (("w1", "busy"), ("w9", "unknown")):
        sched.retire = (wid,)
        core.arrive(call(f"j-{wid}", 5.0, req=f"r-{wid}"))  # a round runs while a call waits
        with pytest.raises(InvalidInputError, match=f"retires worker '{wid}', which is {what}"):
            core.settle(5.0)


def test_a_scheduler_that_dispatches_a_job_not_waiting_is_refused() -> None:
    core, sched = make_core()
    sched.bogus = True
    core.arrive(call("j1", 0.0))
    with pytest.raises(InvalidInputError, match="dispatched job 'nobody'"):
        core.settle(0.0)


def test_the_hop_after_an_upstream_result_is_reserved_and_its_node_is_home() -> None:
    core, _ = make_core()
    core.arrive(call("a1", 0.0, task_run_id="t-a1"))
    (s1,) = core.settle(0.0)
    core.finished(BatchFinished(s1.batch_id, 12.0))  # type: ignore[union-attr]
    plain = core.arrive(call("b0", 112.0, stage="b", req="r0"))  # no upstream: no reserve
    job = core.arrive(call("b1", 112.0, stage="b", upstream=("t-a1",)))
    hop = core.hop_ms("wf")
    assert hop == pytest.approx(200.0)  # the first hop of 100 ms, plus twice its first deviation (half of it)
    assert job.input_node == "n0" and plain.input_node is None
    # b is the last stage: one hop reserved for the end of the flow run.
    assert job.e2e_deadline_ms == pytest.approx(500.0 - hop)
    assert home_node(["n1", "n0", "n1"]) == "n1" and home_node(["n1", "n0"]) == "n0" and home_node([]) is None


def test_unknown_workflows_and_bad_stages_are_refused_before_any_state_changes() -> None:
    core, _ = make_core()
    with pytest.raises(KeyError):
        core.arrive(CallArrived("j", "r", "r", "nope", "a", 0.0))
    assert core.requests == {} and core.waiting == 0
