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
from esg_prefect.simulator.case import ClusterSpec, NodeSpec
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


def b_calls(s: ESGScheduler, times: list[float]) -> ESGScheduler:
    """Rounds in which calls of b became ready at ``times``: what tells whether b's calls come in waves."""
    for i, t in enumerate(times):
        job = Job(f"b-p{i}", f"p{i}", f"prun{i}", QB, t, t, t + 100.0, t + 100.0)
        s.decide(Snapshot((QueueState(QB, (job,)),), ClusterSnapshot([Node("node0", 8)], [], []), {"w": WF}), t)
    return s


WAVES = [0.0, 1000.0, 2000.0, 3000.0]  # lulls of 1 s: b's calls come in waves
STEADY = [100.0 * i for i in range(31)]  # a call every 100 ms for 3 s


def one_call(*workers: Worker, slots: int | None = None, now: float = 3100.0) -> Snapshot:
    """A call waiting at a."""
    job = Job("a-j0", "r0", "run0", QA, now, now, now + 200.0, now + 200.0)
    cluster = ClusterSnapshot([Node("node0", 8, max_workers=slots)], [], list(workers))
    return Snapshot((QueueState(QA, (job,)),), cluster, {WF.name: WF})


def warm(wid: str, stage: str, vcpus: int = 1, **state: object) -> Worker:
    return Worker(wid, "node0", None, "cpu", vcpus, 0.0, stage, **state)  # type: ignore[arg-type]


def test_a_batch_starts_the_next_stage_worker_where_it_has_none() -> None:
    res = b_calls(sched(), WAVES).decide(one_call(), 3100.0)
    assert [(d.queue, d.config.batch) for d in res.dispatches] == [(QA, 1)]
    # b has no worker: its cheapest kind within its 88.9 ms once warm (1 vCPU, 20 ms) starts now, while a runs.
    assert [(s.queue, s.config, s.placement.cold, s.placement.evict) for s in res.starts] == [
        (QB, Config(1, 1, 0.0), True, ())
    ]
    assert "lookahead" in res.starts[0].reason
    # Off: the wave meets b cold.
    assert b_calls(sched(lookahead_starts=False), WAVES).decide(one_call(), 3100.0).starts == ()


def test_only_a_stage_whose_calls_come_in_waves_is_started_ahead() -> None:
    # Steady calls: b's workers are busy often, and a start each time would add workers its queue does not need.
    assert b_calls(sched(), STEADY).decide(one_call(), 3100.0).starts == ()
    # No call of b yet: not in waves (and a runtime worker could not load b's code).
    assert sched().decide(one_call(now=0.0), 0.0).starts == ()
    # Two lulls but under 2 s of history: not yet.
    assert b_calls(sched(), [0.0, 500.0, 1000.0]).decide(one_call(now=1100.0), 1100.0).starts == ()


def test_no_lookahead_start_where_the_next_stage_has_a_worker_to_take_the_batch() -> None:
    def starts(*workers: Worker, slots: int | None = None) -> list[QueueKey]:
        res = b_calls(sched(), WAVES).decide(one_call(*workers, slots=slots), 3100.0)
        return [s.queue for s in res.starts]

    assert starts(warm("wb", "b", busy=False, idle_since_ms=0.0)) == []
    assert starts(warm("wb", "b", busy=True, starting=True)) == []
    # Busy and not starting: the batch would wait for it or start one late; the lookahead starts one now.
    assert starts(warm("wb", "b", busy=True)) == [QB]
    # No room without stopping another stage's idle worker: no start (a start never evicts).
    assert starts(warm("wx", "x", busy=False, idle_since_ms=0.0), slots=2) == []


def test_a_tight_next_stage_budget_starts_the_kind_that_fits_it() -> None:
    # SLO 42.75 ms: b's part is 42.75 x 8 / 18 = 19 ms; 1 vCPU (20 ms) no longer fits, 4 vCPUs (8 ms) do.
    tight = Workflow.chain("w", ["a", "b"], slo_ms=42.75)
    s = b_calls(sched(), WAVES)
    job = Job("a-j0", "r0", "run0", QA, 3100.0, 3100.0, 3142.75, 3142.75)
    snap = Snapshot((QueueState(QA, (job,)),), ClusterSnapshot([Node("node0", 8)], [], []), {"w": tight})
    assert [(st.queue, st.config.vcpus) for st in s.decide(snap, 3100.0).starts] == [(QB, 4)]


def test_the_new_knobs_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"lookahead_starts must be a bool, got 'yes'"):
        ESGSettings(lookahead_starts="yes")  # type: ignore[arg-type]
    for bad in (0, 101, float("nan"), True, "90"):
        with pytest.raises(ConfigError, match=r"keep_alive_percentile_waves must be"):
            ESGSettings(keep_alive_percentile_waves=bad)  # type: ignore[arg-type]


def test_lookahead_starts_are_the_same_in_pool_and_simulator() -> None:
    # Waves of 24 requests 800 ms apart: the stages' lulls make them wavy after 2 s, and the
    # keep-alive's wave percentile applies too.
    case = conformance_case("esg")
    case = replace(case, cluster=ClusterSpec((NodeSpec("n0", 32, ("T4", "T4", "T4", "T4")),)))  # room to start
    flows = [wf.name for wf in case.workflows]
    arrivals = [(800.0 * k + 1.0 * i, flows[i % len(flows)]) for k in range(8) for i in range(24)]
    sim = simulate(case, arrivals=arrivals)
    pool, ends = run_pool(case, arrivals)
    off = replace(case, settings=replace(case.settings, lookahead_starts=False))
    assert sim.prewarm_starts > simulate(off, arrivals=arrivals).prewarm_starts  # the case exercises it
    assert list(pool.core.fleet.batches) == list(sim.batches)
    assert list(pool.core.fleet.idles) == list(sim.idles)
    assert list(pool.core.decisions) == list(sim.decisions)
    assert ends == {r.request_id: r.finish_ms for r in sim.requests}
    assert pool.core.prewarms == sim.prewarm_starts
