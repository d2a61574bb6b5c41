"""Ray backend: workers as Ray actors, so that one pool can span many machines.

A :class:`RayBackend` connects to a Ray cluster (a local instance, ``"auto"``
or ``"ray://head:10001"``), shows its nodes and GPUs to the scheduler as
:class:`~esg_prefect.model.cluster.Node` and :class:`~esg_prefect.model.cluster.Device`
entries, and starts each worker as one Ray actor pinned to the node the ESG
dispatcher chose (``NodeAffinitySchedulingStrategy(soft=False)``: Ray never
moves it elsewhere). Ray is the cluster manager; esg-prefect only asks it for
actors of the right size, as ARCHITECTURE.md wants (no home-made cluster manager).

Resources, and how they map onto Ray's:

* **GPU share** -> fractional ``num_gpus=gpu_share``. Ray packs fractional
  actors onto one GPU up to 1.0 and sets ``CUDA_VISIBLE_DEVICES`` for each; the
  actor also caps its memory with torch's per-process memory fraction and gets
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (effective where an MPS daemon runs on
  its node, which the actor checks and reports). Like the scheduler's model, a
  share is held for the worker's whole life.
* **vCPUs** -> torch threads in the actor. ESG counts a worker's vCPUs only
  while it runs a batch (an idle warm worker holds no compute), whereas Ray
  holds ``num_cpus`` for an actor's whole life. ``cpu_reservation="busy"``
  (default) follows ESG: actors reserve no Ray CPUs, and the node's CPU count
  bounds busy vCPUs through the scheduler. ``"lifetime"`` reserves
  ``num_cpus=vcpus`` in Ray, for clusters shared with other Ray work; idle
  warm workers then keep their CPUs, and a new worker waits for Ray (up to
  ``start_timeout_s``) until idle ones expire.

Which GPU of a multi-GPU node an actor gets is Ray's choice (best fit among
the node's GPUs); on one-GPU nodes it is always the device ESG chose. The
actor reports the GPU ids Ray gave it in its ``enforcement`` string.

Failures: an actor that dies (killed, node lost, a crash in native code)
raises ``ray.exceptions.RayActorError`` and friends; :meth:`_RayWorker.execute`
turns them into :class:`~esg_prefect.runtime.workers.WorkerDiedError`, which
the pool answers by requeueing the batch's calls. An actor that dies while it
loads, or a start on a node that has left, is one too (no input ran: the
calls go back to their queue). A stage that fails to load, or an actor Ray
cannot place in time, is a :class:`~esg_prefect.runtime.workers.WorkerLoadError`.
Nodes as the scheduler sees them come from :mod:`~esg_prefect.runtime.ray_cluster`.

Inputs and outputs travel through Ray's object store, inside the trusted
cluster; stage code is imported by path on the worker's node, so every node
needs the stage modules (installed there, or shipped with ``runtime_env``).

Example::

    from esg_prefect.runtime.pool import Pool
    from esg_prefect.runtime.ray_backend import RayBackend

    pool = Pool(profile, prices, backend=RayBackend(address="auto"))
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from esg_prefect.exceptions import ConfigError, InvalidInputError
from esg_prefect.model.cluster import Device, Node
from esg_prefect.runtime.batch_output import LogLine, checked_lines
from esg_prefect.runtime.ray_cluster import NodeTable, RayNode
from esg_prefect.runtime.workers import BatchOutcome, WorkerDiedError, WorkerHandle, WorkerLoadError, WorkerSpec

logger = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'esg-prefect[ray]'"
CPU_RESERVATIONS = ("busy", "lifetime")


def import_ray() -> Any:
    """Import Ray, or say how to install it: Ray is an optional extra (a large wheel)."""
    try:
        return importlib.import_module("ray")
    except ImportError as exc:
        raise ImportError(f"the Ray backend needs Ray, which is not installed: {INSTALL_HINT}") from exc


# ---- inside the actor ------------------------------------------------------------------------


class StageActor:
    """The body of one Ray worker: one stage's model, warm across batches.

    Ray runs it in a worker process of its own on the chosen node. Its methods
    report the stage's own errors as values instead of raising them, so that an
    exception Ray delivers to the pool always means the actor itself is gone.
    """

    def __init__(self, stage_path: str, vcpus: int, gpu_share: float) -> None:
        self.stage_path = stage_path
        self.vcpus = vcpus
        self.gpu_share = gpu_share
        self.spec: Any = None
        self.model: Any = None

    def load(self) -> tuple[Any, ...]:
        """Apply the resources and load the model: ``("ready", load_ms, facts, pid, lines)`` or ``("load_error", ...)``.

        ``lines``: what loading printed or logged (:mod:`~esg_prefect.runtime.batch_output`).
        """
        from esg_prefect.runtime.batch_output import run_caught, with_output
        from esg_prefect.runtime.stages import resolve_stage

        def load() -> str:
            # The stage first: a bad path fails before torch is imported. Resolving a stage initialises
            # no CUDA, so the share still applies before the model allocates anything.
            self.spec = resolve_stage(self.stage_path)
            device, facts = _apply_resources(self.vcpus, self.gpu_share)
            self.model = self.spec.load(device)
            return str(facts)

        t0 = time.perf_counter()
        got = run_caught(load)  # a failure is reported to the pool, which fails the calls with this message
        if (failed := got.failed) is not None:
            kind, message, trace = failed
            return ("load_error", kind, message, with_output(trace, got.lines, "the model load"))
        return ("ready", (time.perf_counter() - t0) * 1000.0, got.value, os.getpid(), got.lines)

    def run(self, items: list[Any]) -> tuple[Any, ...]:
        """Run one batch: ``("ok", outputs, elapsed_ms, lines)`` or ``("error", type, message, traceback, lines)``.

        ``elapsed_ms``: the batch function's run only, as the process backend's
        worker times it (:mod:`~esg_prefect.runtime.worker_main`): it drives the
        correction's factor, and the rest (compacting the outputs, Ray's round
        trip) is the per-batch overhead. ``lines``: what the batch printed or
        logged (:mod:`~esg_prefect.runtime.batch_output`).
        """
        from esg_prefect.runtime.batch_output import run_caught
        from esg_prefect.runtime.stages import run_checked
        from esg_prefect.runtime.worker_main import compact

        t0 = time.perf_counter()
        got = run_caught(run_checked, self.spec, self.model, items)
        elapsed_ms = (time.perf_counter() - t0) * 1000.0
        if (failed := got.failed) is not None:  # the batch function's own error: reported, the actor lives on
            return ("error", *failed, got.lines)
        # Views into one batched tensor would carry the whole batch's storage into every item's object.
        return ("ok", [compact(o) for o in got.value], elapsed_ms, got.lines)

    def pid(self) -> int:
        """The actor's process id (for operators and fault tests)."""
        return os.getpid()

    def node_id(self) -> str:
        """The Ray node the actor runs on, as Ray reports it from inside (to check its placement)."""
        return str(import_ray().get_runtime_context().get_node_id())


def _apply_resources(vcpus: int, gpu_share: float) -> tuple[str, str]:
    """Set torch threads and the GPU memory fraction; return the torch device and what is enforced."""
    import torch

    from esg_prefect.runtime.gpu import mps_active

    ray = import_ray()
    torch.set_num_threads(vcpus)
    with contextlib.suppress(RuntimeError):  # already set once in this process
        torch.set_num_interop_threads(1)
    parts = [f"{vcpus} torch thread(s)"]
    gpu_ids = [str(g) for g in ray.get_gpu_ids()]
    if not gpu_ids:
        return "cpu", "; ".join(parts)
    parts.append(
        f"Ray GPU id(s) {','.join(gpu_ids)}, CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')}"
    )
    if mps_active():
        parts.append("MPS active threads " + os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100") + "%")
    else:
        parts.append("compute share logical (no MPS daemon on this node: time-sliced)")
    if torch.cuda.is_available() and 0 < gpu_share < 1:
        torch.cuda.set_per_process_memory_fraction(gpu_share, 0)
        parts.append(f"memory fraction {gpu_share:.2f}")
    return "cuda", "; ".join(parts)


# ---- in the pool's process -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RayPlacement:
    """Where a worker runs: its node (the scheduler's name, Ray's id) and its actor's process id (0 while loading)."""

    node: str
    node_id: str
    pid: int


async def _result(ref: Any) -> Any:
    """Await a Ray object ref on the running loop (whichever thread runs it)."""
    return await asyncio.wrap_future(ref.future())


def _brief(exc: BaseException) -> str:
    """First line of a Ray error: its full text repeats the actor's whole description."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


class _RayWorker:
    """The pool's handle on one actor."""

    out_of_process = True

    def __init__(self, backend: RayBackend, spec: WorkerSpec, actor: Any, node: RayNode, resources: str) -> None:
        self.spec = spec
        self.actor = actor
        self.node = node
        self.load_ms = 0.0
        self.load_lines: tuple[LogLine, ...] = ()  # what loading its model printed or logged
        self.pid = 0  # the actor's process, once loaded
        self.enforcement = resources
        self._backend = backend

    async def execute(self, items: list[Any]) -> BatchOutcome:
        ray = self._backend.ray
        try:
            reply = await _result(self.actor.run.remote(items))
        except ray.exceptions.RayTaskError as exc:
            # The method failed around the batch function (e.g. outputs Ray cannot serialise); the actor lives.
            return BatchOutcome(False, [], 0.0, type(exc).__name__, _brief(exc), str(exc))
        except ray.exceptions.RayError as exc:
            self.kill()  # dead already, or unreachable: the pool drops this worker without stopping it
            self._backend.reread_soon()  # its node may have left: the next nodes() asks Ray
            raise WorkerDiedError(
                f"Ray worker {self.spec.worker_id} on node {self.node.name} died: {_brief(exc)}"
            ) from exc
        if reply[0] == "ok":
            return BatchOutcome(True, list(reply[1]), float(reply[2]), lines=checked_lines(reply[3]))
        return BatchOutcome(False, [], 0.0, str(reply[1]), str(reply[2]), str(reply[3]), checked_lines(reply[4]))

    def kill(self) -> None:
        """Kill the actor now (no restart) and forget it; harmless if it is already dead."""
        self._backend.forget(self.spec.worker_id)
        with contextlib.suppress(Exception):  # Ray may be shut down or the actor long gone: nothing left to free
            self._backend.ray.kill(self.actor, no_restart=True)

    async def stop(self) -> None:
        self.kill()


class RayBackend:
    """Workers as Ray actors on a Ray cluster, pinned to the node and sized as ESG chose.

    Args:
        address: Ray cluster to join: None starts (or reuses) a local instance,
            ``"auto"`` joins the cluster this machine belongs to (``ray start``),
            ``"ray://host:10001"`` goes through Ray Client. If Ray is already
            initialised in this process, that connection is used as it is.
        namespace: Ray namespace of the actors.
        init_kwargs: more ``ray.init`` arguments, e.g. ``runtime_env`` to ship
            stage code to the nodes.
        max_workers_per_node: most workers (actors) per node; each holds a
            model in memory.
        cpu_reservation: ``"busy"`` (actors reserve no Ray CPUs; ESG bounds busy
            vCPUs per node, as in its model) or ``"lifetime"`` (``num_cpus=vcpus``
            held by each actor for its whole life, and billed for it: the pool
            sets ``idle_vcpus``).
        start_timeout_s: how long a new actor may wait for Ray to place it and
            load its model before the start fails.
        refresh_s: how often the node list is read again from Ray (nodes join
            and leave a Ray cluster).
        gpu_type: GPU type of every GPU (e.g. ``"T4"``) where Ray does not report one.

    Raises:
        ImportError: when Ray is not installed, naming the extra to install.
        InvalidInputError: on a bad argument, naming it.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        namespace: str = "esg-prefect",
        init_kwargs: dict[str, Any] | None = None,
        max_workers_per_node: int = 16,
        cpu_reservation: str = "busy",
        start_timeout_s: float = 300.0,
        refresh_s: float = 5.0,
        gpu_type: str | None = None,
    ) -> None:
        if cpu_reservation not in CPU_RESERVATIONS:
            raise InvalidInputError(f"cpu_reservation must be 'busy' or 'lifetime', got {cpu_reservation!r}")
        if isinstance(max_workers_per_node, bool) or not isinstance(max_workers_per_node, int):
            raise InvalidInputError(f"max_workers_per_node must be an int >= 1, got {max_workers_per_node!r}")
        if max_workers_per_node < 1:
            raise InvalidInputError(f"max_workers_per_node must be an int >= 1, got {max_workers_per_node!r}")
        if not start_timeout_s > 0 or not refresh_s > 0:
            raise InvalidInputError(f"start_timeout_s and refresh_s must be > 0, got {start_timeout_s}, {refresh_s}")
        self.ray = import_ray()
        self._owns_ray = not self.ray.is_initialized()
        if self._owns_ray:
            try:
                self.ray.init(address=address, namespace=namespace, **(init_kwargs or {}))
            except (ConnectionError, TimeoutError) as exc:  # no cluster there: the caller names its own remedy
                why = (str(exc).strip().splitlines() or [type(exc).__name__])[0].split(". ")[0].rstrip(".")
                raise ConfigError(f"cannot join the Ray cluster at {address!r}: {why}") from None
        self.cpu_reservation = cpu_reservation
        self.holds_idle_vcpus = cpu_reservation == "lifetime"  # the pool then bills idle vCPUs (idle_vcpus)
        self._max_workers = max_workers_per_node
        self._start_timeout_s = start_timeout_s
        self._refresh_s = refresh_s
        self._actor_cls = self.ray.remote(StageActor)
        # Guards the node table, the published view and the live-worker map: the pool's loop reads and
        # changes them, operators and tests read them from other threads.
        self._lock = threading.RLock()
        self._table = NodeTable(gpu_type)
        self._view: tuple[tuple[Node, ...], tuple[Device, ...]] = ((), ())
        self._live: dict[str, _RayWorker] = {}
        self._refreshed_s = float("-inf")
        self._warned: set[str] = set()
        self.refresh()
        if not self._view[0]:
            raise WorkerLoadError("the Ray cluster has no live node with a CPU: nowhere to run workers")

    # ---- the cluster as ESG sees it -------------------------------------------------------

    def refresh(self) -> None:
        """Read the node list from Ray now and publish the nodes and GPUs the scheduler sees.

        A node that has left is no longer offered; the pool keeps it in its own view while a
        batch of its still runs there, and a start aimed at it fails at once.
        """
        infos = self.ray.nodes()
        with self._lock:
            for node in self._table.read(infos):
                logger.warning(
                    "esg-prefect: Ray node %s (%s) left the cluster; calls that ran on its workers go back to "
                    "their queues",
                    node.name,
                    node.node_id[:8],
                )
            self._view = self._table.view(self._max_workers)
            self._refreshed_s = time.monotonic()

    def reread_soon(self) -> None:
        """Make the next :meth:`nodes` read Ray again (a worker died: its node may have left)."""
        with self._lock:
            self._refreshed_s = float("-inf")

    def nodes(self) -> tuple[Node, ...]:
        if time.monotonic() - self._refreshed_s > self._refresh_s:
            self.refresh()
        return self._view[0]

    def devices(self) -> tuple[Device, ...]:
        # The same view as the last nodes() call: a snapshot never names a device of an unlisted node.
        return self._view[1]

    def node_ids(self) -> dict[str, str]:
        """Every node seen, alive or not: the scheduler's name for it -> its Ray node id."""
        with self._lock:
            return self._table.ids()

    def actors(self) -> dict[str, Any]:
        """The Ray actor handle of every live worker, by worker id (for operators and fault tests)."""
        with self._lock:
            return {wid: w.actor for wid, w in self._live.items()}

    def placements(self) -> dict[str, RayPlacement]:
        """Where every live worker runs, by worker id (for operators, placement and fault tests).

        Read without calling the actors, so it answers while they run batches.
        """
        with self._lock:
            return {wid: RayPlacement(w.node.name, w.node.node_id, w.pid) for wid, w in self._live.items()}

    def forget(self, worker_id: str) -> None:
        """Drop a worker from the live set (it was stopped or died)."""
        with self._lock:
            self._live.pop(worker_id, None)

    # ---- workers ----------------------------------------------------------------------------

    async def start(self, spec: WorkerSpec) -> WorkerHandle:
        with self._lock:
            node = self._table.named(spec.node)
        if not node.alive:
            # Not the stage's fault: the calls go back to their queue, and the node is no longer offered.
            raise WorkerDiedError(
                f"Ray node {node.name} ({node.node_id[:8]}) has left the cluster; worker {spec.worker_id} not started"
            )
        ray = self.ray
        num_cpus = spec.vcpus if self.cpu_reservation == "lifetime" else 0
        num_gpus = spec.gpu_share if spec.device_id is not None else 0
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        options: dict[str, Any] = {
            "num_cpus": num_cpus,
            "num_gpus": num_gpus,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(node.node_id, soft=False),
            "max_restarts": 0,  # a restarted actor would have lost its model; the pool starts a new worker
            "max_concurrency": 1,
        }
        if num_gpus:
            # Read by the CUDA driver when the actor's process first touches CUDA; a no-op without MPS.
            share_pct = str(max(1, round(spec.gpu_share * 100)))
            options["runtime_env"] = {"env_vars": {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": share_pct}}
        held = "held for its life" if num_cpus else "ESG counts vCPUs only while busy"
        resources = f"Ray actor on node {node.name}: num_cpus={num_cpus} ({held}), num_gpus={num_gpus:g}"
        actor = self._actor_cls.options(**options).remote(spec.stage_path, spec.vcpus, spec.gpu_share)
        worker = _RayWorker(self, spec, actor, node, resources)
        with self._lock:
            self._live[spec.worker_id] = worker  # close() kills it even while it is still loading
        try:
            reply = await asyncio.wait_for(_result(actor.load.remote()), timeout=self._start_timeout_s)
        except TimeoutError:
            worker.kill()
            raise WorkerLoadError(
                f"Ray did not start worker {spec.worker_id} for {spec.stage_path!r} on node {node.name} within "
                f"{self._start_timeout_s:g} s (needs num_cpus={num_cpus}, num_gpus={num_gpus:g}; "
                "`ray status` shows what holds the node's resources)"
            ) from None
        except ray.exceptions.RayError as exc:
            # The actor died (or could not be placed: its node left) before any input ran: as a local
            # worker process that dies loading, the calls go back to their queue.
            worker.kill()
            self.reread_soon()
            raise WorkerDiedError(
                f"Ray worker {spec.worker_id} for {spec.stage_path!r} on node {node.name} died while loading: "
                f"{_brief(exc)}"
            ) from exc
        if reply[0] == "load_error":
            worker.kill()
            raise WorkerLoadError(
                f"stage {spec.stage_path!r} failed to load on Ray node {node.name}: {reply[1]}: {reply[2]}\n{reply[3]}"
            )
        worker.load_ms = float(reply[1])
        worker.pid = int(reply[3])
        worker.load_lines = checked_lines(reply[4]) if len(reply) > 4 else ()
        worker.enforcement = f"{resources}; {reply[2]}"
        if num_gpus and "MPS active threads" not in reply[2] and "gpu-share" not in self._warned:
            self._warned.add("gpu-share")
            logger.warning(
                "esg-prefect: no MPS daemon on Ray node %s; GPU shares are logical (time-sliced) and memory "
                "fractions are enforced by torch. Start nvidia-cuda-mps-control -d on GPU nodes to enforce "
                "compute shares.",
                node.name,
            )
        return worker

    async def close(self) -> None:
        # Synchronous on purpose (as LocalProcessBackend): close may run at interpreter exit.
        with self._lock:
            workers = list(self._live.values())
        for w in workers:
            w.kill()
        if self._owns_ray and self.ray.is_initialized():
            self.ray.shutdown()
