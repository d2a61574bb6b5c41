"""The Ray cluster as the ESG scheduler sees it: nodes and GPUs read from ``ray.nodes()``.

Ray knows a node by a 56-hex-digit id; the scheduler knows it by a readable
name that stays the same while the node lives: its host name, with the start
of its id appended when one host runs several Ray nodes (a local test
cluster, two raylets on one machine). A node whose Ray ``CPU`` count is 0 (a
head started with ``--num-cpus=0``) takes no workers and is not offered.

A node that leaves the cluster is no longer offered from the read that sees
it gone; the pool keeps it in its own view, full, while a batch of its still
runs there (:class:`~esg_prefect.runtime.pool.Pool`). Its record stays, so that
a start still aimed at it fails at once naming it instead of waiting for Ray.

GPU types come from Ray's ``accelerator_type:<T>`` resource or its
``ray.io/accelerator-type`` label, normalised to the names profiles and price
sheets use (:func:`~esg_prefect.runtime.gpu.hardware_type`).

Example::

    table = NodeTable()
    left = table.read(ray.nodes())        # the nodes seen leaving in this read
    nodes, devices = table.view(max_workers=16)
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from esg_prefect.model.cluster import Device, Node
from esg_prefect.runtime.gpu import hardware_type
from esg_prefect.runtime.workers import WorkerLoadError

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class RayNode:
    """One Ray node as last read, under the name the scheduler knows it by."""

    node_id: str
    name: str
    cpus: int
    gpus: int
    gpu_type: str
    alive: bool


class NodeTable:
    """Every Ray node seen, by id; :meth:`read` folds in a fresh ``ray.nodes()`` answer.

    Not thread-safe: :class:`~esg_prefect.runtime.ray_backend.RayBackend` holds its lock around it.

    Args:
        gpu_type: GPU type of every GPU where Ray reports none (None: ``"GPU"``, with a warning).
    """

    def __init__(self, gpu_type: str | None = None) -> None:
        self._nodes: dict[str, RayNode] = {}  # by Ray node id, in the order first seen
        self._gpu_type = gpu_type
        self._warned: set[str] = set()

    def read(self, infos: Iterable[Mapping[str, Any]]) -> list[RayNode]:
        """Update every node from Ray's records (``ray.nodes()``); returns the nodes seen leaving in this read."""
        left: list[RayNode] = []
        taken = {n.name for n in self._nodes.values()}
        for info in infos:
            node_id = str(info.get("NodeID", ""))
            if not node_id:
                continue
            alive = bool(info.get("Alive", info.get("alive", False)))
            known = self._nodes.get(node_id)
            if known is None:
                if not alive:
                    continue  # gone before we ever saw it: nothing of ours ran there
                known = RayNode(node_id, _node_name(info, node_id, taken), 0, 0, "", True)
                taken.add(known.name)
                self._nodes[node_id] = known
            if not alive:
                if known.alive:
                    known.alive = False
                    left.append(known)
                continue
            resources = info.get("Resources") or {}
            known.cpus = int(float(resources.get("CPU", 0)))
            known.gpus = int(float(resources.get("GPU", 0)))
            known.gpu_type = self._type_of(info, resources, known) if known.gpus else ""
        return left

    def view(self, max_workers: int) -> tuple[tuple[Node, ...], tuple[Device, ...]]:
        """The live nodes with a CPU, and their GPUs (``<node>/gpu<i>``), as the scheduler sees them."""
        shown = [n for n in self._nodes.values() if n.alive and n.cpus >= 1]
        nodes = tuple(Node(n.name, n.cpus, max_workers) for n in shown)
        devices = tuple(Device(f"{n.name}/gpu{i}", n.name, n.gpu_type) for n in shown for i in range(n.gpus))
        return nodes, devices

    def named(self, name: str) -> RayNode:
        """The node the scheduler calls ``name`` (alive or not).

        Raises:
            WorkerLoadError: when no node was ever called that, naming the known ones.
        """
        for n in self._nodes.values():
            if n.name == name:
                return n
        raise WorkerLoadError(f"no Ray node called {name!r}; known nodes: {sorted(self.ids())}")

    def ids(self) -> dict[str, str]:
        """Every node seen, alive or not: its name -> its Ray node id."""
        return {n.name: n.node_id for n in self._nodes.values()}

    def _type_of(self, info: Mapping[str, Any], resources: Mapping[str, Any], node: RayNode) -> str:
        if self._gpu_type:
            return self._gpu_type
        labels = info.get("Labels") or {}
        raw = str(labels.get("ray.io/accelerator-type", ""))
        if not raw:
            raw = next((k.split(":", 1)[1] for k in resources if k.startswith("accelerator_type:")), "")
        if raw:
            return hardware_type(raw)
        if node.node_id not in self._warned:
            self._warned.add(node.node_id)
            logger.warning(
                "esg-prefect: Ray reports no GPU type for node %s; its GPUs are called 'GPU'. "
                "Pass RayBackend(gpu_type=...) with the type your profiles and prices use.",
                node.name,
            )
        return "GPU"


def _node_name(info: Mapping[str, Any], node_id: str, taken: set[str]) -> str:
    """A readable, stable, unique name: the host (or address), with the id's start if the host has two nodes."""
    base = str(info.get("NodeManagerHostname") or info.get("NodeName") or info.get("NodeManagerAddress") or "")
    base = base or f"ray-{node_id[:8]}"
    return base if base not in taken else f"{base}-{node_id[:8]}"
