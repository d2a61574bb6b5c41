"""The Stash differential runs, one source of delay at a time (ESG-SPEC section 7).

Stash (ICDCS '23) profiles stalls by running the same work with one source of
delay added at a time and attributing each difference to that source. For one
stage at one configuration (batch ``b``, ``vcpus``, ``gpu_share``) the
profiler measures, in a warm worker:

``compute``
    the batch function alone, on inputs already where the model is (on a GPU:
    moved to the device beforehand);
``h2d``
    + the host-to-device copy: the same calls on host-resident inputs, minus
    ``compute``. Not applicable on the CPU (reported as 0, ``n/a``);
``interference``
    + co-located tenants at the same share: ``k`` copies of the stage run at
    once in separate processes (:mod:`esg_prefect.profiler.interference`);
    the stall is ``compute * (slowdown - 1)``;
``transfer``
    + data passed from another worker: the batch's inputs and outputs pickled
    over a pipe to a separate process and acknowledged, exactly as the pool
    sends them (:func:`esg_prefect.runtime.worker_main.dumps`);
``queueing``
    + queueing under a real arrival trace: the stage serves a replay of the
    trace (scaled to ``utilisation`` of its batch-``b`` capacity) with real
    calls, batching up to ``b`` waiting items when it frees up; the stall is
    the mean wait of an item before its batch starts. Idle gaps are skipped,
    not slept (the worker's clock jumps to the next arrival), so the replay
    costs only its compute time;
``cold_start``
    + cold start: worker start, model build and first call, paid by the first
    request on a fresh worker.

The functions here run inside the profiler's worker process.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import pickle
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from esg_prefect.exceptions import InvalidInputError
from esg_prefect.profiler.measure import sync, time_call
from esg_prefect.profiler.targets import PreparedStage

DEFAULT_TRACE = "azure_llm_conv"


@dataclass(frozen=True, slots=True)
class QueueReplay:
    """What one trace replay measured: per-item waits and the batches formed."""

    trace: str
    rate_per_s: float
    requests: int
    mean_wait_ms: float
    p95_wait_ms: float
    mean_batch: float
    busy_ms: float


def _echo(conn: Connection) -> None:
    """The far end of the transfer probe: unpickle each message as a worker would, acknowledge it."""
    while True:
        try:
            data = conn.recv_bytes()
        except EOFError:
            return
        if data == b"stop":
            return
        pickle.loads(data)
        conn.send_bytes(b"k")


class TransferProbe:
    """A separate process that receives pickled batches over a pipe, as a pool worker does.

    Use as a context manager; :meth:`round_trip_ms` times one send and its acknowledgement.
    """

    def __init__(self) -> None:
        ctx = mp.get_context("spawn")  # a clean child: never fork a process whose OpenMP threads are running
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_echo, args=(child,), daemon=True)
        self._proc.start()
        child.close()

    def __enter__(self) -> TransferProbe:
        self.round_trip_ms(b"warm")  # the child imports torch on its first tensor: not timed
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(OSError):
            self._conn.send_bytes(b"stop")
        self._proc.join(timeout=10)
        self._conn.close()

    def round_trip_ms(self, obj: Any) -> float:
        """Milliseconds to pickle ``obj`` like the pool, send it, and have it unpickled on the far side."""
        from esg_prefect.runtime.worker_main import dumps

        t0 = time.perf_counter()
        self._conn.send_bytes(dumps(obj))
        self._conn.recv_bytes()
        return (time.perf_counter() - t0) * 1000.0


def transfer_ms(stage: PreparedStage, batch: int, probe: TransferProbe, reps: int = 5) -> tuple[float, float]:
    """Mean ms to pass one batch's inputs to a worker and its outputs back; and the bytes per batch."""
    from esg_prefect.runtime.worker_main import dumps

    if reps < 1:
        raise InvalidInputError(f"reps must be >= 1, got {reps}")
    items = stage.next_batch(batch)
    outputs = list(stage.target.run(stage.model, items))
    probe.round_trip_ms(("run", "b0", items))  # first of its kind: page faults, not the steady cost
    times = []
    for _ in range(reps):
        times.append(probe.round_trip_ms(("run", "b0", items)) + probe.round_trip_ms(("ok", "b0", outputs, 0.0)))
    size = len(dumps(("run", "b0", items))) + len(dumps(("ok", "b0", outputs, 0.0)))
    return statistics.fmean(times), float(size)


def _to_device(obj: Any, device: str) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: _to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        moved = [_to_device(v, device) for v in obj]
        return moved if isinstance(obj, list) else tuple(moved)
    return obj


def h2d_ms(stage: PreparedStage, batch: int, device: str, reps: int = 5) -> tuple[float, float] | None:
    """``(compute on device-resident inputs, compute on host inputs)`` in ms; None on the CPU.

    The difference is the host-to-device copy as the stage pays it (its batch
    function moves what it needs). Stages whose batch function cannot take
    device-resident inputs fall back to timing the copy itself.
    """
    if not device.startswith("cuda"):
        return None
    resident, host = [], []
    for _ in range(reps):
        items = stage.next_batch(batch)
        host.append(time_call(stage, items, device))
        on_dev = _to_device(items, device)
        sync(device)
        try:
            resident.append(time_call(stage, on_dev, device))
        except (RuntimeError, TypeError):
            t0 = time.perf_counter()
            _to_device(items, device)
            sync(device)
            copy = (time.perf_counter() - t0) * 1000.0
            resident.append(max(host[-1] - copy, 0.0))
    return statistics.fmean(resident), statistics.fmean(host)


def replay_queue(
    stage: PreparedStage,
    batch: int,
    compute_ms: float,
    *,
    trace: str = DEFAULT_TRACE,
    utilisation: float = 0.7,
    requests: int = 48,
    seed: int = 0,
    device: str = "cpu",
) -> QueueReplay:
    """Serve a real arrival trace with real calls and measure how long items wait.

    Args:
        stage: the warm stage.
        batch: the largest batch the server forms.
        compute_ms: the stage's measured mean at ``batch`` (sets the arrival rate).
        trace: a trace of :func:`esg_prefect.workload.arrivals.trace_names`.
        utilisation: offered load as a fraction of the batch-``batch`` throughput.
        requests: arrivals to replay (at least this many are drawn).
        seed: picks the window of the trace.

    Raises:
        InvalidInputError: on a utilisation outside (0, 1.5] or fewer than 2 requests.
    """
    from esg_prefect.workload.arrivals import arrivals

    if not 0 < utilisation <= 1.5:
        raise InvalidInputError(f"utilisation must be in (0, 1.5], got {utilisation}")
    if requests < 2:
        raise InvalidInputError(f"requests must be >= 2, got {requests}")
    rate = utilisation * batch / (max(compute_ms, 1e-3) / 1000.0)
    duration = requests / rate
    times: list[float] = []
    for attempt in range(6):  # a bursty window may hold fewer arrivals than the mean rate promises
        times = [t for t, _ in arrivals(trace, ["stage"], rate, duration * (2**attempt), seed)]
        if len(times) >= requests:
            break
    times = sorted(times)[:requests]
    if len(times) < 2:
        raise InvalidInputError(f"trace {trace!r} gave {len(times)} arrivals; need at least 2")
    waits: list[float] = []
    sizes: list[int] = []
    busy = 0.0
    now = times[0]
    i = 0
    while i < len(times):
        now = max(now, times[i])
        taken = [t for t in times[i : i + batch] if t <= now]
        items = stage.next_batch(len(taken))
        ms = time_call(stage, items, device)
        waits += [now - t for t in taken]
        sizes.append(len(taken))
        busy += ms
        now += ms
        i += len(taken)
    waits_sorted = sorted(waits)
    p95 = waits_sorted[min(len(waits_sorted) - 1, int(0.95 * len(waits_sorted)))]
    return QueueReplay(trace, rate, len(times), statistics.fmean(waits), p95, statistics.fmean(sizes), busy)


def corun_slot(stage: PreparedStage, batch: int, until: float, device: str) -> list[float]:
    """Call the stage back to back until wall time ``until`` (``time.time()``); the calls' ms.

    Every co-running copy calls this over the same wall-clock slot, so the
    calls overlap. At least one call is made.
    """
    out: list[float] = []
    while not out or time.time() < until:
        out.append(time_call(stage, stage.next_batch(batch), device))
    return out


def stage_by_name(stages: Sequence[PreparedStage], name: str) -> PreparedStage:
    """The prepared stage called ``name``.

    Raises:
        InvalidInputError: naming the stages present.
    """
    for st in stages:
        if st.name == name:
            return st
    raise InvalidInputError(f"no stage {name!r} among {[s.name for s in stages]}")
