"""A profile run: every target over batch sizes x vcpus (x GPU shares), one fresh worker per configuration.

:func:`run_profile` is what ``esg-prefect profile`` and the profiler's Prefect
flow call. For each configuration it waits (up to ``wait_quiet_s``) for other
processes to leave the configuration's cores free, times the start of a worker
as the pool starts one, and runs a :mod:`~esg_prefect.profiler.worker` that
measures every stage at every batch size (:mod:`~esg_prefect.profiler.measure`).
GPU shares are profiled only where NVML finds a GPU; on a CPU-only machine the
GPU configurations are skipped and the run says so.
"""

from __future__ import annotations

import logging
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from esg_prefect.exceptions import InvalidInputError
from esg_prefect.model import LatencyProfile
from esg_prefect.profiler.machine import CpuWatch, wait_for_quiet, worker_start_ms
from esg_prefect.profiler.measure import MeasureSettings
from esg_prefect.profiler.results import (
    ProfiledPoint,
    Sample,
    config_label,
    write_profile_csv,
    write_samples_csv,
)
from esg_prefect.profiler.worker import Job, run_worker

logger = logging.getLogger(__name__)

ProgressFn = Callable[[int, int, str], None]
"""``progress(done, total, label)``: called after each measured point."""

DEFAULT_GPU_SHARES: tuple[float, ...] = (0.25, 0.5, 1.0)
DEFAULT_WAIT_QUIET_S = 120.0
"""How long a profile run waits at most, before each configuration, for other processes to quiet down."""
GPU_SHARE_RANGE = "(0, 1]"
"""The GPU shares a profile run takes, as its errors name them (see :func:`is_gpu_share`)."""


def is_gpu_share(share: float) -> bool:
    """Whether ``share`` is a fraction of one GPU a configuration can hold, in :data:`GPU_SHARE_RANGE`.

    The one check of :class:`ProfileRequest` and of the CLI's ``--gpu-shares``
    (which refuses a bad share early, naming its option). 0 is no GPU: the CPU
    configurations are asked for with ``cpu``, not a share.
    """
    return 0.0 < share <= 1.0


@dataclass(frozen=True, slots=True)
class Configuration:
    """One worker configuration: where it runs and what share it holds."""

    device: str
    hardware: str
    vcpus: int
    gpu_share: float = 0.0

    @property
    def label(self) -> str:
        """``cpu/1vcpu`` or ``H100/2vcpu/0.5``."""
        return config_label(self.hardware, self.vcpus, self.gpu_share)


@dataclass(frozen=True, slots=True)
class ProfileRequest:
    """What to profile and how.

    Args:
        specs: target specs (see :mod:`esg_prefect.profiler.targets`); the example stages by default.
        vcpus: thread counts to profile.
        gpu_shares: GPU shares to profile where a GPU is present (skipped on CPU-only machines).
        settings: warm-up, repetitions and batch sizes.
        wait_quiet_s: wait up to this long before each configuration for other processes to quiet down.
        worker_start_launches: worker starts timed (median) per thread count.
        cpu: also profile CPU-only configurations (``gpu_share`` 0).
    """

    specs: tuple[str, ...] = ("examples",)
    vcpus: tuple[int, ...] = (1, 2)
    gpu_shares: tuple[float, ...] = DEFAULT_GPU_SHARES
    settings: MeasureSettings = field(default_factory=MeasureSettings)
    wait_quiet_s: float = DEFAULT_WAIT_QUIET_S
    worker_start_launches: int = 3
    cpu: bool = True

    def __post_init__(self) -> None:
        if not self.specs:
            raise InvalidInputError("specs must name at least one target")
        if not self.vcpus or min(self.vcpus) < 1:
            raise InvalidInputError(f"vcpus must be counts >= 1, got {list(self.vcpus)}")
        if not all(map(is_gpu_share, self.gpu_shares)):
            raise InvalidInputError(f"gpu_shares must be in {GPU_SHARE_RANGE}, got {list(self.gpu_shares)}")


@dataclass(slots=True)
class ProfileRun:
    """What a profile run measured, with the conditions it ran under."""

    request: ProfileRequest
    points: list[ProfiledPoint]
    samples: list[Sample]
    configurations: list[Configuration]
    skipped: list[str]
    other_cpu: dict[str, float | None]
    worker_start_ms: dict[int, float]
    started_at_s: float
    wall_s: float
    host: dict[str, Any]

    def profile(self) -> LatencyProfile:
        """The measured points as the scheduler's latency profile (cold starts include the worker start)."""
        from esg_prefect.model import ProfilePoint

        pts = [
            ProfilePoint(p.stage, p.hardware, p.batch, p.vcpus, p.gpu_share, p.mean_ms, p.p95_ms) for p in self.points
        ]
        cold: dict[tuple[str, str], float] = {}
        for p in self.points:
            key = (p.stage, p.hardware)
            cold[key] = max(cold.get(key, 0.0), p.total_cold_start_ms)
        return LatencyProfile(pts, cold)

    def write(self, out: Path, samples_out: Path | None = None) -> None:
        """Write the profile CSV (and the per-call samples) and check the CSV loads as a profile."""
        write_profile_csv(self.points, out)
        LatencyProfile.from_csv(out)  # the check that the file is a valid profile
        if samples_out is not None:
            write_samples_csv(self.samples, samples_out)


def host_info() -> dict[str, Any]:
    """Python, torch, CPU count and platform: recorded with every run."""
    import torch

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "machine": platform.machine(),
    }


def configurations(request: ProfileRequest) -> tuple[list[Configuration], list[str]]:
    """The configurations to profile on this machine, and what was skipped and why."""
    from esg_prefect.runtime.gpu import discover_gpus

    configs: list[Configuration] = []
    skipped: list[str] = []
    if request.cpu:
        configs += [Configuration("cpu", "cpu", v) for v in request.vcpus]
    gpus = discover_gpus()
    if not gpus:
        if request.gpu_shares:
            skipped.append(f"GPU shares {list(request.gpu_shares)}: no NVIDIA GPU found (NVML)")
        return configs, skipped
    gpu = gpus[0]
    if len(gpus) > 1:
        skipped.append(f"GPUs 1..{len(gpus) - 1}: profiling GPU 0 ({gpu.name}) only")
    for v in request.vcpus:
        for s in request.gpu_shares:
            configs.append(Configuration(f"cuda:{gpu.index}", gpu.hardware, v, s))
    return configs, skipped


def count_stages(specs: Sequence[str]) -> int:
    """How many stages ``specs`` name (for the progress total), without building any model."""
    from esg_prefect.profiler.targets import targets_of

    n = 0
    for spec in specs:
        n += len(targets_of(spec))
    return n


def run_profile(request: ProfileRequest, progress: ProgressFn | None = None) -> ProfileRun:
    """Profile every target of ``request`` at every configuration this machine has.

    Raises:
        ProfilerWorkerError: when a worker fails (its output ends the message).
    """
    configs, skipped = configurations(request)
    for s in skipped:
        logger.info("skipped %s", s)
    total = count_stages(request.specs) * len(request.settings.batches) * len(configs)
    done = 0
    points: list[ProfiledPoint] = []
    samples: list[Sample] = []
    other: dict[str, float | None] = {}
    starts: dict[int, float] = {}
    t0, started = time.perf_counter(), time.time()
    for cfg in configs:
        if cfg.vcpus not in starts:
            starts[cfg.vcpus] = worker_start_ms(cfg.vcpus, launches=request.worker_start_launches)
        if request.wait_quiet_s > 0:
            waited = wait_for_quiet(cfg.vcpus, request.wait_quiet_s)
            if waited > 5:
                logger.info("%s: waited %.0f s for other processes to leave the cores free", cfg.label, waited)

        def relay(label: str, cfg: Configuration = cfg) -> None:
            nonlocal done
            if label.startswith("point "):
                done += 1
                label = label[len("point ") :]
            if progress is not None:
                progress(done, total, f"{cfg.label} {label}")

        job = Job(
            "profile",
            tuple(request.specs),
            cfg.vcpus,
            cfg.gpu_share,
            "cpu" if cfg.device == "cpu" else cfg.device,
            cfg.hardware,
            settings=asdict(request.settings),
        )
        with CpuWatch(children=True) as watch:
            result = run_worker(job, relay)
        other[cfg.label] = watch.other_cores
        for d in result["points"]:
            d["worker_start_ms"] = starts[cfg.vcpus]
            points.append(ProfiledPoint.from_dict(d))
        samples += [Sample(**d) for d in result["samples"]]
    return ProfileRun(
        request, points, samples, configs, skipped, other, starts, started, time.perf_counter() - t0, host_info()
    )
