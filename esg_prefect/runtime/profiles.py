"""The latency profiles a pool loads by default: the shipped example-stage and published GPU tables."""

from __future__ import annotations

import logging

from esg_prefect.model.profile import LatencyProfile, ProfilePoint
from esg_prefect.model.profile_source import PROFILE_DIR, SIZE_SAMPLES, read_profile, shipped_size_model

logger = logging.getLogger(__name__)

DEFAULT_PROFILES = ("examples_cpu.csv", "nvidia_gpu.csv")
DEFAULT_SIZE_SAMPLES = SIZE_SAMPLES
"""Shipped profiles the default pool loads: the example pipelines on this CPU, published GPU tables."""


def load_default_profile(
    names: tuple[str, ...] = DEFAULT_PROFILES, size_samples: str | None = DEFAULT_SIZE_SAMPLES
) -> LatencyProfile:
    """The shipped latency profiles ``names``, merged; missing ones skipped.

    Each is read as a profile given by name is everywhere
    (:func:`~esg_prefect.model.profile_source.read_profile`); the merged profile
    carries the size model fitted from the shipped samples ``size_samples``
    (None: count-only).
    """
    points: list[ProfilePoint] = []
    cold: dict[tuple[str, str], float] = {}
    for name in names:
        path = PROFILE_DIR / name
        if path.is_file():
            prof = read_profile(path)
            points.extend(prof.points)
            for p in prof.points:
                cold[(p.stage, p.hardware)] = prof.cold_start_ms(p.stage, p.hardware)
    sizes = None if size_samples is None else shipped_size_model(size_samples)
    return LatencyProfile(points, cold, sizes)


_EXAMPLES = "esg_prefect.examples."


def warn_if_shipped(stage: str, stage_path: str, profiled: str, profile: LatencyProfile) -> bool:
    """Warn when a user's stage is planned with the profile shipped for an example stage of its name.

    A pool given no profile plans with the example stages' (:func:`load_default_profile`);
    a stage of the user's own code that happens to share a name (``detect``) would be
    planned with another model's timings, silently. Returns whether it warned.
    """
    if stage_path.startswith(_EXAMPLES) or profiled not in profile.stages():
        return False
    logger.warning(
        "stage %r (%s) is planned with the latency profile shipped for esg-prefect's example stage %r, "
        "not one of its own: profile it (`esg-prefect profile`) and pass the CSV "
        "(ESGTaskRunner(profile=...), pool serve --profile)",
        stage,
        stage_path,
        profiled,
    )
    return True
