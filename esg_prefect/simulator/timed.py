"""A simulation with the control core timed apart from the simulator, and the figures of partitioned runs.

Whether a control plane keeps up is a question about the controller's own
time: the core's admissions, rounds (snapshot, the scheduler's ``decide``,
applying the decisions) and bookkeeping, not the simulator's event loop,
callers and service-time draws. :func:`simulate_timed` runs a case as
:func:`~esg_prefect.simulator.run.simulate` does and times the core's entry
points with an injected clock (wall time, or the process's CPU time on a
shared machine); the scheduler itself gets no clock, so
the decisions are those of an untimed run. :class:`PartitionResult` keeps what
a report needs of one partition's run once its records are dropped, and
:func:`merge` adds partitions up into one case's :class:`ScaleFigures`.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from esg_prefect.exceptions import InvalidInputError
from esg_prefect.model.report import percentile
from esg_prefect.simulator.case import Case
from esg_prefect.simulator.controller import Controller
from esg_prefect.simulator.run import SimRun, simulate

Clock = Callable[[], float]
"""A clock in ms (wall time, or CPU time)."""


class CoreTimes:
    """Time inside the control core by the injected clock: every entry point, and each round alone.

    Attributes:
        core_ms: ms inside the core's entry points (``settle`` with its round included).
        rounds_ms: ms of each round.
    """

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.core_ms = 0.0
        self.rounds_ms = array("d")

    def total(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, its time added to :attr:`core_ms`."""
        clock = self.clock

        def timed(*args: Any) -> Any:
            t0 = clock()
            out = fn(*args)
            self.core_ms += clock() - t0
            return out

        return timed

    def round(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, its time of each call appended to :attr:`rounds_ms`."""
        clock, rounds = self.clock, self.rounds_ms

        def timed(*args: Any) -> Any:
            t0 = clock()
            out = fn(*args)
            rounds.append(clock() - t0)
            return out

        return timed


def simulate_timed(
    case: Case, arrivals: Sequence[tuple[float, str]], seed: int | None = None, clock: Clock | None = None
) -> tuple[SimRun, CoreTimes | None]:
    """:func:`~esg_prefect.simulator.run.simulate` with the control core timed by ``clock`` (None: untimed).

    It is ``simulate`` with the core's entry points wrapped before the run (a
    test holds the two equal); the scheduler gets no clock, so its decisions do not depend on the
    machine's speed. With ``clock``, each core entry point (admission, batch
    ends, workers warming, and ``settle`` with its round) is timed, and each
    round (snapshot, ``decide``, applying the decisions) also alone.

    Raises:
        InvalidInputError: for an arrival naming a workflow the case does not have.
    """
    if clock is None:
        return simulate(case, seed, arrivals=list(arrivals)), None
    times = CoreTimes(clock)

    def instrument(ctl: Controller) -> None:
        core = ctl.core
        core.timer = clock  # the scheduler's decide alone, per round (Core.decide_ms)
        for name in ("settle", "finished", "worker_ready"):
            setattr(core, name, times.total(getattr(core, name)))
        setattr(core, "_round", times.round(core._round))  # noqa: B010 - settle calls it through the instance
        ctl.callers._submit = times.total(core.arrive)

    return simulate(case, seed, arrivals=list(arrivals), instrument=instrument), times


@dataclass(frozen=True, slots=True)
class PartitionResult:
    """One partition's figures, kept once its records are dropped.

    Attributes:
        index: the partition.
        workflows, gpus: what it served and on how many GPUs.
        requests: requests in the report's window (after the warm-up); ``slo_met`` of them met their SLO.
        latencies_ms: latency of each of those that finished.
        whole_cost: what its workers were billed in the window, busy and idle
            (the report's ``busy_cost + idle_cost``); ``batch_cost``: the batches alone.
        batches, batched_jobs: batches in the window and the jobs in them.
        workers: workers started over the whole run.
        simulated_requests: every request of the run, the warm-up's included.
        duration_s: the case's arrival window.
        end_ms: simulated time of its last event (the window, then the requests' drain).
        rounds: scheduling rounds.
        core_ms: time inside the control core by the run's clock (None when untimed).
        decide_ms: of it, inside the scheduler's ``decide``.
        rounds_ms: time of each round (snapshot, ``decide``, applying).
    """

    index: int
    workflows: int
    gpus: int
    requests: int
    slo_met: int
    latencies_ms: array[float]
    whole_cost: float
    batch_cost: float
    batches: int
    batched_jobs: int
    workers: int
    simulated_requests: int
    duration_s: float
    end_ms: float
    rounds: int
    core_ms: float | None
    decide_ms: float | None
    rounds_ms: array[float]


def partition_result(index: int, case: Case, run: SimRun, times: CoreTimes | None) -> PartitionResult:
    """The figures of one partition's run (``case`` is the partition's own)."""
    o, rep = run.report.overall, run.report
    w0 = case.warmup_s * 1000.0
    lat = array(
        "d", (r.finish_ms - r.arrival_ms for r in run.requests if r.arrival_ms >= w0 and r.finish_ms is not None)
    )
    return PartitionResult(
        index=index,
        workflows=len(case.workflows),
        gpus=sum(case.cluster.gpu_counts().values()),
        requests=o.count,
        slo_met=o.slo_met,
        latencies_ms=lat,
        whole_cost=rep.busy_cost + rep.idle_cost,
        batch_cost=o.batch_cost_total,
        batches=o.batches,
        batched_jobs=round(o.mean_batch_size * o.batches),
        workers=run.cold_starts,
        simulated_requests=len(run.requests),
        duration_s=case.duration_s,
        end_ms=run.end_ms,
        rounds=run.rounds,
        core_ms=times.core_ms if times is not None else None,
        decide_ms=sum(run.decide_ms) if times is not None else None,
        rounds_ms=times.rounds_ms if times is not None else array("d"),
    )


@dataclass(frozen=True, slots=True)
class ScaleFigures:
    """A case's figures over its partitions (one partition: the plain controller).

    Attributes:
        partitions: how many controllers.
        requests, slo_hit_rate, latency_p50_ms, latency_p99_ms: over the report's window, all partitions.
        whole_cost_per_request: every worker's busy and idle time billed, per request;
            ``batch_cost_per_request``: the batches alone (the paper's cost model).
        mean_batch: jobs per batch.
        workers: workers started.
        sim_s: simulated seconds: the arrival window (the core's time after it, while
            the last requests drain, is counted too: the factors err low).
        core_s_max, core_s_total: control-core seconds of the slowest partition, and of all together.
        decide_s_total: of ``core_s_total``, inside the schedulers' ``decide``.
        realtime_factor: ``sim_s / core_s_max`` (each partition on its own core).
        realtime_factor_one_core: ``sim_s / core_s_total`` (every partition on one core).
        round_p50_ms, round_p99_ms: time per round, over every partition's rounds.
        rounds: rounds, all partitions.
    """

    partitions: int
    requests: int
    simulated_requests: int
    slo_hit_rate: float
    latency_p50_ms: float | None
    latency_p99_ms: float | None
    whole_cost_per_request: float
    batch_cost_per_request: float
    mean_batch: float
    workers: int
    sim_s: float
    core_s_max: float | None
    core_s_total: float | None
    decide_s_total: float | None
    realtime_factor: float | None
    realtime_factor_one_core: float | None
    round_p50_ms: float | None
    round_p99_ms: float | None
    rounds: int


def merge(results: Sequence[PartitionResult]) -> ScaleFigures:
    """The case's figures from its partitions' (sums, and percentiles over the pooled values)."""
    if not results:
        raise InvalidInputError("merge needs at least one partition's figures")
    n = sum(r.requests for r in results)
    lat = [x for r in results for x in r.latencies_ms]
    batches = sum(r.batches for r in results)
    sim_s = max(r.duration_s for r in results)
    timed = all(r.core_ms is not None for r in results)
    core = [r.core_ms / 1000.0 for r in results if r.core_ms is not None]
    rounds_ms = [x for r in results for x in r.rounds_ms]
    core_max = max(core) if timed else None
    core_total = sum(core) if timed else None
    return ScaleFigures(
        partitions=len(results),
        requests=n,
        simulated_requests=sum(r.simulated_requests for r in results),
        slo_hit_rate=sum(r.slo_met for r in results) / n if n else 0.0,
        latency_p50_ms=percentile(lat, 50),
        latency_p99_ms=percentile(lat, 99),
        whole_cost_per_request=sum(r.whole_cost for r in results) / n if n else 0.0,
        batch_cost_per_request=sum(r.batch_cost for r in results) / n if n else 0.0,
        mean_batch=sum(r.batched_jobs for r in results) / batches if batches else 0.0,
        workers=sum(r.workers for r in results),
        sim_s=sim_s,
        core_s_max=core_max,
        core_s_total=core_total,
        decide_s_total=sum((r.decide_ms or 0.0) for r in results) / 1000.0 if timed else None,
        realtime_factor=sim_s / core_max if core_max else None,
        realtime_factor_one_core=sim_s / core_total if core_total else None,
        round_p50_ms=percentile(rounds_ms, 50),
        round_p99_ms=percentile(rounds_ms, 99),
        rounds=sum(r.rounds for r in results),
    )
