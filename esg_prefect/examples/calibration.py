"""Size the demo's arrival rate to the machine: near the capacity of Prefect's thread pool, where pooling matters.

Far below that capacity every runner meets its SLOs and pooling has little to
pool; far above it every runner queues without bound and nobody meets an SLO.
Near it, batching calls of many flow runs is what keeps latency inside the SLO.
So before the measured workload the demo serves a few requests of each
pipeline one at a time under the thread pool, measures the CPU time they take
(this process and its child processes, which include Prefect's temporary API
server), and sets the arrival rate to a fraction of ``cores / CPU-s per request``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from esg_prefect.exceptions import InvalidInputError

DEFAULT_FRACTION = 0.9
"""The demo's rate as a fraction of the thread pool's measured capacity."""


@dataclass(frozen=True, slots=True)
class Calibration:
    """What the calibration measured and the rate it chose."""

    cores: int
    requests: int
    cpu_s_per_request: float  # this process and its children, per request served alone
    wall_s_per_request: float
    fraction: float

    @property
    def capacity_per_s(self) -> float:
        """Requests per second the thread pool could serve with every core busy."""
        return self.cores / self.cpu_s_per_request

    @property
    def rate_per_s(self) -> float:
        """The arrival rate the demo runs at."""
        return self.fraction * self.capacity_per_s

    def describe(self) -> str:
        """One line for the demo's output: what was measured and why the rate follows from it."""
        return (
            f"calibration: {self.requests} requests served one at a time under Prefect's thread pool took "
            f"{self.cpu_s_per_request:.2f} CPU-s each (flows, models and Prefect's API), so {self.cores} cores serve "
            f"about {self.capacity_per_s:.2f} requests/s; the demo runs at {self.fraction:.0%} of that, "
            f"{self.rate_per_s:.2f}/s, near the thread pool's capacity, where pooling matters (--rate sets it)"
        )


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux ``/proc``; empty elsewhere)."""
    out = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[1]) == pid:
            out.append(int(name))
    return out


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process (Linux ``/proc``); 0 when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_tree_cpu_s(pids: Sequence[int]) -> float:
    """CPU seconds of this process plus those of ``pids`` (its children, read where ``/proc`` has them)."""
    return time.process_time() + sum(_cpu_s(p) for p in pids)


def calibrate(
    serve_one: Callable[[int, str], Any],
    workflows: Sequence[str],
    rounds: int = 2,
    fraction: float = DEFAULT_FRACTION,
    cores: int | None = None,
) -> Calibration:
    """Serve ``rounds`` requests of each workflow one at a time and derive the demo's rate.

    ``serve_one(index, workflow)`` runs one request to its end (indices count down
    from -100, apart from the workload's and the warm-up's). Where ``/proc`` is
    missing (macOS) only this process's CPU counts, which leaves out the API
    server's and sets a higher rate.

    Raises:
        InvalidInputError: for ``rounds`` < 1 or ``fraction`` outside (0, 1].
    """
    if rounds < 1:
        raise InvalidInputError(f"calibration rounds must be at least 1, got {rounds}")
    if not 0.0 < fraction <= 1.0:
        raise InvalidInputError(f"calibration fraction must be in (0, 1], got {fraction}")
    n_cores = cores or os.cpu_count() or 1
    kids = _children(os.getpid()) if sys.platform.startswith("linux") else []
    cpu0, wall0 = process_tree_cpu_s(kids), time.perf_counter()
    n = 0
    for _ in range(rounds):
        for wf in workflows:
            serve_one(-100 - n, wf)
            n += 1
    cpu = process_tree_cpu_s(kids) - cpu0
    wall = time.perf_counter() - wall0
    return Calibration(n_cores, n, max(cpu, 1e-3) / n, wall / n, fraction)


def busy_machine_warning(cores: int | None = None) -> str | None:
    """A warning when other work already loads the machine (1-minute load average above its cores), else None."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # not available on this platform
        return None
    n_cores = cores or os.cpu_count() or 1
    if load <= n_cores:
        return None
    return (
        f"this machine is busy before the demo starts: load average {load:.1f} on {n_cores} cores. "
        "Both runners will be slower and the figures noisier than on a quiet machine"
    )


__all__ = ["DEFAULT_FRACTION", "Calibration", "busy_machine_warning", "calibrate", "process_tree_cpu_s"]
