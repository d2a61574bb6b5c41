"""Simulator vs live runtime: one case, the same report within a stated tolerance.

The case (:func:`conformance_case`) runs in the simulator
(:func:`~esg_prefect.simulator.simulate`, mean service times) and on the live
runtime: an in-process :class:`~esg_prefect.runtime.pool.Pool` with the ESG
scheduler and thread workers (no Prefect), fed the same arrivals in wall-clock
time; a request's second call is submitted when its first one's result
arrives, as a flow would. Both reports come from the one ``summarize``, and
``compare_reports`` must find no difference beyond
:class:`~esg_prefect.model.conformance.Tolerance` (SLO hit rate within 5
points, failed fraction within 2 points, median latency, batch cost per
request and mean batch size within 25 %, request counts exact).

Made to hold on a loaded 2-core CI machine:

* the stages *sleep* for their profiled batch time, so the live run measures
  the scheduler and the pool, not this machine's compute;
* batching must not hinge on how fast a burst of calls is submitted (a busy
  machine may run the pool's round between two submits). So the node has one
  vCPU, and each cycle starts with a "block" request whose one stage holds it
  for 100 ms; the four requests of the cycle arrive 10 ms later and wait in
  their queue, whatever the submit timing, until the vCPU is free: then ESG
  runs them as one batch, in the simulator and live alike;
* cycles are 400 ms apart, far more than a cycle's work (about 210 ms), so no
  delay carries over.

ESG's waiting for a fuller batch is off in the main test and on in the second:
both sides estimate arrival rates with the shared
:class:`~esg_prefect.workload.rate.ArrivalRateEWMA` (before the runtime did,
calls submitted microseconds apart looked like thousands per second, and the
live pool waited where the simulator did not).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Any

from esg_prefect.control.calls import StageCall, StageResult, WorkflowDecl
from esg_prefect.control.records import request_records, stage_records
from esg_prefect.model import LatencyProfile, PriceSheet, ProfilePoint, Workflow
from esg_prefect.model.config import ConfigSpace
from esg_prefect.model.conformance import Tolerance, compare_reports
from esg_prefect.model.report import Report, summarize
from esg_prefect.runtime.pool import Pool, wall_ms
from esg_prefect.runtime.stages import StageSpec
from esg_prefect.runtime.workers import InlineBackend
from esg_prefect.scheduling import ESGSettings
from esg_prefect.simulator import Case, ClusterSpec, NodeSpec, SimSpec, WorkloadSpec, simulate

CYCLES = 5
CYCLE_MS = 400.0
PER_CYCLE = 4
HOLD_MS = 100.0


def first_ms(batch: int) -> float:
    """Profiled (and slept) batch time of stage "first": 40 ms + 5 ms per item."""
    return 40.0 + 5.0 * batch


def second_ms(batch: int) -> float:
    """Profiled (and slept) batch time of stage "second": 30 ms + 5 ms per item."""
    return 30.0 + 5.0 * batch


def _load(device: str) -> dict[str, Any]:
    return {}


def _sleeper(ms: Any) -> Any:
    def run(model: dict[str, Any], items: list[int]) -> list[int]:
        time.sleep(ms(len(items)) / 1000.0)
        return [x + 1 for x in items]

    return run


FIRST = StageSpec("first", _load, _sleeper(first_ms), "tests.test_conformance:FIRST")
SECOND = StageSpec("second", _load, _sleeper(second_ms), "tests.test_conformance:SECOND")
HOLD = StageSpec("hold", _load, _sleeper(lambda b: HOLD_MS), "tests.test_conformance:HOLD")
STAGES = {"conf": (FIRST, SECOND), "block": (HOLD,)}


def conformance_profile() -> LatencyProfile:
    """The stages' batch times on one vCPU, mean = p95 (they sleep exactly that long); no cold start."""
    times = {"first": first_ms, "second": second_ms, "hold": lambda b: HOLD_MS}
    return LatencyProfile(
        [ProfilePoint(s, "cpu", b, 1, 0.0, f(b), f(b)) for s, f in times.items() for b in (1, 2, 4, 8)]
    )


def conformance_case(wait_for_batch: bool = False) -> Case:
    """The case both sides run (module docstring): two workflows on one 1-vCPU node, ESG, SLO 1 s."""
    return Case(
        name="conformance",
        workflows=(Workflow.chain("conf", ["first", "second"], 1000.0), Workflow.chain("block", ["hold"], 1000.0)),
        profile=conformance_profile(),
        prices=PriceSheet(1e-4, {}),
        cluster=ClusterSpec((NodeSpec("inline", 1, (), max_workers=16),)),
        workload=WorkloadSpec("poisson", 10.0),  # unused: the arrivals are given (arrivals())
        duration_s=CYCLES * CYCLE_MS / 1000.0,
        scheduler="esg",
        # The CPU only, one vCPU per worker; no online latency correction (the simulator has none).
        settings=ESGSettings(
            config_space=ConfigSpace((1, 2, 4, 8), (1,), (0.0,)), correction_alpha=0.0, wait_for_batch=wait_for_batch
        ),
        sim=SimSpec(service_time="mean"),
    )


def arrivals() -> list[tuple[float, str]]:
    """The case's requests, ``(arrival_ms, workflow)``: per cycle a "block" request, then four "conf" ones."""
    out: list[tuple[float, str]] = []
    for k in range(CYCLES):
        out.append((k * CYCLE_MS, "block"))
        out.extend((k * CYCLE_MS + 10.0, "conf") for _ in range(PER_CYCLE))
    return out


def run_live(case: Case) -> Report:
    """Feed the case's arrivals to an in-process pool in wall-clock time; its report once all finished.

    One warm-up request per workflow runs first and is left out of the report:
    it starts the pool's loop and a worker per stage, which takes a while on a
    busy machine, while the simulated workers start in no time (the profile has
    no cold start).
    """
    decls = {wf.name: WorkflowDecl(wf.name, wf.slo_ms, tuple(wf.edges)) for wf in case.workflows}
    # Warm-up requests run under workflows of their own: they warm the stages' workers (a worker
    # serves its stage in any workflow) but not the case's queues, whose arrival-rate estimates the
    # simulator's never see either (with waiting on, a warm-up call would make the first real one
    # look like part of a stream worth waiting for).
    decls |= {f"warm-{wf.name}": WorkflowDecl(f"warm-{wf.name}", wf.slo_ms, tuple(wf.edges)) for wf in case.workflows}
    pool = Pool(
        case.load_profile(), case.prices, scheduler=case.scheduler, settings=case.settings, backend=InlineBackend(1, 16)
    )
    lock = threading.Lock()  # guards finals: appended to from the pool's thread
    finals: list[Future[StageResult]] = []
    done = threading.Condition(lock)

    def submit(wf: str, k: int, rid: str, item: int, arrival: float) -> None:
        stage = STAGES[wf][k]
        decl = decls[f"warm-{wf}" if rid.startswith("warm-") else wf]
        fut = pool.submit(
            StageCall(f"{rid}-{stage.name}", stage.name, stage.import_path, decl, rid, rid, item, arrival_ms=arrival)
        )
        if k + 1 < len(STAGES[wf]):  # the next stage when this one's result arrives
            fut.add_done_callback(lambda f: submit(wf, k + 1, rid, f.result().output, arrival))
            return
        with done:
            finals.append(fut)
            done.notify_all()

    def wait_for(n: int) -> None:
        with done:
            assert done.wait_for(lambda: len(finals) >= n, 30.0), "some request never reached its last stage"
            pending = list(finals)
        for f in pending:
            f.result(30.0)

    try:
        for n, wf in enumerate(STAGES, start=1):
            submit(wf, 0, f"warm-{wf}", 0, wall_ms())
            wait_for(n)
        warm = len(STAGES)
        t0 = wall_ms() + 100.0
        for i, (offset, wf) in enumerate(arrivals()):
            delay = (t0 + offset - wall_ms()) / 1000.0
            if delay > 0:
                time.sleep(delay)
            submit(wf, 0, f"{wf}-{i}", i, t0 + offset)
        wait_for(warm + len(arrivals()))
        snap = pool.snapshot()
    finally:
        pool.close()
    return summarize(
        [r for r in request_records(snap) if not r.request_id.startswith("warm-")],
        [s for s in stage_records(snap) if not s.request_id.startswith("warm-")],
        [b for b in snap.batches if not all(item.run_id.startswith("warm-") for item in b.items)],
        snap.idles,
        pool.prices,
        snap.decisions,
        case.settings.cost_split,
        case.settings.idle_billing,
    )


def test_simulator_and_live_runtime_agree_on_one_case() -> None:
    case = conformance_case()
    simulated = simulate(case, 0, arrivals=arrivals()).report
    # The simulator's side, worked by hand: per cycle the block request (alone, 100 ms), then the
    # four conf requests as one batch at each stage, after waiting 90 ms for the vCPU.
    o = simulated.overall
    assert (o.count, o.failed, o.slo_hit_rate, o.batches) == (25, 0, 1.0, 15)
    assert o.mean_batch_size == (CYCLES * 1 + 2 * CYCLES * PER_CYCLE) / (3 * CYCLES)
    conf = next(g for g in simulated.workflows if g.name == "conf")
    assert conf.latency_p50_ms == (HOLD_MS - 10.0) + first_ms(4) + second_ms(4)
    live = run_live(case)
    problems = compare_reports(simulated, live, Tolerance())
    assert problems == [], (problems, simulated.overall, live.overall)


def test_agreement_with_waiting_for_fuller_batches() -> None:
    case = conformance_case(wait_for_batch=True)
    simulated = simulate(case, 0, arrivals=arrivals()).report
    # Waiting pairs block requests 400 ms apart (the first alone: no rate yet): 13 batches, not 15.
    o = simulated.overall
    assert (o.count, o.failed, o.batches) == (25, 0, 13)
    live = run_live(case)
    problems = compare_reports(simulated, live, Tolerance())
    assert problems == [], (problems, simulated.overall, live.overall)
