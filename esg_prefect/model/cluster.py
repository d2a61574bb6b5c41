"""The cluster as the scheduler sees it: nodes, GPU devices and workers.

A snapshot is immutable; the runtime and the simulator each build one from
their own state before calling the scheduler. A worker is a process bound to
``(device, gpu_share, vcpus)`` with one stage's model warm in it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from esg_prefect.exceptions import InvalidInputError
from esg_prefect.model.config import CPU, Config, normalize_share


@dataclass(frozen=True, slots=True)
class Node:
    """A machine with ``vcpus`` vCPUs of compute and room for ``max_workers`` worker processes.

    Compute is held only while a worker runs a batch: an idle warm worker is a
    sleeping process that uses memory (a worker slot), not CPU. GPU shares, in
    contrast, are reserved for a worker's whole life (MPS percentage and memory
    fraction are set at process start), so idle workers keep holding them.

    Args:
        name: node name.
        vcpus: vCPUs that busy workers may use at once.
        max_workers: most worker processes (busy or idle) on the node; None for no limit.
    """

    name: str
    vcpus: int
    max_workers: int | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidInputError(f"node name must be non-empty, got {self.name!r}")
        if isinstance(self.vcpus, bool) or not isinstance(self.vcpus, int) or self.vcpus < 1:
            raise InvalidInputError(f"node {self.name!r}: vcpus must be an int >= 1, got {self.vcpus!r}")
        mw = self.max_workers
        if mw is not None and (isinstance(mw, bool) or not isinstance(mw, int) or mw < 1):
            raise InvalidInputError(f"node {self.name!r}: max_workers must be an int >= 1 or None, got {mw!r}")


@dataclass(frozen=True, slots=True)
class Device:
    """One GPU on a node; its capacity is a share of 1.0.

    Args:
        device_id: unique id, e.g. ``"node0/gpu0"``.
        node: name of the node it sits in.
        hardware: GPU type, e.g. ``"T4"`` (must not be ``"cpu"``).
        max_clients: most worker processes it may hold (MPS allows 48).
    """

    device_id: str
    node: str
    hardware: str
    max_clients: int = 48

    def __post_init__(self) -> None:
        if not self.device_id or not self.node:
            raise InvalidInputError(f"device needs an id and a node, got ({self.device_id!r}, {self.node!r})")
        if not self.hardware or self.hardware == CPU:
            raise InvalidInputError(f"device {self.device_id}: hardware must be a GPU type, got {self.hardware!r}")
        if self.max_clients < 1:
            raise InvalidInputError(f"device {self.device_id}: max_clients must be >= 1, got {self.max_clients}")


@dataclass(frozen=True, slots=True)
class Worker:
    """A worker process and what it holds.

    Args:
        worker_id: unique id.
        node: node it runs on.
        device_id: GPU it holds a share of, or None for a CPU worker.
        hardware: ``"cpu"`` or the GPU type of ``device_id``.
        vcpus: vCPUs it holds.
        gpu_share: share of ``device_id`` it holds (0 for a CPU worker).
        stage: ``"workflow/stage"`` whose model is warm in it, None while starting empty.
        busy: whether it runs a batch now (or is starting).
        idle_since_ms: when it became idle (for keep-alive), if idle.
        starting: busy loading its model for a pre-warm start, with no batch
            (:class:`~esg_prefect.scheduling.base.Start`); warm and idle after.
        free_at_ms: while busy, when its batch (or load) is predicted to end, if known.
        fresh: warm from a pre-warm start and has run no batch yet.
    """

    worker_id: str
    node: str
    device_id: str | None
    hardware: str
    vcpus: int
    gpu_share: float
    stage: str | None
    busy: bool = False
    idle_since_ms: float | None = None
    starting: bool = False
    free_at_ms: float | None = None
    fresh: bool = False

    def __post_init__(self) -> None:
        if not self.worker_id or not self.node:
            raise InvalidInputError(f"worker needs an id and a node, got ({self.worker_id!r}, {self.node!r})")
        if isinstance(self.vcpus, bool) or not isinstance(self.vcpus, int) or self.vcpus < 1:
            raise InvalidInputError(f"worker {self.worker_id}: vcpus must be an int >= 1, got {self.vcpus!r}")
        object.__setattr__(self, "gpu_share", normalize_share(self.gpu_share))
        if (self.device_id is None) != (self.gpu_share == 0.0) or (self.device_id is None) != (self.hardware == CPU):
            raise InvalidInputError(
                f"worker {self.worker_id}: device_id={self.device_id!r}, hardware={self.hardware!r} and "
                f"gpu_share={self.gpu_share} disagree (CPU workers have no device, share 0, hardware 'cpu')"
            )

    def serves(self, stage: str, config: Config, hardware: str) -> bool:
        """Whether this worker is warm for ``stage`` with ``config``'s resources."""
        return (
            self.stage == stage
            and self.vcpus == config.vcpus
            and self.gpu_share == config.gpu_share
            and self.hardware == hardware
        )


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """Nodes, devices and workers at one instant.

    Raises:
        InvalidInputError: on duplicate ids, unknown nodes or devices, or a node
            or device holding more than it has.
    """

    nodes: tuple[Node, ...]
    devices: tuple[Device, ...] = ()
    workers: tuple[Worker, ...] = ()
    _index: dict[str, object] = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    def __init__(self, nodes: Iterable[Node], devices: Iterable[Device] = (), workers: Iterable[Worker] = ()) -> None:
        object.__setattr__(self, "nodes", tuple(nodes))
        object.__setattr__(self, "devices", tuple(devices))
        object.__setattr__(self, "workers", tuple(workers))
        object.__setattr__(self, "_index", {})
        node_names = [n.name for n in self.nodes]
        if len(set(node_names)) != len(node_names):
            raise InvalidInputError(f"duplicate node names in {node_names}")
        dev_ids = [d.device_id for d in self.devices]
        if len(set(dev_ids)) != len(dev_ids):
            raise InvalidInputError(f"duplicate device ids in {dev_ids}")
        devs = {d.device_id: d for d in self.devices}
        for d in self.devices:
            if d.node not in node_names:
                raise InvalidInputError(f"device {d.device_id} is on unknown node {d.node!r}")
        ids: set[str] = set()
        used_cpu = {n: 0 for n in node_names}
        count = {n: 0 for n in node_names}
        used_share = {d: 0.0 for d in devs}
        for w in self.workers:
            if w.worker_id in ids:
                raise InvalidInputError(f"duplicate worker id {w.worker_id!r}")
            ids.add(w.worker_id)
            if w.node not in used_cpu:
                raise InvalidInputError(f"worker {w.worker_id} is on unknown node {w.node!r}")
            count[w.node] += 1
            if w.busy:
                used_cpu[w.node] += w.vcpus
            if w.device_id is not None:
                dev = devs.get(w.device_id)
                if dev is None or dev.node != w.node or dev.hardware != w.hardware:
                    raise InvalidInputError(
                        f"worker {w.worker_id} names device {w.device_id!r} ({w.hardware}) not on node {w.node!r}"
                    )
                used_share[w.device_id] += w.gpu_share
        for n in self.nodes:
            if used_cpu[n.name] > n.vcpus:
                raise InvalidInputError(f"node {n.name}: busy workers hold {used_cpu[n.name]} vcpus of {n.vcpus}")
            if n.max_workers is not None and count[n.name] > n.max_workers:
                raise InvalidInputError(f"node {n.name}: {count[n.name]} workers exceed max_workers={n.max_workers}")
        clients = Counter(w.device_id for w in self.workers if w.device_id is not None)
        for dev_id, n_clients in clients.items():
            if n_clients > devs[dev_id].max_clients:
                raise InvalidInputError(
                    f"device {dev_id}: {n_clients} workers exceed its max_clients={devs[dev_id].max_clients}"
                )
        for dev_id, used in used_share.items():
            if used > 1.0 + 1e-9:
                raise InvalidInputError(f"device {dev_id}: workers hold share {used:.2f} > 1.0")

    def __hash__(self) -> int:
        return hash((self.nodes, self.devices, self.workers))

    def node(self, name: str) -> Node:
        """The node called ``name``."""
        for n in self.nodes:
            if n.name == name:
                return n
        raise InvalidInputError(f"unknown node {name!r}")

    def hardware_types(self) -> frozenset[str]:
        """``"cpu"`` plus every GPU type present."""
        return frozenset({CPU, *(d.hardware for d in self.devices)})


def cpu_cluster(nodes: int = 1, vcpus: int = 2) -> ClusterSnapshot:
    """An empty cluster of CPU-only nodes, e.g. this 2-core machine."""
    if nodes < 1:
        raise InvalidInputError(f"nodes must be >= 1, got {nodes}")
    return ClusterSnapshot([Node(f"node{i}", vcpus) for i in range(nodes)])


def gpu_cluster(nodes: int, gpus_per_node: int, hardware: str, vcpus: int = 32) -> ClusterSnapshot:
    """An empty cluster of identical GPU nodes."""
    if nodes < 1 or gpus_per_node < 0:
        raise InvalidInputError(f"need nodes >= 1 and gpus_per_node >= 0, got {nodes}, {gpus_per_node}")
    ns = [Node(f"node{i}", vcpus) for i in range(nodes)]
    ds = [Device(f"node{i}/gpu{j}", f"node{i}", hardware) for i in range(nodes) for j in range(gpus_per_node)]
    return ClusterSnapshot(ns, ds)
