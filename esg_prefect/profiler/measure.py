"""Timing one stage at one configuration in this process: warm-up, repetitions, quiet checks.

The worker process (:mod:`esg_prefect.profiler.worker`) has already fixed the
configuration's resources (threads; GPU, MPS share and memory fraction) before
any torch work; here each point is timed as follows:

1. ``warmup`` untimed calls, each on the next ``batch`` real inputs (round
   robin over the stage's inputs, so sizes vary between calls as in service);
2. as many timed calls as fit ``budget_s``, within ``[min_reps, max_reps]``
   (:func:`~esg_prefect.profiler.machine.repetitions`); on a GPU each call ends
   with ``torch.cuda.synchronize()`` so the time covers the kernels;
3. if other processes used more than the cores this configuration leaves free
   (plus ``max_other_cpu``), the point is timed again, up to ``max_attempts``
   times, keeping the quietest attempt: on a shared 2-core machine one busy
   neighbour makes two-thread timings several times slower.

Each point reports mean, p50 and p95 of its timed calls (numpy, linear
interpolation), the peak memory, and one :class:`Sample` per call with the
batch's total input size. Peak memory is what a worker serving only this stage
would hold at most: the resident memory its model added when it was built,
plus the peak of resident memory above the level before the point
(``/proc/self/clear_refs`` resets the peak before each point, on Linux), so 0
for a tiny model whose calls allocate nothing, never the whole process's
resident memory (which holds every profiled model and torch). Where the peak
cannot be reset, the rise of the process's high-water mark during the point
stands for the calls' peak: a lower bound (0 when an earlier point peaked higher).
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from esg_prefect.exceptions import InvalidInputError, ProfileError
from esg_prefect.profiler.machine import CpuWatch, current_rss_mb, is_quiet, peak_rss_mb, repetitions, reset_peak_rss
from esg_prefect.profiler.results import ProfiledPoint, Sample
from esg_prefect.profiler.targets import PreparedStage

BATCHES: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
QUICK_BATCHES: tuple[int, ...] = (1, 2)


@dataclass(frozen=True, slots=True)
class MeasureSettings:
    """How hard to measure each point.

    Args:
        batches: batch sizes to time.
        pool: real inputs made per stage (reused round robin).
        warmup: untimed calls before each point.
        min_reps, max_reps, budget_s: timed calls per point (see :func:`repetitions`).
        max_attempts, max_other_cpu: re-timing of points disturbed by other processes.
        seed: seed of the inputs.
    """

    batches: tuple[int, ...] = BATCHES
    pool: int = 32
    warmup: int = 2
    min_reps: int = 7
    max_reps: int = 15
    budget_s: float = 2.0
    max_attempts: int = 4
    max_other_cpu: float = 0.15
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.batches or any(b < 1 for b in self.batches):
            raise InvalidInputError(f"batches must be sizes >= 1, got {self.batches!r}")
        if self.warmup < 0 or self.min_reps < 1 or self.max_reps < self.min_reps:
            raise InvalidInputError(
                f"need warmup >= 0 and 1 <= min_reps <= max_reps, got warmup={self.warmup}, "
                f"min_reps={self.min_reps}, max_reps={self.max_reps}"
            )
        if self.max_attempts < 1:
            raise InvalidInputError(f"max_attempts must be >= 1, got {self.max_attempts}")

    @classmethod
    def quick(cls, batches: Sequence[int] = QUICK_BATCHES) -> MeasureSettings:
        """One warm-up and one repetition per point, one attempt: for smoke tests."""
        return cls(tuple(batches), pool=2, warmup=1, min_reps=1, max_reps=1, max_attempts=1)

    def with_batches(self, batches: Sequence[int]) -> MeasureSettings:
        """The same settings for other batch sizes."""
        return replace(self, batches=tuple(batches))


def sync(device: str) -> None:
    """Wait for queued GPU work, so a timing covers it (no-op on the CPU)."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def time_call(stage: PreparedStage, items: list[Any], device: str) -> float:
    """Milliseconds of one batch call on ``items``, GPU work included."""
    t0 = time.perf_counter()
    stage.target.run(stage.model, items)
    sync(device)
    return (time.perf_counter() - t0) * 1000.0


def _reset_gpu_peak(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.reset_peak_memory_stats()


def _gpu_peak_mb(device: str) -> float:
    if device.startswith("cuda"):
        import torch

        return float(torch.cuda.max_memory_allocated()) / (1 << 20)
    return 0.0


def measure_point(
    stage: PreparedStage,
    batch: int,
    *,
    vcpus: int,
    gpu_share: float = 0.0,
    hardware: str = "cpu",
    device: str = "cpu",
    settings: MeasureSettings | None = None,
) -> tuple[ProfiledPoint, list[Sample]]:
    """Time ``stage`` at ``batch`` with the resources this process has; see the module docstring."""
    s = settings or MeasureSettings()
    best: tuple[float, list[float], list[float], float] | None = None
    attempts = 0
    gpu_peak = 0.0
    work_mb = 0.0
    while attempts < s.max_attempts:
        attempts += 1
        gc.collect()
        _reset_gpu_peak(device)
        rss0 = current_rss_mb() if reset_peak_rss() else None
        base = rss0 if rss0 is not None else peak_rss_mb()  # resident now (peak reset), else the high-water mark
        with CpuWatch() as watch:
            est = float("inf")
            for _ in range(s.warmup):
                est = min(est, time_call(stage, stage.next_batch(batch), device))
            reps = repetitions(est if s.warmup else 0.0, min_reps=s.min_reps, max_reps=s.max_reps, budget_s=s.budget_s)
            times: list[float] = []
            sizes: list[float] = []
            for _ in range(reps):
                items = stage.next_batch(batch)
                sizes.append(sum(stage.target.size(x) for x in items))
                times.append(time_call(stage, items, device))
        gpu_peak = max(gpu_peak, _gpu_peak_mb(device))
        work_mb = max(work_mb, peak_rss_mb() - base)
        other = watch.other_cores or 0.0
        if best is None or other < best[0]:
            best = (other, times, sizes, watch.wall_s)
        if is_quiet(other, watch.wall_s, vcpus, s.max_other_cpu):
            break
        time.sleep(0.5)
    assert best is not None
    other, times, sizes, wall = best
    point = ProfiledPoint(
        stage=stage.name,
        hardware=hardware,
        batch=batch,
        vcpus=vcpus,
        gpu_share=gpu_share,
        mean_ms=statistics.fmean(times),
        p50_ms=float(np.percentile(times, 50)),
        p95_ms=float(np.percentile(times, 95)),
        cold_start_ms=stage.cold_start_ms,
        load_ms=stage.load_ms,
        # This process holds every profiled stage's model: a worker holding only this one
        # would peak at its model plus what the calls allocate.
        peak_mem_mb=stage.model_mem_mb + work_mb,
        model_mem_mb=stage.model_mem_mb,
        gpu_peak_mem_mb=gpu_peak,
        reps=len(times),
        attempts=attempts,
        other_cpu=other,
        quiet=is_quiet(other, wall, vcpus, s.max_other_cpu),
        mean_input_size=statistics.fmean(sizes) / batch,
        pipeline=stage.target.pipeline,
    )
    samples = [Sample(stage.name, hardware, batch, vcpus, gpu_share, z, t) for z, t in zip(sizes, times, strict=True)]
    return point, samples


def measure_stages(
    stages: Sequence[PreparedStage],
    *,
    vcpus: int,
    gpu_share: float = 0.0,
    hardware: str = "cpu",
    device: str = "cpu",
    settings: MeasureSettings | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[ProfiledPoint], list[Sample]]:
    """Every stage at every batch size of ``settings``; ``progress(label)`` after each point."""
    s = settings or MeasureSettings()
    points: list[ProfiledPoint] = []
    samples: list[Sample] = []
    for st in stages:
        for b in s.batches:
            try:
                p, sm = measure_point(
                    st, b, vcpus=vcpus, gpu_share=gpu_share, hardware=hardware, device=device, settings=s
                )
            except Exception as exc:  # the user's stage failed: say which stage and point, once
                raise ProfileError(
                    f"stage {st.name!r} failed at batch {b}, {vcpus} vCPU(s), GPU share {gpu_share:g}: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            points.append(p)
            samples += sm
            if progress is not None:
                progress(f"point {st.name} b{b} v{vcpus} g{gpu_share:g}: {p.mean_ms:.1f} ms")
    return points, samples
