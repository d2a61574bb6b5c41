"""The latency profiles a pool loads by default: the shipped example-stage and published GPU tables."""

from __future__ import annotations

from esg_prefect.model.profile import LatencyProfile, ProfilePoint
from esg_prefect.model.size_model import SizeModel

DEFAULT_PROFILES = ("examples_cpu.csv", "nvidia_gpu.csv")
DEFAULT_SIZE_SAMPLES = "profiler_examples_cpu_samples.csv"
"""Shipped profiles the default pool loads: the example pipelines on this CPU, published GPU tables."""


def load_default_profile(
    names: tuple[str, ...] = DEFAULT_PROFILES, size_samples: str | None = DEFAULT_SIZE_SAMPLES
) -> LatencyProfile:
    """The shipped latency profiles ``names`` (from ``esg_prefect/data/profiles``), merged; missing ones skipped.

    The size model (Cypress) is fitted from the profiler's per-call samples
    ``size_samples`` (the example stages on this project's CPU): a size
    *factor* is a ratio to the typical item, so it carries over to the
    table it rescales even though that table was measured in another run.
    """
    from importlib import resources

    points: list[ProfilePoint] = []
    cold: dict[tuple[str, str], float] = {}
    folder = resources.files("esg_prefect") / "data" / "profiles"
    for name in names:
        entry = folder / name
        if entry.is_file():
            with resources.as_file(entry) as path:
                prof = LatencyProfile.from_csv(path)
            points.extend(prof.points)
            for p in prof.points:
                cold[(p.stage, p.hardware)] = prof.cold_start_ms(p.stage, p.hardware)
    sizes = None
    if size_samples is not None and (folder / size_samples).is_file():
        with resources.as_file(folder / size_samples) as path:
            sizes = SizeModel.from_samples_csv(path)
    return LatencyProfile(points, cold, sizes)
