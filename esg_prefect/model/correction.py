"""Online correction of the latency profile from measured batch times.

A profile measured on another machine, at another time or under another load
is off by a factor that the scheduler cannot see: it plans batches that finish
later (or sooner) than it thinks, and misses SLOs (or wastes money) for as long
as the profile stays wrong. The runtime therefore compares each batch's
measured time with the profile's prediction for that batch and keeps one
multiplicative factor per ``(stage, hardware)``, which
:meth:`LatencyProfile.scaled <esg_prefect.model.profile.LatencyProfile.scaled>`
applies to the whole table of that stage.

Estimator (stated, as the profiler issue asks): an exponentially weighted mean
of the log ratio ``r = ln(actual / predicted)``,

    g <- (1 - alpha) * g + alpha * clamp(r, -ln 8, ln 8),   factor = exp(g) clamped to [1/4, 4],

starting from ``g = 0`` (the profile is trusted until measured otherwise). The
log makes a 2x slowdown and a 2x speedup symmetric, and the geometric mean is
not dragged by one stalled batch as an arithmetic mean would be; each single
ratio is clamped to [1/8, 8] for the same reason. With ``alpha = 0.25`` a
step change of the true factor by 2x is tracked to within 10 % after 7
batches (``0.75**7 * ln 2 < ln 1.1``). The bound keeps a burst of pathological
measurements (a swapping machine) from making the scheduler believe a stage is
16x slower and give up on its SLOs: a profile more than 4x off must be
re-measured (``esg-prefect profile``).

One factor per (stage, hardware), not per configuration: batch times are
observed at a few configurations only, and the profile's shape over batch sizes
and vCPUs is what profiling measures well; what drifts is the level (a slower
or busier machine, another CPU model). Predictions are compared with the
profile's *mean*, whatever percentile the scheduler plans with.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from esg_prefect.exceptions import ConfigError

MAX_FACTOR = 4.0
"""Bound of a correction factor: it stays within [1/MAX_FACTOR, MAX_FACTOR]."""
_MAX_STEP = math.log(8.0)  # bound of one observation's log ratio


@dataclass(slots=True)
class _Estimate:
    log_factor: float = 0.0
    observations: int = 0


class LatencyCorrection:
    """Per (stage, hardware) factors ``actual / predicted`` learned from measured batches.

    Args:
        alpha: weight of the newest observation in the log-ratio EWMA, in (0, 1].

    Raises:
        ConfigError: for an alpha outside (0, 1].

    Examples:
        >>> corr = LatencyCorrection(alpha=0.5)
        >>> for _ in range(10):
        ...     f = corr.observe("enc", "cpu", predicted_ms=10.0, actual_ms=20.0)
        >>> round(corr.factor("enc", "cpu"), 2)
        2.0
    """

    def __init__(self, alpha: float = 0.25) -> None:
        if not (isinstance(alpha, (int, float)) and 0.0 < alpha <= 1.0):
            raise ConfigError(f"correction alpha must be in (0, 1], got {alpha!r}")
        self.alpha = float(alpha)
        self._est: dict[tuple[str, str], _Estimate] = {}

    def observe(self, stage: str, hardware: str, predicted_ms: float, actual_ms: float) -> float:
        """Fold one batch's measured time into the factor of ``(stage, hardware)``; returns the new factor.

        Observations with a non-positive or non-finite time are ignored (a
        batch that failed or a clock that went backwards says nothing about
        the model's speed).
        """
        est = self._est.setdefault((stage, hardware), _Estimate())
        if not (math.isfinite(predicted_ms) and math.isfinite(actual_ms) and predicted_ms > 0 and actual_ms > 0):
            return math.exp(est.log_factor)
        step = max(-_MAX_STEP, min(_MAX_STEP, math.log(actual_ms / predicted_ms)))
        bound = math.log(MAX_FACTOR)
        est.log_factor = max(-bound, min(bound, (1.0 - self.alpha) * est.log_factor + self.alpha * step))
        est.observations += 1
        return math.exp(est.log_factor)

    def factor(self, stage: str, hardware: str) -> float:
        """The current factor of ``(stage, hardware)``; 1.0 before any observation."""
        est = self._est.get((stage, hardware))
        return 1.0 if est is None else math.exp(est.log_factor)

    def observations(self, stage: str, hardware: str) -> int:
        """How many batches of ``(stage, hardware)`` were folded in."""
        est = self._est.get((stage, hardware))
        return 0 if est is None else est.observations

    def factors(self) -> dict[tuple[str, str], float]:
        """Every learned factor, by (stage, hardware)."""
        return {key: math.exp(est.log_factor) for key, est in self._est.items()}

    def drifted(self, applied: Mapping[tuple[str, str], float], tolerance: float = 0.1) -> bool:
        """Whether a learned factor is more than ``tolerance`` (relative) away from the one ``applied``.

        The runtime re-plans with a rescaled profile only then: rebuilding the
        scheduler's tables on every batch would cost more than the noise of one
        batch's time is worth.
        """
        limit = math.log1p(tolerance)
        return any(abs(est.log_factor - math.log(applied.get(key, 1.0))) > limit for key, est in self._est.items())
