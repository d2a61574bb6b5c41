"""How busy the machine is, and how long a point may be timed: the profiler's guard against noise.

A profile measured on a shared machine is only as good as the cores it had to
itself. These helpers read ``/proc/stat`` (Linux) to see how much CPU *other*
processes used while a point was timed, so that a noisy point can be timed
again and the figures can say how quiet the machine was. They were first
written for :mod:`esg_prefect.examples.measure`, which now uses them from here.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import resource
import statistics
import subprocess
import sys
import time
from multiprocessing.connection import Connection

STARTUP_PROBE = "import torch, esg_prefect.examples"
"""What a fresh worker interpreter imports where there is no fork server (Windows)."""


def allowed_other_cpu(vcpus: int, max_other_cpu: float = 0.15, cpus: int | None = None) -> float:
    """Cores other processes may use during a point: the cores we leave free plus ``max_other_cpu``."""
    free = max((cpus or os.cpu_count() or 1) - vcpus, 0)
    return free + max_other_cpu


def is_quiet(other_cpu: float, wall_s: float, vcpus: int, max_other_cpu: float = 0.15) -> bool:
    """Whether others' CPU use (in cores) during ``wall_s`` left our ``vcpus`` cores alone.

    ``/proc/stat`` counts in 10 ms ticks, so two ticks of slack absorb the rounding on short points.
    """
    return other_cpu * wall_s <= max(allowed_other_cpu(vcpus, max_other_cpu) * wall_s, 0.02)


def own_cpu_s() -> float:
    """CPU seconds (user + system) this process has used."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def children_cpu_s() -> float:
    """CPU seconds (user + system) used by this process's finished children."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def busy_cpu_s() -> float | None:
    """CPU seconds the whole machine has spent busy since boot (Linux ``/proc/stat``), or None elsewhere."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            fields = [int(v) for v in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _status_kib(field: str) -> float | None:
    """A ``kB`` field of ``/proc/self/status`` (Linux), or None elsewhere."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def current_rss_mb() -> float | None:
    """Resident memory of this process now, in MiB (Linux), or None elsewhere."""
    kib = _status_kib("VmRSS")
    return None if kib is None else kib / 1024.0


def reset_peak_rss() -> bool:
    """Reset this process's peak resident memory to its current value (Linux ``clear_refs``); whether it could.

    Why: ``ru_maxrss`` is a high-water mark over the whole process, so without
    a reset every point after the biggest would report the biggest.
    """
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def peak_rss_mb() -> float:
    """Peak resident memory of this process since the last :func:`reset_peak_rss`, in MiB.

    ``VmHWM`` where Linux has it; else ``ru_maxrss`` (KiB on Linux, bytes on macOS), a peak since the start.
    """
    kib = _status_kib("VmHWM")
    if kib is not None:
        return kib / 1024.0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1 << 20) if sys.platform == "darwin" else rss / 1024.0


def repetitions(batch_ms: float, *, min_reps: int, max_reps: int, budget_s: float) -> int:
    """Timed calls for one point: as many as fit ``budget_s``, clamped to ``[min_reps, max_reps]``.

    Why a budget: a batch of 32 crops costs about half a second; fifteen of
    those for every stage and thread count would blow the few minutes the whole
    measurement may take, while cheap points get the extra repetitions for free.
    """
    if batch_ms <= 0:
        return max_reps
    return max(min_reps, min(max_reps, int(budget_s * 1000.0 / batch_ms)))


def wait_for_quiet(vcpus: int, max_wait_s: float, settle_s: int = 3) -> float:
    """Wait until other processes leave ``vcpus`` cores free for ``settle_s`` seconds in a row.

    Returns:
        The seconds waited (``max_wait_s`` at most; then the measurement goes ahead and
        the per-point checks do what they can).
    """
    t0 = time.perf_counter()
    calm = 0
    while calm < settle_s and time.perf_counter() - t0 < max_wait_s:
        busy0 = busy_cpu_s()
        time.sleep(1.0)
        busy1 = busy_cpu_s()
        if busy0 is None or busy1 is None:
            break
        calm = calm + 1 if is_quiet(busy1 - busy0, 1.0, vcpus) else 0
    return time.perf_counter() - t0


def thread_env(threads: int, extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment with the OpenMP/MKL thread counts set to ``threads`` (and ``extra``)."""
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), **(extra or {})}


def _started(conn: Connection) -> None:
    conn.send("up")


@functools.cache
def worker_start_ms(threads: int, launches: int = 3) -> float:
    """Median wall time to start a worker the way the pool does, before its model loads.

    Cached per process (per arguments): a worker's start does not change within a
    session, and timing it again costs a fork server's start (seconds).

    Where multiprocessing has a fork server (Linux, macOS), the pool forks workers
    from a server that has imported torch, prefect and the stage modules already
    (:class:`~esg_prefect.runtime.workers.LocalProcessBackend`): timed here the
    same way, once that server runs. Elsewhere, a fresh interpreter importing them.
    """
    if "forkserver" not in mp.get_all_start_methods():
        times = []
        for _ in range(launches):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", STARTUP_PROBE], check=True, env=thread_env(threads))
            times.append((time.perf_counter() - t0) * 1000.0)
        return statistics.median(times)
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(
        ["torch", "prefect", "esg_prefect.examples.pipelines", "esg_prefect.runtime.worker_main"]
    )
    times = []
    for i in range(launches + 1):  # the first launch starts the fork server itself: not timed
        parent, child = ctx.Pipe()
        t0 = time.perf_counter()
        proc = ctx.Process(target=_started, args=(child,))
        proc.start()
        parent.recv()
        if i:
            times.append((time.perf_counter() - t0) * 1000.0)
        proc.join()
        parent.close()
        child.close()
    return statistics.median(times)


class CpuWatch:
    """Other processes' CPU use over an interval: ``with CpuWatch() as w: ...; w.other_cores``.

    Counts the whole machine's busy time minus this process's own (and, with
    ``children=True``, its finished children's), divided by the wall time.
    """

    def __init__(self, children: bool = False) -> None:
        self.children = children
        self.other_cores: float | None = None
        self.other_cpu_s: float | None = None
        self.wall_s = 0.0
        self._t0 = 0.0
        self._busy0: float | None = None
        self._own0 = 0.0

    def _own(self) -> float:
        return own_cpu_s() + (children_cpu_s() if self.children else 0.0)

    def __enter__(self) -> CpuWatch:
        self._busy0, self._own0, self._t0 = busy_cpu_s(), self._own(), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        busy1, own1 = busy_cpu_s(), self._own()
        self.wall_s = time.perf_counter() - self._t0
        if self._busy0 is not None and busy1 is not None:
            self.other_cpu_s = max(0.0, (busy1 - self._busy0) - (own1 - self._own0))
            # At most the whole machine: /proc/stat counts in 10 ms ticks, so a window of a few ms
            # can read a tick of other work as several cores.
            cores = float(os.cpu_count() or 1)
            self.other_cores = min(self.other_cpu_s / self.wall_s, cores) if self.wall_s > 0 else 0.0
