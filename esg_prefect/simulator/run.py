"""``run_case(case, seed) -> Report``: build the pieces, run the loop, summarize.

A run is a function of ``(case, seed)``: arrivals come from the workload with
that seed, service times from a random source seeded by it, and the scheduler
gets no clock unless the caller passes one (to time decisions; ESG's time
budget could then cut a search short, so timed runs are for E3 only).

Python's cyclic garbage collector is paused while a simulation runs (and
restored after, as the caller had it): a run allocates millions of
short-lived objects that reference counting frees, and keeps growing lists of
records, so the collector's passes cost 5-10 % of the run's time and found
fewer than 200 objects in cycles on a 60 s standard case (its records hold
none). The switch is process-wide: a thread running beside a simulation also
goes without cyclic collection until the simulation ends (``pause_gc=False``
leaves the collector alone).

Example:
    >>> from esg_prefect.simulator.standard import tiny_case
    >>> rep = run_case(tiny_case(), seed=1)
    >>> rep.overall.count > 0 and rep.overall.failed == 0
    True
"""

from __future__ import annotations

import gc
import math
import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace

from esg_prefect.exceptions import InvalidInputError
from esg_prefect.model.attribution import BatchRecord, IdleRecord
from esg_prefect.model.pricing import warn_price_mismatches
from esg_prefect.model.records import RequestRecord, StageRecord
from esg_prefect.model.report import Report, summarize
from esg_prefect.model.window import after_warmup
from esg_prefect.scheduling.base import DecisionStats
from esg_prefect.scheduling.registry import create_scheduler
from esg_prefect.scheduling.search import Clock
from esg_prefect.scheduling.tables import CandidateTables
from esg_prefect.simulator.case import Case
from esg_prefect.simulator.cluster import SimCluster
from esg_prefect.simulator.controller import ARRIVAL, Controller
from esg_prefect.simulator.engine import EventLoop


@dataclass(frozen=True, slots=True)
class SimRun:
    """A finished simulation: its report and every record behind it.

    Attributes:
        report: the summary (the same function the live runtime uses), of the
            records after the case's warm-up.
        requests, stages, batches, idles, decisions: every record of the run.
        rounds: scheduling rounds (``decide`` calls).
        events: events processed.
        end_ms: simulated time of the last event.
        cold_starts: workers started.
        decide_ms: wall time of each ``decide`` call (only with a clock).
        at_risk_cold_starts: workers started for dispatches the scheduler marked
            at risk (no plan met the slack): how much of the cold-start churn
            comes from best-effort dispatches.
        prewarm_starts: of ``cold_starts``, workers started with no jobs, off
            the requests' path (the scheduler's ``Start`` decisions).
    """

    report: Report
    requests: tuple[RequestRecord, ...]
    stages: tuple[StageRecord, ...]
    batches: tuple[BatchRecord, ...]
    idles: tuple[IdleRecord, ...]
    decisions: tuple[DecisionStats, ...]
    rounds: int
    events: int
    end_ms: float
    cold_starts: int
    decide_ms: tuple[float, ...] = ()
    at_risk_cold_starts: int = 0
    prewarm_starts: int = 0


def simulate(
    case: Case,
    seed: int | None = None,
    *,
    clock: Clock | None = None,
    progress: Callable[[float], None] | None = None,
    arrivals: Sequence[tuple[float, str]] | None = None,
    pause_gc: bool = True,
    instrument: Callable[[Controller], None] | None = None,
) -> SimRun:
    """Run ``case`` in the simulator and keep the records.

    Args:
        case: the experiment.
        seed: overrides ``case.seed``.
        clock: a wall clock in ms, injected into the scheduler and used to
            time ``decide`` (None keeps the run deterministic).
        progress: called now and then with the fraction of the arrival window simulated.
        arrivals: ``(arrival_ms, workflow)`` pairs to use instead of the case's
            workload (hand-worked tests, or replaying what a live run received).
        pause_gc: pause Python's cyclic garbage collector while the run lasts
            (module docstring); False leaves it as the caller has it, e.g. in a
            process whose other threads must keep collecting.
        instrument: called with the controller once it is set up, before the
            run starts (:mod:`esg_prefect.simulator.timed` times the core so).

    Raises:
        UnknownSchedulerError: for an unknown scheduler name.
        WorkflowError: when a stage has no profile on the cluster's hardware.
    """
    seed = case.seed if seed is None else seed
    profile = case.load_profile()
    warn_price_mismatches(case.prices, profile.all_hardware())
    settings = case.settings
    scheduler = create_scheduler(case.scheduler, profile, case.prices, settings, clock)
    loop = EventLoop()
    sim = case.sim
    if settings.hybrid_sharing and sim.corun is None:  # the scheduler plans with a co-run table: so does the platform
        sim = replace(sim, corun=settings.corun_table)
    scales = None
    if settings.keep_alive_by_price:
        scales = case.prices.keep_alive_scales(case.cluster.snapshot().hardware_types())
    cluster = SimCluster(
        case.cluster, profile, sim, settings.keep_alive_s * 1000.0, random.Random(f"service:{seed}"), scales
    )
    tables = CandidateTables(profile, case.prices, settings)
    ctl = Controller(loop, cluster, scheduler, case.workflow_map(), tables, settings, clock)
    requests = list(case.arrivals(seed) if arrivals is None else arrivals)
    known = case.workflow_map()
    for t, wf in requests:
        if wf not in known:
            raise InvalidInputError(f"arrival names unknown workflow {wf!r}; the case has {sorted(known)}")
        if not (isinstance(t, (int, float)) and math.isfinite(t)):
            raise InvalidInputError(f"arrival time must be a finite number of ms, got {t!r} (workflow {wf!r})")
        loop.at(t, ARRIVAL, wf)
    ctl.arrivals_left = len(requests)
    sizes = case.request_sizes(len(requests), seed)
    for i, size in enumerate(sizes):  # checked here once: the controller builds its jobs unchecked
        if not (isinstance(size, (int, float)) and math.isfinite(size) and size > 0):
            raise InvalidInputError(f"request size must be a finite number > 0, got {size!r} (arrival {i})")
    ctl.request_sizes = sizes
    duration_ms = case.duration_s * 1000.0
    ctl.core.cutoff_ms = duration_ms + case.sim.drain_s * 1000.0
    ctl.core.round_interval_ms = case.sim.round_interval_ms
    if instrument is not None:
        instrument(ctl)
    with _cyclic_gc_paused() if pause_gc else nullcontext():
        if progress is None:
            loop.run(ctl.handle, ctl.settle)
        else:
            steps = 50
            for i in range(1, steps + 1):
                loop.run(ctl.handle, ctl.settle, until_ms=duration_ms * i / steps)
                progress(i / steps)
            loop.run(ctl.handle, ctl.settle)
        ctl.close()
        window = after_warmup(
            ctl.request_records, ctl.core.stage_records, cluster.batches, cluster.idles, case.warmup_s * 1000.0
        )
        report = summarize(
            window.requests,
            window.stages,
            window.batches,
            window.idles,
            case.prices,
            ctl.core.decisions,
            split=settings.cost_split,
            idle_billing=settings.idle_billing,
            prior_workers=window.prior_workers,
        )
    return SimRun(
        report,
        tuple(ctl.request_records),
        tuple(ctl.core.stage_records),
        tuple(cluster.batches),
        tuple(cluster.idles),
        tuple(ctl.core.decisions),
        ctl.core.rounds,
        loop.events,
        loop.now_ms,
        cluster.cold_starts,
        tuple(ctl.core.decide_ms),
        ctl.core.at_risk_cold_starts,
        ctl.core.prewarms,
    )


@contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for the block (module docstring); restore the caller's setting."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def run_case(case: Case, seed: int | None = None) -> Report:
    """Simulate ``case`` with ``seed`` (default ``case.seed``) and return its report."""
    return simulate(case, seed).report
