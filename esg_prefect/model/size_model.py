"""Input-size-aware latency model (Cypress): a batch's latency from the sizes of its items.

Cypress (SoCC '22) observes that a stage's execution time depends on its
input's size (text length, image pixels, number of crops), so a scheduler that
counts items mispredicts batches of long or short inputs. This model fits,
per (stage, hardware, vcpus, gpu_share), by ordinary least squares on the
profiler's per-call samples::

    latency_ms ~ a[batch] + c * total_size

one intercept per measured batch size (what the count model, the profile
table's mean per batch size, already knows, however it bends) plus one slope
for ``total_size``, the sum of the batch's item sizes (the stage's unit:
words, tokens, crops). So the size model contains the count model: with
``c = 0`` it *is* the count model. When the size carries no information of
its own (every item the same size, so ``total_size`` is a fixed multiple of
``batch``) the slope is dropped. Between measured batch sizes the intercept is
interpolated linearly, beyond them extrapolated from the nearest two.
Predictions are clamped at :data:`MIN_LATENCY_MS`.

Pure arithmetic: no numpy, torch or clock (the domain layer's rule).

Example:
    >>> samples = [SizeSample("enc", "cpu", b, 1, 0.0, z, 1.0 + 0.5 * b + 0.1 * z)
    ...            for b, z in [(1, 10), (1, 30), (2, 20), (2, 60), (4, 50), (4, 120)]]
    >>> m = SizeModel.fit(samples)
    >>> round(m.latency_ms("enc", [10.0, 20.0], vcpus=1), 3)
    5.0
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from esg_prefect.exceptions import MissingProfileError, ProfileError
from esg_prefect.model.csv_rows import config_columns, decimal, read_rows

MIN_LATENCY_MS = 0.01
FACTOR_BOUNDS = (0.25, 8.0)
"""The steering factor's range. Why: per-batch intercepts and the size slope are
fitted together from sizes that vary little within a batch size, so some
intercepts come out negative and a batch far below the measured sizes would be
predicted to take no time at all; beyond these bounds a fit is extrapolating."""
MIN_R2 = 0.8
"""A fit steers scheduling only with a positive size slope and at least this R^2.

Why: on a noisy machine some groups fit badly (the shipped CPU samples hold
fits with R^2 0.14 and negative slopes, from runs disturbed by other load); a
scheduler packing batches by such a fit would do worse than counting. Groups
below the bar fall back to a reliable fit of the same stage at the nearest
configuration, or to the count model.
"""
_RANK_TOL = 1e-9


class SampleLike(Protocol):
    """What the fit reads from a sample (the profiler's ``Sample`` has these attributes)."""

    @property
    def stage(self) -> str: ...
    @property
    def hardware(self) -> str: ...
    @property
    def batch(self) -> int: ...
    @property
    def vcpus(self) -> int: ...
    @property
    def gpu_share(self) -> float: ...
    @property
    def total_size(self) -> float: ...
    @property
    def latency_ms(self) -> float: ...


@dataclass(frozen=True, slots=True)
class SizeSample:
    """One timed call: configuration, the batch's total input size, latency."""

    stage: str
    hardware: str
    batch: int
    vcpus: int
    gpu_share: float
    total_size: float
    latency_ms: float

    def __post_init__(self) -> None:
        if self.batch < 1:
            raise ProfileError(f"batch must be >= 1, got {self.batch}")
        if not (math.isfinite(self.total_size) and self.total_size >= 0):
            raise ProfileError(f"total_size must be a finite number >= 0, got {self.total_size!r}")
        if not (math.isfinite(self.latency_ms) and self.latency_ms > 0):
            raise ProfileError(f"latency_ms must be a finite number > 0, got {self.latency_ms!r}")


Key = tuple[str, str, int, float]
"""(stage, hardware, vcpus, gpu_share)."""


@dataclass(frozen=True, slots=True)
class SizeFit:
    """The fitted model of one (stage, hardware, vcpus, gpu_share).

    Args:
        intercepts_ms: ``(batch, a[batch])`` per measured batch size, ascending.
        per_size_ms: ``c``, the cost of one more unit of input size (0 when the size was dropped).
        samples: calls fitted.
        r2: coefficient of determination on those calls.
        uses_size: whether the size term was kept.
        typical_item_size: the mean size of one item over the fitted calls: the
            size the profile table's count model implicitly assumes.
    """

    stage: str
    hardware: str
    vcpus: int
    gpu_share: float
    intercepts_ms: tuple[tuple[int, float], ...]
    per_size_ms: float
    samples: int
    r2: float
    uses_size: bool
    typical_item_size: float = 0.0

    @property
    def reliable(self) -> bool:
        """Whether a scheduler should trust the size term (see :data:`MIN_R2`)."""
        return self.uses_size and self.per_size_ms > 0 and self.r2 >= MIN_R2 and self.typical_item_size > 0

    def intercept_ms(self, batch: int) -> float:
        """``a[batch]``: measured, interpolated between measured sizes, or extrapolated from the nearest two."""
        pts = self.intercepts_ms
        if len(pts) == 1:
            return pts[0][1]
        i = min(max(bisect.bisect_left([p[0] for p in pts], batch), 1), len(pts) - 1)
        (b0, y0), (b1, y1) = pts[i - 1], pts[i]
        return y0 + (y1 - y0) * (batch - b0) / (b1 - b0)

    def predict(self, batch: int, total_size: float) -> float:
        """Predicted latency of a batch of ``batch`` items of ``total_size`` in all."""
        return max(self.intercept_ms(batch) + self.per_size_ms * total_size, MIN_LATENCY_MS)


def _solve(rows: list[list[float]], y: list[float]) -> list[float] | None:
    """Least squares by the normal equations with column scaling; None when the columns are dependent."""
    n = len(rows[0])
    scale = [max(abs(r[j]) for r in rows) or 1.0 for j in range(n)]
    xs = [[r[j] / scale[j] for j in range(n)] for r in rows]
    a = [
        [sum(x[i] * x[j] for x in xs) for j in range(n)] + [sum(x[i] * t for x, t in zip(xs, y, strict=True))]
        for i in range(n)
    ]
    norm = max(abs(a[i][i]) for i in range(n)) or 1.0
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(a[r][c]))
        if abs(a[p][c]) <= _RANK_TOL * norm:
            return None
        a[c], a[p] = a[p], a[c]
        for r in range(n):
            if r != c:
                f = a[r][c] / a[c][c]
                a[r] = [v - f * w for v, w in zip(a[r], a[c], strict=True)]
    return [a[i][n] / a[i][i] / scale[i] for i in range(n)]


def _dependent(sizes: list[float], batches: list[float]) -> bool:
    """Whether ``total_size`` is (nearly) proportional to ``batch``: every item the same size."""
    per_item = [z / b for z, b in zip(sizes, batches, strict=True)]
    mean = statistics.fmean(per_item)
    return mean == 0 or (max(per_item) - min(per_item)) <= 1e-6 * abs(mean)


def fit_one(samples: Sequence[SampleLike]) -> SizeFit:
    """Fit one (stage, hardware, vcpus, gpu_share) group (see the module docstring).

    Raises:
        ProfileError: on mixed groups or fewer than 2 samples.
    """
    if len(samples) < 2:
        raise ProfileError(f"a size fit needs at least 2 samples, got {len(samples)}")
    keys = {(s.stage, s.hardware, s.vcpus, float(s.gpu_share)) for s in samples}
    if len(keys) != 1:
        raise ProfileError(f"fit_one needs samples of one (stage, hardware, vcpus, gpu_share), got {sorted(keys)}")
    stage, hw, v, share = keys.pop()
    y = [float(s.latency_ms) for s in samples]
    b = [int(s.batch) for s in samples]
    z = [float(s.total_size) for s in samples]
    batches = sorted(set(b))
    use_z = not _dependent(z, [float(x) for x in b]) and len(set(z)) > 1
    coef: list[float] | None = None
    if use_z:
        cols = [[1.0 if bi == bb else 0.0 for bb in batches] + [zi] for bi, zi in zip(b, z, strict=True)]
        coef = _solve(cols, y) if len(y) > len(batches) else None
        use_z = coef is not None
    if coef is None:  # the count model: the mean per batch size
        coef = [statistics.fmean(t for t, bi in zip(y, b, strict=True) if bi == bb) for bb in batches]
    intercepts = tuple(zip(batches, coef[: len(batches)], strict=True))
    slope = coef[len(batches)] if use_z else 0.0
    index = {bb: i for i, bb in enumerate(batches)}
    pred = [coef[index[bi]] + slope * zi for bi, zi in zip(b, z, strict=True)]
    mean = statistics.fmean(y)
    ss_tot = sum((t - mean) ** 2 for t in y)
    ss_res = sum((t - p) ** 2 for t, p in zip(y, pred, strict=True))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    typical = statistics.fmean(zi / bi for zi, bi in zip(z, b, strict=True))
    return SizeFit(stage, hw, v, share, intercepts, slope, len(y), r2, use_z, typical)


SAMPLE_COLUMNS = ("stage", "hardware", "batch", "vcpus", "gpu_share", "total_size", "latency_ms")
"""The columns of the profiler's samples CSV, one row per timed call."""
SAMPLES_KIND = "a samples CSV (<name>_samples.csv, one row per timed call, written by esg-prefect profile)"


def read_samples_csv(path: str | Path) -> list[SizeSample]:
    """The per-call samples of a profiler run (``<profile>_samples.csv``, written by the profiler).

    Raises:
        ProfileError: naming the file and line of a malformed row, or the missing columns and the
            file expected (a profile CSV given instead lacks ``total_size`` and ``latency_ms``).
    """

    def sample(r: dict[str, str]) -> SizeSample:
        return SizeSample(
            *config_columns(r),
            decimal(r, "total_size"),
            decimal(r, "latency_ms"),
        )

    return read_rows(path, sample, required=SAMPLE_COLUMNS, kind=SAMPLES_KIND)


class SizeModel:
    """Fitted size-aware latencies, by (stage, hardware, vcpus, gpu_share).

    Use :meth:`fit` on the profiler's samples
    (:func:`esg_prefect.profiler.results.read_samples_csv`).
    """

    def __init__(self, fits: Iterable[SizeFit]) -> None:
        self._fits: dict[Key, SizeFit] = {}
        for f in fits:
            key = (f.stage, f.hardware, f.vcpus, float(f.gpu_share))
            if key in self._fits:
                raise ProfileError(f"two size fits for {key}")
            self._fits[key] = f
        self._steering: dict[Key, SizeFit | None] = {}

    @classmethod
    def fit(cls, samples: Iterable[SampleLike], min_samples: int = 3) -> SizeModel:
        """Fit every (stage, hardware, vcpus, gpu_share) group with at least ``min_samples`` calls."""
        groups: dict[Key, list[SampleLike]] = {}
        for s in samples:
            groups.setdefault((s.stage, s.hardware, s.vcpus, float(s.gpu_share)), []).append(s)
        return cls(fit_one(g) for g in groups.values() if len(g) >= max(min_samples, 2))

    def aliased(self, aliases: Mapping[str, str]) -> SizeModel:
        """A copy in which each stage ``alias`` has the fits of ``aliases[alias]`` (in place of its own)."""
        aliases = {a: st for a, st in aliases.items() if a != st}
        extra = [replace(f, stage=a) for a, st in aliases.items() for f in self._fits.values() if f.stage == st]
        kept = [f for f in self._fits.values() if f.stage not in aliases]
        return SizeModel([*kept, *extra])

    def steering_fit(self, stage: str, hardware: str, vcpus: int, gpu_share: float) -> SizeFit | None:
        """The fit a scheduler uses for one configuration; None when the stage is not size-aware.

        The group's own fit when :attr:`SizeFit.reliable`; otherwise the reliable
        fit of the same stage and hardware nearest in GPU share, then in vCPUs
        (the size *effect* is a ratio and carries over between configurations
        far better than a bad fit does); None when no fit of the stage is reliable.
        """
        key = (stage, hardware, vcpus, float(gpu_share))
        if key in self._steering:
            return self._steering[key]
        own = self._fits.get(key)
        if own is not None and own.reliable:
            best: SizeFit | None = own
        else:
            near = [f for (s, hw, _, _), f in self._fits.items() if s == stage and hw == hardware and f.reliable]
            best = min(near, key=lambda f: (abs(f.gpu_share - gpu_share), abs(f.vcpus - vcpus), f.vcpus), default=None)
        self._steering[key] = best
        return best

    def factor(
        self, stage: str, item_sizes: Sequence[float], *, hardware: str, vcpus: int, gpu_share: float = 0.0
    ) -> float:
        """How much longer (> 1) or shorter (< 1) a batch of ``item_sizes`` runs than one of typical items.

        Like :meth:`size_factor`, with the typical size the fit saw and the
        fallbacks of :meth:`steering_fit`; 1.0 where no reliable fit exists.
        Item sizes are in the stage's own unit (what its size function returns,
        as measured by the profiler).

        Raises:
            ProfileError: on an empty batch.
        """
        if not item_sizes:
            raise ProfileError("a batch has at least one item")
        return self.total_factor(
            stage, len(item_sizes), float(sum(item_sizes)), hardware=hardware, vcpus=vcpus, gpu_share=gpu_share
        )

    def total_factor(
        self, stage: str, n: int, total_size: float, *, hardware: str, vcpus: int, gpu_share: float = 0.0
    ) -> float:
        """:meth:`factor` of ``n`` items whose sizes sum to ``total_size`` (for callers keeping running sums)."""
        fit = self.steering_fit(stage, hardware, vcpus, gpu_share)
        if fit is None:
            return 1.0
        ratio = fit.predict(n, total_size) / fit.predict(n, n * fit.typical_item_size)
        return min(max(ratio, FACTOR_BOUNDS[0]), FACTOR_BOUNDS[1])

    def typical_item_size(self, stage: str, hardware: str | None = None) -> float | None:
        """The mean item size the stage was profiled with (on ``hardware``, or any); None without a reliable fit."""
        fits = [
            f
            for (s, hw, _, _), f in self._fits.items()
            if s == stage and (hardware is None or hw == hardware) and f.reliable
        ]
        return statistics.fmean(f.typical_item_size for f in fits) if fits else None

    @classmethod
    def from_samples_csv(cls, path: str | Path) -> SizeModel:
        """Fit the samples of a profiler run's ``_samples.csv``."""
        return cls.fit(read_samples_csv(path))

    @property
    def fits(self) -> tuple[SizeFit, ...]:
        """Every fit."""
        return tuple(self._fits.values())

    def get(self, stage: str, hardware: str = "cpu", vcpus: int = 1, gpu_share: float = 0.0) -> SizeFit:
        """The fit of one group.

        Raises:
            MissingProfileError: naming the group when it was not fitted.
        """
        fit = self._fits.get((stage, hardware, vcpus, float(gpu_share)))
        if fit is None:
            raise MissingProfileError(
                f"no size fit for stage {stage!r} on {hardware!r} with vcpus={vcpus} gpu_share={gpu_share}"
            )
        return fit

    def size_sensitive(self, stage: str) -> bool:
        """Whether any fit of ``stage`` kept the size term."""
        return any(f.uses_size for (s, *_), f in self._fits.items() if s == stage)

    def latency_ms(
        self, stage: str, item_sizes: Sequence[float], *, vcpus: int, gpu_share: float = 0.0, hardware: str = "cpu"
    ) -> float:
        """Predicted latency of one batch made of items of ``item_sizes``.

        Raises:
            ProfileError: on an empty batch.
            MissingProfileError: when the group was not fitted.
        """
        if not item_sizes:
            raise ProfileError("a batch has at least one item")
        return self.get(stage, hardware, vcpus, gpu_share).predict(len(item_sizes), float(sum(item_sizes)))

    def size_factor(
        self,
        stage: str,
        item_sizes: Sequence[float],
        typical_item_size: float,
        *,
        vcpus: int,
        gpu_share: float = 0.0,
        hardware: str = "cpu",
    ) -> float:
        """How much longer (> 1) or shorter (< 1) a batch of ``item_sizes`` runs than one of typical items.

        The bridge to the profile table (the way to wire this model into a
        scheduler): ``profile.latency_ms(stage, config, hw, size_factor=size_factor(...))``
        keeps the profile's percentile and its interpolation over vcpus and GPU
        shares, and rescales by the fitted size effect. ``typical_item_size`` is
        the mean item size the profile was measured with (the profiler's
        ``mean_input_size`` column). 1.0 when the stage's fit dropped the size term.

        Raises:
            ProfileError: on an empty batch or a typical size <= 0.
            MissingProfileError: when the group was not fitted.
        """
        if not item_sizes:
            raise ProfileError("a batch has at least one item")
        if not typical_item_size > 0:
            raise ProfileError(f"typical_item_size must be > 0, got {typical_item_size!r}")
        fit = self.get(stage, hardware, vcpus, gpu_share)
        if not fit.uses_size:
            return 1.0
        n = len(item_sizes)
        return fit.predict(n, float(sum(item_sizes))) / fit.predict(n, n * typical_item_size)


@dataclass(frozen=True, slots=True)
class HoldoutError:
    """Median absolute percentage error on held-out calls: size model versus count model (mean per batch size)."""

    stage: str
    calls: int
    size_mape: float
    count_mape: float
    uses_size: bool


def holdout_errors(samples: Iterable[SampleLike], min_samples: int = 6) -> list[HoldoutError]:
    """Fit on every other call of each group, test on the rest, per stage.

    The count model predicts the mean latency of the training calls of the same
    batch size (what a profile table gives); the size model is :func:`fit_one`.
    Why held out: on the calls it was fitted to, a model with more terms always
    looks better.
    """
    groups: dict[Key, list[SampleLike]] = {}
    for s in samples:
        groups.setdefault((s.stage, s.hardware, s.vcpus, float(s.gpu_share)), []).append(s)
    per_stage: dict[str, tuple[list[float], list[float], bool]] = {}
    for key, g in groups.items():
        if len(g) < min_samples:
            continue
        train, test = g[0::2], g[1::2]
        fit = fit_one(train)
        by_batch: dict[int, list[float]] = {}
        for s in train:
            by_batch.setdefault(s.batch, []).append(s.latency_ms)
        sz, ct, used = per_stage.setdefault(key[0], ([], [], False))
        for s in test:
            if s.batch not in by_batch:
                continue
            sz.append(abs(fit.predict(s.batch, s.total_size) - s.latency_ms) / s.latency_ms)
            ct.append(abs(statistics.fmean(by_batch[s.batch]) - s.latency_ms) / s.latency_ms)
        per_stage[key[0]] = (sz, ct, used or fit.uses_size)
    return [
        HoldoutError(st, len(sz), statistics.median(sz), statistics.median(ct), used)
        for st, (sz, ct, used) in per_stage.items()
        if sz
    ]
