"""Worker backends: where batches run.

One interface (``WorkerBackend.start -> WorkerHandle``, ``WorkerHandle.execute``)
with two implementations here:

* :class:`LocalProcessBackend`: one OS process per worker, bound to
  (device, gpu_share, vcpus), its model warm across batches; spare processes
  with torch already imported keep Python's own start-up out of cold starts.
* :class:`InlineBackend`: workers are threads of this process. For tests and
  notebooks; a crash cannot be isolated there.

The Ray backend for multi-node pools lives in its own module.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing as mp
import os
import signal
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing import forkserver
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Protocol

from esg_prefect.exceptions import ESGError, InvalidInputError
from esg_prefect.model.cluster import Device, Node
from esg_prefect.runtime.batch_output import LogLine, checked_lines, run_caught, with_output
from esg_prefect.runtime.gpu import discover_gpus, mps_active, share_environment
from esg_prefect.runtime.stages import StageSpec, resolve_stage, run_checked
from esg_prefect.runtime.worker_main import POOL_PID_ENV, compact, dumps, recv, send, worker_main

logger = logging.getLogger(__name__)


class WorkerDiedError(ESGError):
    """The worker process exited while it held a batch."""


class WorkerLoadError(ESGError):
    """The worker could not load its stage's model."""


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """What a worker says about one batch: outputs, or the batch function's error."""

    ok: bool
    outputs: list[Any]
    elapsed_ms: float
    error_type: str = ""
    error_message: str = ""
    error_traceback: str = ""
    lines: tuple[LogLine, ...] = ()
    """What the batch printed or logged (:mod:`~esg_prefect.runtime.batch_output`)."""


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """Where and with what a worker runs."""

    worker_id: str
    stage_path: str
    node: str
    device_id: str | None
    hardware: str
    vcpus: int
    gpu_share: float


class WorkerHandle(Protocol):
    """A started worker with its model loaded."""

    spec: WorkerSpec
    load_ms: float
    enforcement: str
    load_lines: tuple[LogLine, ...]
    """What loading its model printed or logged: for the calls of its first batch, or the pool's log."""
    out_of_process: bool
    """Whether its batches cross a process boundary: their round trip then costs more than the worker's own
    ``BatchOutcome.elapsed_ms`` (pipe, pickling), an overhead the online correction learns apart."""

    async def execute(self, items: list[Any]) -> BatchOutcome:
        """Run one batch. Raises WorkerDiedError if the worker dies meanwhile."""
        ...

    async def stop(self) -> None:
        """Stop the worker and free its resources."""
        ...


class WorkerBackend(Protocol):
    """Starts workers on the nodes and devices it manages."""

    def nodes(self) -> tuple[Node, ...]:
        """The nodes workers can run on."""
        ...

    def devices(self) -> tuple[Device, ...]:
        """The GPUs workers can hold shares of."""
        ...

    async def start(self, spec: WorkerSpec) -> WorkerHandle:
        """Start a worker and load its model. Raises WorkerLoadError."""
        ...

    async def close(self) -> None:
        """Stop everything this backend started."""
        ...


# ---- local processes -----------------------------------------------------------------------


class _LocalWorker:
    """A worker process and the parent's end of its pipe."""

    out_of_process = True

    def __init__(self, spec: WorkerSpec, proc: BaseProcess, conn: Connection) -> None:
        self.spec = spec
        self.proc = proc
        self.conn = conn
        self.load_ms = 0.0
        self.enforcement = ""
        self.load_lines: tuple[LogLine, ...] = ()  # what loading its model printed or logged
        self._batch = 0

    def _roundtrip(self, msg: tuple[Any, ...] | bytes) -> tuple[Any, ...]:
        try:
            if isinstance(msg, bytes):
                self.conn.send_bytes(msg)  # pickled by the caller with dumps()
            else:
                send(self.conn, msg)
            while not self.conn.poll(0.05):
                if not self.proc.is_alive():
                    raise WorkerDiedError(f"worker {self.spec.worker_id} {self._how()}")
            reply: tuple[Any, ...] = recv(self.conn)
            return reply
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError) as exc:
            raise WorkerDiedError(f"worker {self.spec.worker_id} {self._how()} ({exc!r})") from exc

    def _how(self) -> str:
        """How the worker process ended: its exit code, or the signal that killed it."""
        self.proc.join(timeout=1.0)
        code = self.proc.exitcode
        if code is None:
            return "closed its pipe"
        if code >= 0:
            return f"exited with code {code}"
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        oom = " (out of memory? the kernel's OOM killer sends SIGKILL)" if -code == signal.SIGKILL else ""
        return f"was killed by {name}{oom}"

    async def load(self, device: str) -> None:
        reply = await asyncio.to_thread(
            self._roundtrip, ("load", self.spec.stage_path, self.spec.vcpus, self.spec.gpu_share, device)
        )
        if reply[0] == "load_error":
            self.proc.join(timeout=5)
            raise WorkerLoadError(f"stage {self.spec.stage_path!r} failed to load: {reply[1]}: {reply[2]}\n{reply[3]}")
        self.load_ms, self.enforcement = float(reply[1]), str(reply[2])
        self.load_lines = checked_lines(reply[3]) if len(reply) > 3 else ()

    async def execute(self, items: list[Any]) -> BatchOutcome:
        self._batch += 1
        try:
            msg = dumps(("run", self._batch, items))
        except Exception as exc:  # inputs that cannot travel to the worker fail the batch here, not the worker
            why = f"the stage's inputs cannot be sent to its worker process (they must pickle): {exc}"
            return BatchOutcome(False, [], 0.0, type(exc).__qualname__, why, traceback.format_exc())
        reply = await asyncio.to_thread(self._roundtrip, msg)
        if reply[0] == "ok":
            return BatchOutcome(True, list(reply[2]), float(reply[3]), lines=checked_lines(reply[4]))
        return BatchOutcome(False, [], 0.0, str(reply[2]), str(reply[3]), str(reply[4]), checked_lines(reply[5]))

    def stop_now(self) -> None:
        """Ask the worker to exit, kill it if it does not within 2 s (blocking)."""
        with contextlib.suppress(BrokenPipeError, OSError):
            send(self.conn, ("stop",))
        self.proc.join(timeout=2)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=2)
        self.conn.close()

    async def stop(self) -> None:
        await asyncio.to_thread(self.stop_now)


def _start_fork_server() -> None:
    """Start multiprocessing's fork server now (a no-op once it runs), so that it imports while the pool waits.

    ``ensure_running`` only launches the server (it imports its preload on its
    own, and a worker start waits for that); a failure here is left to the
    first worker start, which tries again and reports it to the calls.
    """
    try:
        forkserver.ensure_running()
    except Exception as exc:  # e.g. no Unix sockets here: the first start raises it where it is seen
        logger.debug("esg-prefect: the fork server did not start ahead of the first worker: %r", exc)


class LocalProcessBackend:
    """Workers as local processes, forked from a pre-imported server, with spare processes.

    Workers are started by multiprocessing's *forkserver* where the platform has
    one (Linux, macOS): a server process imports ``preload`` once, and every
    worker is a fork of it, so a cold start costs the model load only (about
    0.1 s of CPU here instead of 3-5 s for a spawned interpreter importing torch
    and prefect). The fork server holds no threads and never touches CUDA, so
    forking it is safe; each worker applies its own CUDA_VISIBLE_DEVICES and MPS
    share before torch initialises CUDA. The fork server is one per Python
    process, started in the background when the first backend is created (its
    imports take seconds, which the first cold start would otherwise wait for):
    that backend fixes its ``preload``.

    Args:
        vcpus: vCPUs of this node that busy workers may use at once; default
            all cores (Prefect, its API and the pool's controller share them
            through the OS scheduler).
        max_worker_vcpus: most vCPUs (torch threads) one worker gets; default
            half the node's, at least 1, so that two batches can always run at
            once. Batches are not preempted: a worker holding every core for a
            long batch (a 0.8 s summarizer call) makes every other stage's
            queue wait behind it. Measured on the 2-core development machine
            (``bench/runtime_throughput.py --slo-only 1.0``, 40 requests, three
            seeds, other jobs running): with one core for workers of up to 1
            vCPU (the earlier default), ESG met its SLOs 2 to 8 points below
            the thread pool; with two cores and workers of 1 vCPU, -7 to +2;
            with two cores and workers of up to 2 vCPUs, 38 % against 78 %.
        max_workers: most worker processes alive at once (memory bound, a few
            hundred MB each with torch); idle warm workers count, and ESG
            evicts the least recently used.
        spares: processes kept ready with torch imported, so a cold start
            costs the model load only; started in the background when the pool starts.
        preload: modules imported ahead (in the fork server, or in each spare when
            spawning): torch, and prefect, which stage modules import; add the
            modules that define your stages to make cold starts the model load only.
        node_name: the name of this node in cluster snapshots.
        start_method: ``"forkserver"`` (default where available) or ``"spawn"``.
    """

    def __init__(
        self,
        vcpus: int | None = None,
        max_workers: int = 16,
        spares: int = 2,
        preload: tuple[str, ...] = ("torch", "prefect"),
        node_name: str = "local",
        start_method: str | None = None,
        max_worker_vcpus: int | None = None,
    ) -> None:
        self._node = Node(node_name, vcpus or os.cpu_count() or 1, max_workers)
        if max_worker_vcpus is not None and (
            isinstance(max_worker_vcpus, bool) or not isinstance(max_worker_vcpus, int) or max_worker_vcpus < 1
        ):
            raise InvalidInputError(f"max_worker_vcpus must be an int >= 1 or None, got {max_worker_vcpus!r}")
        self.max_worker_vcpus: int = max_worker_vcpus or max(1, self._node.vcpus // 2)
        gpus = discover_gpus()
        self._gpu_index = {f"{node_name}/gpu{g.index}": g.index for g in gpus}
        self._devices = tuple(Device(f"{node_name}/gpu{g.index}", node_name, g.hardware) for g in gpus)
        self._mps = mps_active() if gpus else False
        if not gpus:
            logger.info("esg-prefect: no GPU found, workers run on the CPU (a share is a thread count there)")
        elif not self._mps:
            logger.warning(
                "esg-prefect: no MPS daemon found; GPU shares are logical (time-sliced) and memory fractions "
                "are enforced by torch. Start nvidia-cuda-mps-control -d to enforce compute shares."
            )
        self._spares_wanted = spares
        self._preload = preload
        method = start_method or ("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")
        if method not in ("forkserver", "spawn"):
            raise InvalidInputError(f"start_method must be 'forkserver' or 'spawn', got {start_method!r}")
        self._ctx: Any = mp.get_context(method)  # ForkServerContext or SpawnContext
        if method == "forkserver":
            self._ctx.set_forkserver_preload([*preload, "esg_prefect.runtime.worker_main"])
            threading.Thread(target=_start_fork_server, name="esg-forkserver-start", daemon=True).start()
        self.start_method = method
        self._spares: list[tuple[BaseProcess, Connection]] = []
        self._closing = False  # set by close(): no spare is started after it
        self._lock = threading.Lock()  # guards _spares: filled from worker threads, taken from the pool loop
        self._all: list[_LocalWorker] = []

    def nodes(self) -> tuple[Node, ...]:
        return (self._node,)

    def devices(self) -> tuple[Device, ...]:
        return self._devices

    def _spawn(self, env: dict[str, str] | None = None) -> tuple[BaseProcess, Connection]:
        parent, child = self._ctx.Pipe()
        env = {**(env or {}), POOL_PID_ENV: str(os.getpid())}  # the worker exits when this process goes
        proc = self._ctx.Process(target=worker_main, args=(child, self._preload, env), daemon=True)
        proc.start()
        child.close()
        if not parent.poll(120):
            proc.kill()
            raise WorkerLoadError("a new worker process did not start within 120 s")
        try:
            recv(parent)  # ("spare",)
        except (EOFError, OSError):
            proc.join(5)
            code = proc.exitcode
            if code is not None and code < 0:  # killed by a signal (the interpreter exiting, an operator)
                raise WorkerLoadError(f"a new worker process was killed while starting (signal {-code})") from None
            raise WorkerLoadError(
                f"a new worker process exited while starting (exit code {code}); its error is on "
                "stderr. Most often the main script runs flows when imported: put that code under "
                "`if __name__ == '__main__':` (worker processes import the script)"
            ) from None
        return proc, parent

    def _refill_quietly(self) -> None:
        """:meth:`_refill` on a background thread: a spare that fails to start is logged, not raised (the next
        cold start spawns its own, and reports its failure to the calls); none is started once closing."""
        try:
            self._refill()
        except WorkerLoadError as exc:
            if not self._closing:
                logger.warning("a spare worker process did not start: %s", exc)

    def _refill(self) -> None:
        with self._lock:
            missing = 0 if self._closing else self._spares_wanted - len(self._spares)
        for _ in range(max(0, missing)):
            spare = self._spawn({"CUDA_VISIBLE_DEVICES": ""} if not self._devices else None)
            with self._lock:
                self._spares.append(spare)

    async def warm_up(self) -> None:
        """Start the spare processes now instead of at the first cold start."""
        await asyncio.to_thread(self._refill)

    async def start(self, spec: WorkerSpec) -> WorkerHandle:
        device = "cpu"
        spare = None
        if spec.device_id is None:
            with self._lock:
                while self._spares and spare is None:
                    cand = self._spares.pop()
                    spare = cand if cand[0].is_alive() else None
        if spare is None:
            idx = self._gpu_index.get(spec.device_id or "")
            env = share_environment(idx, spec.gpu_share, self._mps)
            spare = await asyncio.to_thread(self._spawn, env)
            device = "cuda" if idx is not None else "cpu"
        worker = _LocalWorker(spec, spare[0], spare[1])
        self._all.append(worker)
        if self._spares_wanted:
            threading.Thread(target=self._refill_quietly, name="esg-spare-refill", daemon=True).start()
        try:
            await worker.load(device)
        except WorkerDiedError as exc:  # killed, not a failing loader: the pool starts another worker
            raise WorkerDiedError(f"worker {spec.worker_id} died while loading {spec.stage_path!r}: {exc}") from exc
        return worker

    def pids(self) -> dict[str, int]:
        """Process id of every live worker, by worker id (for operators and fault tests)."""
        return {w.spec.worker_id: w.proc.pid for w in self._all if w.proc.is_alive() and w.proc.pid is not None}

    async def close(self) -> None:
        # Synchronous on purpose: at interpreter exit no new threads can be started.
        self._closing = True
        for w in list(self._all):
            if w.proc.is_alive():
                w.stop_now()
        self._all.clear()
        with self._lock:
            spares, self._spares = self._spares, []
        for proc, conn in spares:
            proc.kill()
            proc.join(timeout=2)
            conn.close()


# ---- in-process threads ----------------------------------------------------------------------


class _InlineWorker:
    out_of_process = False  # a batch's round trip is the model's own time: no overhead to learn

    def __init__(
        self, spec: WorkerSpec, stage: StageSpec, model: Any, load_ms: float, load_lines: tuple[LogLine, ...] = ()
    ) -> None:
        self.spec = spec
        self.stage = stage
        self.model = model
        self.load_ms = load_ms
        self.load_lines = load_lines
        self.enforcement = "inline thread (no isolation)"

    async def execute(self, items: list[Any]) -> BatchOutcome:
        def _run() -> BatchOutcome:
            t0 = time.perf_counter()
            # Each output its own tensors, not views of the batch's: a view keeps the whole batch
            # alive in its task run, and persisting it writes other flow runs' outputs too.
            got = run_caught(run_checked, self.stage, self.model, items)
            if (failed := got.failed) is not None:  # the batch function's own error, as a process worker's
                return BatchOutcome(False, [], 0.0, *failed, got.lines)
            return BatchOutcome(True, compact(got.value), (time.perf_counter() - t0) * 1000.0, lines=got.lines)

        return await asyncio.to_thread(_run)

    async def stop(self) -> None:
        self.model = None


_inline_load_lock = threading.Lock()  # serialises inline model loads (see InlineBackend.start)


class InlineBackend:
    """Workers as threads of this process: fast to start, no fault isolation.

    Args:
        vcpus: compute of the one node (default: all cores).
        max_workers: most workers at once.
    """

    def __init__(self, vcpus: int | None = None, max_workers: int = 16) -> None:
        self._node = Node("inline", vcpus or os.cpu_count() or 1, max_workers)

    def nodes(self) -> tuple[Node, ...]:
        return (self._node,)

    def devices(self) -> tuple[Device, ...]:
        return ()

    async def start(self, spec: WorkerSpec) -> WorkerHandle:
        def _load() -> _InlineWorker:
            t0 = time.perf_counter()
            stage = resolve_stage(spec.stage_path)

            def load() -> Any:
                # One load at a time: loaders commonly seed torch's global RNG, which threads share,
                # so two concurrent loads would interleave their draws and get different weights.
                with _inline_load_lock:
                    return stage.load("cpu")

            got = run_caught(load)
            if got.error is not None:  # surfaced to the calls as a load failure
                shown = with_output("", got.lines, "the model load").strip()
                raise WorkerLoadError(
                    f"stage {spec.stage_path!r} failed to load: {got.error!r}" + (f"\n{shown}" if shown else "")
                ) from got.error
            return _InlineWorker(spec, stage, got.value, (time.perf_counter() - t0) * 1000.0, got.lines)

        return await asyncio.to_thread(_load)

    async def close(self) -> None:
        return None
