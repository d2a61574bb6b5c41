"""The pool's read side: what it plans with, its state, and consistent copies of its records.

Mixed into :class:`~esg_prefect.runtime.pool.Pool`, whose state it reads:
these run on any thread; the copies are taken on the pool's loop, so that a
snapshot is consistent with itself while the pool goes on serving.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from esg_prefect.control.records import PoolSnapshot, RunStub, request_records, stage_records
from esg_prefect.exceptions import PoolClosedError
from esg_prefect.model.config import CPU
from esg_prefect.model.report import Report, summarize

if TYPE_CHECKING:
    from esg_prefect.control.core import Core
    from esg_prefect.model.correction import LatencyCorrection
    from esg_prefect.model.pricing import PriceSheet
    from esg_prefect.model.profile import LatencyProfile
    from esg_prefect.runtime.planner import Planner
    from esg_prefect.runtime.pool_records import CallBook
    from esg_prefect.runtime.workers import WorkerBackend
    from esg_prefect.runtime.workflows import WorkflowRegistry
    from esg_prefect.scheduling import ESGSettings, Scheduler
    from esg_prefect.scheduling.tables import CandidateTables

__all__ = ["PoolViews"]


class PoolViews:
    """Read-only views of a pool; mixed into :class:`~esg_prefect.runtime.pool.Pool`."""

    backend: WorkerBackend
    settings: ESGSettings
    prices: PriceSheet
    planner: Planner
    _core: Core | None
    _book: CallBook
    _registry: WorkflowRegistry
    _loop: asyncio.AbstractEventLoop | None
    _stopped: bool

    if TYPE_CHECKING:

        async def _snapshot(self, recent: int | None = None) -> PoolSnapshot: ...

        def _snapshot_now(self, recent: int | None = None) -> PoolSnapshot: ...

    @property
    def paused(self) -> bool:
        """Whether dispatching is held (:meth:`pause`)."""
        return self._core is not None and self._core.paused

    @property
    def scheduler(self) -> Scheduler:
        """The scheduler planning now (replaced when the online correction re-plans)."""
        return self.planner.scheduler

    @property
    def tables(self) -> CandidateTables:
        """The tables that give calls their deadlines (replaced with the scheduler)."""
        return self.planner.tables

    @property
    def profile(self) -> LatencyProfile:
        """The profile planned with now: the base profile rescaled by the online correction."""
        return self.planner.profile

    @property
    def correction(self) -> LatencyCorrection | None:
        """The online latency correction (None: turned off)."""
        return self.planner.correction

    @property
    def core(self) -> Core:
        """The control core (created at the first call; read it on the pool's loop or after :meth:`close`)."""
        if self._core is None:
            raise PoolClosedError("the pool has not started")
        return self._core

    def snapshot(self, timeout_s: float = 30.0, recent: int | None = None) -> PoolSnapshot:
        """Consistent copies of the records (calls, batches, idle time, decisions, queues, workers).

        ``recent``: only the newest ``recent`` calls, batches, idle intervals and
        decisions, and no requests: what a metrics scrape needs, copied in time
        independent of how long the pool has served (the copy holds its loop).
        Once the pool has closed, its last state (read here: its loop has stopped).
        """
        if self._stopped:  # closed: no loop to ask, and nothing changes any more
            return self._snapshot_now(recent)
        if self._loop is None:
            return PoolSnapshot((), (), (), (), {}, ())
        return asyncio.run_coroutine_threadsafe(self._snapshot(recent), self._loop).result(timeout_s)

    def open_runs(self) -> list[RunStub]:
        """The runs whose end has not reached the pool, each at its earliest arrival here.

        Read once the pool has closed (its loop has stopped): the cost store keeps their
        start, so that a run whose calls were still queued when a pool service stopped
        starts there, not where its calls reach the next instance.
        """
        if not self._stopped or self._core is None:
            return []
        return self._book.open_runs(self._core, self._registry.slo_ms)

    def report(self, timeout_s: float = 30.0) -> Report:
        """SLO hit rate, latencies, batch sizes, costs and decision times so far (one ``summarize``)."""
        snap = self.snapshot(timeout_s)
        s = self.settings
        return summarize(
            request_records(snap),
            stage_records(snap),
            snap.batches,
            snap.idles,
            self.prices,
            snap.decisions,
            s.cost_split,
            s.idle_billing,
        )

    def keep_alive_ms(self) -> dict[str, float]:
        """How long an idle worker is kept, per hardware type present (``ESGSettings.keep_alive_by_price``)."""
        present = frozenset({CPU, *(d.hardware for d in self.backend.devices())})
        keep = self.settings.keep_alive_s * 1000.0
        if not self.settings.keep_alive_by_price:
            return dict.fromkeys(present, keep)
        return {hw: keep * scale for hw, scale in self.prices.keep_alive_scales(present).items()}
