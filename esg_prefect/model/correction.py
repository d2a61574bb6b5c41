"""Online correction of the latency profile from measured batch times.

A profile measured on another machine, at another time or under another load
is off by a factor that the scheduler cannot see: it plans batches that finish
later (or sooner) than it thinks, and misses SLOs (or wastes money) for as long
as the profile stays wrong. The runtime therefore compares each batch's
measured time with the profile's prediction for that batch and keeps, per
``(stage, hardware)``, one multiplicative factor and one additive per-batch
overhead, which
:meth:`LatencyProfile.scaled <esg_prefect.model.profile.LatencyProfile.scaled>`
applies to the whole table of that stage: ``predicted * factor + overhead``.

Two parts, because a batch's time as the pool sees it (the round trip: inputs
sent, batch run, outputs back) has two parts of different shapes. The worker's
own time for the batch (``BatchOutcome.elapsed_ms``, what the profiler measures
too) drifts with the machine's speed and load: a factor. The rest (a pipe, the
pickling of inputs and outputs, the event loop's hand-off; Ray's scheduling and
object store) is paid once per batch whatever its size: an overhead. Folded
into the factor, it would make a sub-millisecond stage's factor hit its bound
and never catch up, and make the big batches of a slower stage look slower
than they are. A worker whose batches do not cross a process boundary
(``WorkerHandle.out_of_process`` false: the inline backend) has no such
overhead: its round trip is the model's own time, and its overhead stays 0.

Estimator (stated, as the profiler issue asks): for a batch predicted at
``p`` by the profile's mean, its own time ``t`` and round trip ``T`` (``t = T``
for an in-process worker),

    g <- (1 - alpha) * g + alpha * clamp(ln(t / p), -ln 8, ln 8),   factor = exp(g) clamped to [1/4, 4],
    o <- (1 - alpha) * o + alpha * clamp(T - t, 0, MAX_OVERHEAD_MS),

starting from ``g = 0`` and ``o = 0`` (the profile is trusted until measured
otherwise). The log makes a 2x slowdown and a 2x speedup symmetric, and the
geometric mean is not dragged by one stalled batch as an arithmetic mean would
be; each single ratio is clamped to [1/8, 8] for the same reason, and each
single overhead to ``MAX_OVERHEAD_MS`` (a paused process or a swapping machine
is not the pipe's cost). With ``alpha = 0.25`` a step change of the true factor
by 2x is tracked to within 10 % after 7 batches (``0.75**7 * ln 2 < ln 1.1``),
and an overhead to within 2 % after 14. The factor's bound keeps a burst of
pathological measurements from making the scheduler believe a stage is 16x
slower and give up on its SLOs: a profile more than 4x off must be re-measured
(``esg-prefect profile``).

One factor and one overhead per (stage, hardware), not per configuration: batch
times are observed at a few configurations only, and the profile's shape over
batch sizes and vCPUs is what profiling measures well; what drifts is the level
(a slower or busier machine, another CPU model). The overhead is modelled per
batch: the part of it that grows with the inputs' size (pickling a large
tensor) is averaged over the batch sizes seen. Predictions are compared with
the profile's *mean*, whatever percentile the scheduler plans with.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from esg_prefect.exceptions import ConfigError

MAX_FACTOR = 4.0
"""Bound of a correction factor: it stays within [1/MAX_FACTOR, MAX_FACTOR]."""
MAX_OVERHEAD_MS = 250.0
"""Bound of one batch's overhead (round trip minus the worker's own time), in ms; so of the learned one too."""
OVERHEAD_DRIFT_FLOOR_MS = 0.5
"""A learned overhead this close to the one planned with never re-plans: the jitter of a pipe's hand-off."""
_MAX_STEP = math.log(8.0)  # bound of one observation's log ratio


@dataclass(slots=True)
class _Estimate:
    log_factor: float = 0.0
    observations: int = 0
    overhead_ms: float = 0.0
    batch_ms: float = 0.0  # EWMA of the profile's prediction of the batches seen: the scale of a typical batch


def _valid(ms: float) -> bool:
    return math.isfinite(ms) and ms > 0


class LatencyCorrection:
    """Per (stage, hardware) factors ``own / predicted`` and per-batch overheads learned from measured batches.

    Args:
        alpha: weight of the newest observation in both EWMAs, in (0, 1].

    Raises:
        ConfigError: for an alpha outside (0, 1].

    Examples:
        >>> corr = LatencyCorrection(alpha=0.5)
        >>> for _ in range(20):
        ...     f = corr.observe("enc", "cpu", predicted_ms=10.0, actual_ms=25.0, own_ms=20.0)
        >>> round(corr.factor("enc", "cpu"), 2), round(corr.overhead_ms("enc", "cpu"), 2)
        (2.0, 5.0)
    """

    def __init__(self, alpha: float = 0.25) -> None:
        if not (isinstance(alpha, (int, float)) and 0.0 < alpha <= 1.0):
            raise ConfigError(f"correction alpha must be in (0, 1], got {alpha!r}")
        self.alpha = float(alpha)
        self._est: dict[tuple[str, str], _Estimate] = {}

    def observe(
        self, stage: str, hardware: str, predicted_ms: float, actual_ms: float, own_ms: float | None = None
    ) -> float:
        """Fold one batch's times into the factor and overhead of ``(stage, hardware)``; returns the new factor.

        ``actual_ms`` is the round trip as the pool saw it, ``own_ms`` the
        worker's own time for the batch; None when the two are one (an
        in-process worker): the whole round trip then drives the factor and the
        overhead is left alone. Observations with a non-positive or non-finite
        time are ignored (a batch that failed or a clock that went backwards
        says nothing about the model's speed).
        """
        est = self._est.setdefault((stage, hardware), _Estimate())
        valid = _valid(predicted_ms) and _valid(actual_ms) and (own_ms is None or _valid(own_ms))
        if not valid:
            return math.exp(est.log_factor)
        a = self.alpha
        model_ms = actual_ms if own_ms is None else own_ms
        step = max(-_MAX_STEP, min(_MAX_STEP, math.log(model_ms / predicted_ms)))
        bound = math.log(MAX_FACTOR)
        est.log_factor = max(-bound, min(bound, (1.0 - a) * est.log_factor + a * step))
        if own_ms is not None:
            extra = max(0.0, min(MAX_OVERHEAD_MS, actual_ms - own_ms))
            est.overhead_ms = (1.0 - a) * est.overhead_ms + a * extra
        est.batch_ms = predicted_ms if est.observations == 0 else (1.0 - a) * est.batch_ms + a * predicted_ms
        est.observations += 1
        return math.exp(est.log_factor)

    def factor(self, stage: str, hardware: str) -> float:
        """The current factor of ``(stage, hardware)``; 1.0 before any observation."""
        est = self._est.get((stage, hardware))
        return 1.0 if est is None else math.exp(est.log_factor)

    def overhead_ms(self, stage: str, hardware: str) -> float:
        """The current per-batch overhead of ``(stage, hardware)`` in ms; 0.0 before any split observation."""
        est = self._est.get((stage, hardware))
        return 0.0 if est is None else est.overhead_ms

    def observations(self, stage: str, hardware: str) -> int:
        """How many batches of ``(stage, hardware)`` were folded in."""
        est = self._est.get((stage, hardware))
        return 0 if est is None else est.observations

    def factors(self) -> dict[tuple[str, str], float]:
        """Every learned factor, by (stage, hardware)."""
        return {key: math.exp(est.log_factor) for key, est in self._est.items()}

    def overheads(self) -> dict[tuple[str, str], float]:
        """Every learned per-batch overhead in ms, by (stage, hardware)."""
        return {key: est.overhead_ms for key, est in self._est.items()}

    def drifted(
        self,
        applied: Mapping[tuple[str, str], float],
        tolerance: float = 0.1,
        overheads: Mapping[tuple[str, str], float] | None = None,
    ) -> bool:
        """Whether a learned factor or overhead is too far from the one ``applied`` (``overheads``: 0 if None).

        Too far: a factor more than ``tolerance`` (relative) away; an overhead
        that moves the prediction of a typical batch (the profile's mean of
        the batches seen, times the factor applied, plus the overhead applied)
        by more than ``tolerance`` of it, and by more than
        ``OVERHEAD_DRIFT_FLOOR_MS``. The runtime re-plans with a rescaled
        profile only then: rebuilding the scheduler's tables on every batch
        would cost more than the noise of one batch's time is worth, and an
        overhead that is small beside the stage's batches changes no plan.
        """
        limit = math.log1p(tolerance)
        planned = overheads or {}
        for key, est in self._est.items():
            factor = applied.get(key, 1.0)
            if abs(est.log_factor - math.log(factor)) > limit:
                return True
            overhead = planned.get(key, 0.0)
            batch = est.batch_ms * factor + overhead
            if abs(est.overhead_ms - overhead) > max(OVERHEAD_DRIFT_FLOOR_MS, tolerance * batch):
                return True
        return False
