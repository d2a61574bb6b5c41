"""The simulator's driver of the control core: events on a simulated clock in, actions out as events.

Queues, admission, rounds, worker lifecycle and records are the core's
(:class:`~esg_prefect.control.core.Core`, the code the runtime pool runs). This
driver does what the platform would: batches take the time the simulated
cluster draws for them, pre-warm starts take the stage's cold start, and the
core gets a :class:`~esg_prefect.control.events.Tick` after the events of each
instant. Requests walk their workflows as flows would
(:mod:`~esg_prefect.simulator.callers`).

The run ends when the last request has finished (or failed) after the last
arrival: idle workers are billed up to that instant and then stopped. Requests
still unfinished ``SimSpec.drain_s`` after the last arrival fail (the core
makes no round after that cutoff).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

from esg_prefect.control.core import Core
from esg_prefect.control.events import BatchFinished, FailJobs, StartBatch, StartWorker, WakeAt
from esg_prefect.exceptions import WorkflowError
from esg_prefect.model.records import RequestRecord
from esg_prefect.model.unchecked import unchecked
from esg_prefect.model.workflow import Workflow
from esg_prefect.scheduling.base import Scheduler
from esg_prefect.scheduling.search import Clock
from esg_prefect.scheduling.settings import ESGSettings
from esg_prefect.scheduling.tables import CandidateTables
from esg_prefect.simulator.callers import Callers
from esg_prefect.simulator.cluster import BatchTiming, SimCluster
from esg_prefect.simulator.engine import EventLoop

# Event kinds, in the order events of one instant are handled.
DONE, ARRIVAL, CALL, TICK, WARM = 0, 1, 2, 3, 4
_finished = unchecked(BatchFinished)  # no checks to skip: a faster __init__ for one event per batch
_NONE: frozenset[str] = frozenset()


class Controller:
    """Arrivals and batch ends on the event loop -> the core -> simulated batches and starts.

    Raises:
        WorkflowError: when a stage has no latency profile on the cluster's hardware.
    """

    def __init__(
        self,
        loop: EventLoop,
        cluster: SimCluster,
        scheduler: Scheduler,
        workflows: Mapping[str, Workflow],
        tables: CandidateTables,
        settings: ESGSettings,
        clock: Clock | None = None,
    ) -> None:
        hardware, profile = cluster.hardware_types(), cluster.profile
        for name, wf in workflows.items():
            for s in wf.stages:
                if not (profile.hardware_types(s) & hardware):
                    raise WorkflowError(
                        f"workflow {name!r}: stage {s!r} has no latency profile on the cluster's hardware "
                        f"{sorted(hardware)} (profiled on {sorted(profile.hardware_types(s)) or 'nothing'})"
                    )
        self.loop, self.cluster = loop, cluster
        self.core = Core(scheduler, tables, cluster, settings.platform, dict(workflows), timer=clock)
        sizes = profile.sizes  # each stage's typical item, to turn relative sizes into its unit
        typical = {
            s: (sizes.typical_item_size(s) or 1.0) if sizes else 1.0 for w in workflows.values() for s in w.stages
        }
        sim = cluster.sim
        self.callers = Callers(
            workflows,
            typical,
            self.core.arrive,
            self._ended,
            lambda t, payload: loop.at(t, CALL, payload),
            sim.run_overhead_ms,
            sim.call_overhead_ms,
        )
        self._sized = sizes is not None
        self.arrivals_left = 0  # set by the runner: arrivals scheduled and not yet handled
        self.request_sizes: Sequence[float] = ()  # set by the runner: relative size of each arrival, in order
        self._arrived, self._starting = 0, 0

    @property
    def request_records(self) -> list[RequestRecord]:
        """Every request that ended (after :meth:`close`: all of them, in arrival order)."""
        return self.callers.records

    def handle(self, kind: int, payload: object) -> None:
        """One event (called by the loop)."""
        now = self.loop.now_ms
        if kind == DONE:
            self._done(payload, now)  # type: ignore[arg-type]
        elif kind == ARRIVAL:
            i, self._arrived = self._arrived, self._arrived + 1
            self.arrivals_left -= 1
            self.callers.arrive(str(payload), now, self.request_sizes[i] if i < len(self.request_sizes) else 1.0)
        elif kind == CALL:
            due = cast(tuple[str, str], payload)
            self.callers.call_due(due[0], due[1], now)
        elif kind == WARM:
            self._starting -= 1
            self.core.worker_ready(str(payload), now)
        else:
            self.core.tick_due(float(payload))  # type: ignore[arg-type]

    def settle(self, now: float) -> None:
        """After the events of an instant: the end of the run, or the core's actions."""
        if self.arrivals_left == 0 and self.callers.open == 0 and not self.core.flights and self._starting == 0:
            self.cluster.retire_idle(now)
            self.loop.stop()
            return
        for a in self.core.settle(now):
            if isinstance(a, StartBatch):
                w, stage = a.worker, a.dispatch.queue.stage
                remote = sum(self.callers.remote_inputs(j.request_id, stage, w.node) for j in a.jobs)
                sizes = [j.input_size for j in a.jobs] if self._sized else None
                timing = self.cluster.timing(w, stage, a.dispatch.config, a.cold, remote, sizes)
                self.cluster.begin(w)
                self.loop.at(now + timing.total_ms, DONE, (a, timing))
            elif isinstance(a, WakeAt):
                self.loop.at(a.t, TICK, a.t)
            elif isinstance(a, FailJobs):
                for job in a.jobs:
                    self.callers.failed(job.request_id)
            elif isinstance(a, StartWorker):
                self._starting += 1
                cold = self.cluster.profile.cold_start_ms(a.queue.stage, a.worker.hardware)
                self.loop.at(now + cold, WARM, a.worker.worker_id)

    def _done(self, payload: tuple[StartBatch, BatchTiming], now: float) -> None:
        a, timing = payload
        self.cluster.end(a.worker)
        self.core.finished(_finished(a.batch_id, now, _NONE, (), False, timing.cold_start_ms, timing.transfer_ms))
        stage, node = a.dispatch.queue.stage, a.worker.node
        for job in a.jobs:
            self.callers.finished(job.request_id, stage, node, now)

    def _ended(self, request_id: str) -> bool:
        """A request ended: the core forgets it; whether it was marked at risk."""
        req = self.core.forget(request_id)
        return req is not None and req.at_risk

    def close(self) -> None:
        """At the end of the run: every request not finished is a failure."""
        self.callers.close()
