"""A worker process as the pool's fleet tracks it: its place, state and the view a scheduler sees.

Mutable, unlike :class:`~esg_prefect.model.cluster.Worker`: the fleet changes it as batches come and go,
and hands schedulers an immutable view rebuilt only after a change.
"""

from __future__ import annotations

from esg_prefect.model.attribution import IdleRecord
from esg_prefect.model.cluster import Worker
from esg_prefect.model.unchecked import unchecked

# Views and records built from the fleet's own state, consistent by construction: without their
# checks (esg_prefect.model.unchecked).
_worker = unchecked(Worker)
_idle_record = unchecked(IdleRecord)


class FleetWorker:
    """A worker process as the fleet tracks it (mutable; snapshots copy it)."""

    __slots__ = (
        "device_id",
        "expiry_token",
        "free_at_ms",
        "fresh",
        "hardware",
        "idle_free",
        "idle_since_ms",
        "loaded_ms",
        "node",
        "share",
        "stage",
        "starting",
        "vcpus",
        "view",
        "worker_id",
    )

    def __init__(
        self,
        worker_id: str,
        node: str,
        device_id: str | None,
        hardware: str,
        vcpus: int,
        share: float,
        stage: str,
        idle_free: bool = False,
    ) -> None:
        self.worker_id = worker_id
        self.node = node
        self.device_id = device_id
        self.hardware = hardware
        self.vcpus = vcpus
        self.share = share
        self.stage = stage
        self.idle_since_ms: float | None = None  # None while busy (or starting)
        self.starting: float | None = None  # when a pre-warm start began, while it loads
        self.expiry_token = 0
        self.free_at_ms: float | None = None  # while busy: when its batch or load is predicted to end
        self.view: Worker | None = None  # the immutable view, until the state changes
        self.fresh = False  # warm from a pre-warm start, no batch run yet
        self.loaded_ms: float | None = None  # when its pre-warm load ended, until that idle interval closes
        self.idle_free = idle_free  # its idle time costs nothing (Fleet.idle_is_free, decided as it starts)

    @property
    def busy(self) -> bool:
        """Whether it runs (or is starting for) a batch."""
        return self.idle_since_ms is None

    def idle_record(self, now_ms: float, vcpus_held: bool) -> IdleRecord | None:
        """Its idle interval up to ``now_ms`` (None when busy or empty), a pre-warm load at its start marked;
        ``vcpus_held``: the platform held its vCPUs while it idled (:attr:`Fleet.idle_vcpus`)."""
        start = self.idle_since_ms
        if start is None or now_ms <= start:
            return None
        loading = 0.0 if self.loaded_ms is None else min(max(self.loaded_ms, start), now_ms) - start
        return _idle_record(self.worker_id, self.vcpus, self.share, self.hardware, start, now_ms, loading, vcpus_held)

    def as_worker(self) -> Worker:
        """The immutable view the scheduler sees (cached until the worker changes)."""
        if self.view is None:
            # Built without Worker's checks: they held when the worker started (its share comes from
            # a checked Config, already on the 1/100 grid), and the view is rebuilt at every change.
            self.view = _worker(
                self.worker_id,
                self.node,
                self.device_id,
                self.hardware,
                self.vcpus,
                self.share,
                self.stage,
                self.idle_since_ms is None,
                self.idle_since_ms,
                self.starting is not None,
                self.free_at_ms,
                self.fresh,
            )
        return self.view
