"""Lookahead starts (``lookahead_starts``): a batch going out starts the next stage's worker where it has none."""

from __future__ import annotations

from dataclasses import replace

import pytest

from esg_prefect.exceptions import ConfigError
from esg_prefect.model import (
    ClusterSnapshot,
    Config,
    ConfigSpace,
    Job,
    LatencyProfile,
    Node,
    PriceSheet,
    ProfilePoint,
    QueueKey,
    Worker,
    Workflow,
)
from esg_prefect.scheduling import ESGScheduler, ESGSettings, QueueState, Snapshot
from esg_prefect.simulator import simulate
from tests.test_conformance import conformance_case, run_pool

WF = Workflow.chain("w", ["a", "b"], slo_ms=200.0)
QA, QB = QueueKey("w", "a"), QueueKey("w", "b")


def sched(**settings: object) -> ESGScheduler:
    """Stage a: 10 ms on 1 vCPU. Stage b: 20 ms on 1 vCPU (2.0e-5 a job), 8 ms on 4 (3.2e-5). Cold starts 50 ms.

    b's part of the SLO is 200 x 8 / (10 + 8) = 88.9 ms: once warm, both kinds fit it; 1 vCPU is cheaper.
    """
    points = [
        ProfilePoint("a", "cpu", 1, 1, 0.0, 10.0),
        ProfilePoint("b", "cpu", 1, 1, 0.0, 20.0),
        ProfilePoint("b", "cpu", 1, 4, 0.0, 8.0),
    ]
    prof = LatencyProfile(points, {("a", "cpu"): 50.0, ("b", "cpu"): 50.0})
    space = ConfigSpace((1,), (1, 4), (0.0,))
    knobs = {"lookahead_starts": True, "prewarm": False, **settings}
    return ESGScheduler(prof, PriceSheet(1e-3, {}), ESGSettings(config_space=space, **knobs))  # type: ignore[arg-type]


def one_call(*workers: Worker, slots: int | None = None) -> Snapshot:
    """A call waiting at a; b's queue is listed (empty): b has had calls, so a worker for it can be loaded."""
    job = Job("a-j0", "r0", "run0", QA, 0.0, 0.0, 200.0, 200.0)
    cluster = ClusterSnapshot([Node("node0", 8, max_workers=slots)], [], list(workers))
    return Snapshot((QueueState(QA, (job,)), QueueState(QB, ())), cluster, {WF.name: WF})


def warm(wid: str, stage: str, vcpus: int = 1, **state: object) -> Worker:
    return Worker(wid, "node0", None, "cpu", vcpus, 0.0, stage, **state)  # type: ignore[arg-type]


def test_a_batch_starts_the_next_stage_worker_where_it_has_none() -> None:
    res = sched().decide(one_call(), 0.0)
    assert [(d.queue, d.config.batch) for d in res.dispatches] == [(QA, 1)]
    # b has no worker: its cheapest kind within its 88.9 ms once warm (1 vCPU, 20 ms) starts now, while a runs.
    assert [(s.queue, s.config, s.placement.cold, s.placement.evict) for s in res.starts] == [
        (QB, Config(1, 1, 0.0), True, ())
    ]
    assert "lookahead" in res.starts[0].reason
    # Off (the default): the wave meets b cold.
    assert sched(lookahead_starts=False).decide(one_call(), 0.0).starts == ()
    # A stage no call has reached yet: a runtime worker could not load its code, so none starts.
    first = Snapshot(one_call().queues[:1], one_call().cluster, {WF.name: WF})
    assert sched().decide(first, 0.0).starts == ()


def test_no_lookahead_start_where_the_next_stage_has_a_worker_to_take_the_batch() -> None:
    idle = warm("wb", "b", busy=False, idle_since_ms=0.0)
    assert sched().decide(one_call(idle), 0.0).starts == ()
    starting = warm("wb", "b", busy=True, starting=True)
    assert sched().decide(one_call(starting), 0.0).starts == ()
    # Busy and not starting: the batch would wait for it or start one late; the lookahead starts one now.
    busy = warm("wb", "b", busy=True)
    assert [s.queue for s in sched().decide(one_call(busy), 0.0).starts] == [QB]
    # No room without stopping another stage's idle worker: no start (a start never evicts).
    other = warm("wx", "x", busy=False, idle_since_ms=0.0)
    assert sched().decide(one_call(other, slots=2), 0.0).starts == ()


def test_a_tight_next_stage_budget_starts_the_kind_that_fits_it() -> None:
    # SLO 45 ms: b's part is 45 x 8 / 18 = 20 ms; 1 vCPU (20 ms) still fits, at 19 ms only 4 vCPUs (8 ms) do.
    tight = Workflow.chain("w", ["a", "b"], slo_ms=42.75)
    job = Job("a-j0", "r0", "run0", QA, 0.0, 0.0, 42.75, 42.75)
    queues = (QueueState(QA, (job,)), QueueState(QB, ()))
    snap = Snapshot(queues, ClusterSnapshot([Node("node0", 8)], [], []), {"w": tight})
    res = sched().decide(snap, 0.0)
    assert [(s.queue, s.config.vcpus) for s in res.starts] == [(QB, 4)]


def test_lookahead_starts_is_a_checked_bool() -> None:
    with pytest.raises(ConfigError, match=r"lookahead_starts must be a bool, got 'yes'"):
        ESGSettings(lookahead_starts="yes")  # type: ignore[arg-type]


def test_lookahead_starts_are_the_same_in_pool_and_simulator() -> None:
    case = conformance_case("esg")
    case = replace(case, settings=replace(case.settings, lookahead_starts=True))
    arrivals = list(case.arrivals(case.seed))
    sim = simulate(case, arrivals=arrivals)
    pool, ends = run_pool(case, arrivals)
    plain = simulate(conformance_case("esg"), arrivals=arrivals)
    assert sim.prewarm_starts > plain.prewarm_starts  # the case exercises it
    assert list(pool.core.fleet.batches) == list(sim.batches)
    assert list(pool.core.fleet.idles) == list(sim.idles)
    assert list(pool.core.decisions) == list(sim.decisions)
    assert ends == {r.request_id: r.finish_ms for r in sim.requests}
    assert pool.core.prewarms == sim.prewarm_starts
