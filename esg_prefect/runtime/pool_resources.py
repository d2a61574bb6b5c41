"""The pool's view of its backend's resources: the nodes and devices it lists, and the worker sizes it allows.

A backend's nodes can change while the pool runs (a Ray cluster's do): before
each round the pool follows them, so that the scheduler places workers only
where the backend still has room, and a node that left takes its idle workers
with it. A backend that caps one worker's vCPUs narrows the settings' space
once, when the pool is made.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from esg_prefect.model.cluster import Device, Node
from esg_prefect.model.config import ConfigSpace
from esg_prefect.scheduling import ESGSettings

if TYPE_CHECKING:
    from esg_prefect.control.core import Core
    from esg_prefect.model.pricing import PriceSheet
    from esg_prefect.runtime.workers import WorkerBackend, WorkerHandle

__all__ = ["PoolResources", "within_backend"]

logger = logging.getLogger("esg_prefect.runtime.pool")  # the pool's logger: these warnings are the pool's


class PoolResources:
    """Follows the backend's nodes and devices; mixed into :class:`~esg_prefect.runtime.pool.Pool`, whose state it uses.

    Every method runs on the pool's loop.
    """

    backend: WorkerBackend
    settings: ESGSettings
    prices: PriceSheet
    _core: Core | None
    _resources: tuple[object, object] | None
    _handles: dict[str, WorkerHandle]

    if TYPE_CHECKING:

        def _spawn(self, coro: Any) -> None: ...

    def _refresh(self) -> None:
        """Follow the backend's nodes and devices (a Ray cluster's can change) and their keep-alive."""
        assert self._core is not None
        nodes, devices = self.backend.nodes(), self.backend.devices()
        listed = {n.name for n in nodes}
        gone = [n for n in self._core.fleet.nodes if n.name not in listed]
        if gone:
            nodes, devices = self._nodes_left(gone, nodes, devices)
        if self._resources != (nodes, devices):
            fleet = self._core.fleet
            fleet.set_resources(nodes, devices)
            present = fleet.hardware_types()
            if self.settings.keep_alive_by_price:
                fleet.set_keep_alive(fleet.keep_alive_ms, self.prices.keep_alive_scales(present))
            self._resources = (nodes, devices)

    def _nodes_left(
        self, gone: list[Node], nodes: tuple[Node, ...], devices: tuple[Device, ...]
    ) -> tuple[tuple[Node, ...], tuple[Device, ...]]:
        """The view once nodes the backend no longer lists (a Ray node that left) are gone with their workers.

        Idle workers there are dropped now, so that no batch goes to them. A node where a
        batch still runs stays, with no room for another worker, until that batch fails and
        its calls go back to their queue: the scheduler's view must hold every worker's node.
        """
        assert self._core is not None
        names = {n.name for n in gone}
        running: dict[str, int] = {}
        for w in [w for w in self._core.fleet.workers.values() if w.node in names]:
            if w.busy:
                running[w.node] = running.get(w.node, 0) + 1
                continue
            logger.warning("worker %s dropped: its node %s has left", w.worker_id, w.node)
            self._core.worker_lost(w.worker_id)
            handle = self._handles.pop(w.worker_id, None)
            if handle is not None:
                self._spawn(handle.stop())
        kept = tuple(Node(n.name, n.vcpus, running[n.name]) for n in gone if n.name in running)
        kept_devices = tuple(d for d in self._core.fleet.devices.values() if d.node in running)
        return nodes + kept, devices + kept_devices


def within_backend(settings: ESGSettings, backend: WorkerBackend) -> ESGSettings:
    """The settings as the backend can honour them.

    Worker vCPU options above the backend's ``max_worker_vcpus`` (where it has one) are
    dropped, and a backend that holds a worker's vCPUs for its whole life
    (``holds_idle_vcpus``: Ray's ``cpu_reservation="lifetime"``) bills them while it idles
    (``idle_vcpus``), so that the bill is what the workers held.
    """
    if getattr(backend, "holds_idle_vcpus", False) is True and not settings.idle_vcpus:
        settings = dataclasses.replace(settings, idle_vcpus=True)
    cap = getattr(backend, "max_worker_vcpus", None)
    space = settings.config_space
    if not isinstance(cap, int) or all(v <= cap for v in space.vcpus):
        return settings
    kept = tuple(v for v in space.vcpus if v <= cap) or (min(space.vcpus),)
    return dataclasses.replace(settings, config_space=ConfigSpace(space.batches, kept, space.gpu_shares))
