"""Latency model: batch latency of a stage from a measured profile table.

``L(stage, config, hardware) -> ms`` for one batch (ESG-SPEC section 2). A
profile is a table of measured points ``(stage, hardware, batch, vcpus,
gpu_share) -> (mean_ms, p95_ms)`` plus a cold-start time per (stage, hardware).

Between measured points the model interpolates (choice, documented in the
README): piecewise linear in the batch size, and linear in ``1/vcpus`` and in
``1/gpu_share`` between the measured resource levels that bracket the query,
because throughput, not latency, scales about linearly with resources. It never
extrapolates: a query outside the measured range raises
:class:`MissingProfileError`, so the scheduler plans only with what was
measured. Which statistic the scheduler plans with is a knob (``p95`` where
measured, else the mean).

CSV format (header required; extra columns are skipped, but one that looks like a
misspelt name of a column the table lacks, ``p95`` for ``p95_ms``, is refused)::

    stage,hardware,batch,vcpus,gpu_share,mean_ms,p95_ms,cold_start_ms
    resnet,cpu,1,1,0,41.5,44.0,820
    resnet,T4,8,2,0.5,12.0,13.1,2400
"""

from __future__ import annotations

import bisect
import csv
import io
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from esg_prefect.exceptions import MissingProfileError, ProfileError
from esg_prefect.model.config import CPU, Config, normalize_share
from esg_prefect.model.csv_rows import check_row_width, decimal, integer, misnamed_columns
from esg_prefect.model.size_model import SizeModel

Percentile = Literal["p95", "mean"]
PROFILE_COLUMNS = ("stage", "hardware", "batch", "vcpus", "gpu_share", "mean_ms", "p95_ms", "cold_start_ms")
"""The columns a profile CSV is read from, in the order :meth:`LatencyProfile.to_csv` writes them."""
PROFILER_COLUMNS = (
    "p50_ms",
    "peak_mem_mb",
    "model_mem_mb",
    "gpu_peak_mem_mb",
    "load_ms",
    "worker_start_ms",
    "reps",
    "attempts",
    "other_cpu",
    "quiet",
    "mean_input_size",
    "pipeline",
)
"""The columns ``esg-prefect profile`` writes after those: skipped, never taken for misspelt names."""
_PERCENTILES = ("p95", "mean")


@dataclass(frozen=True, slots=True)
class ProfilePoint:
    """One measured batch latency.

    Args:
        stage: stage (function) name.
        hardware: ``"cpu"`` for CPU-only points, else a GPU type such as ``"T4"``.
        batch: batch size measured.
        vcpus: vCPUs of the worker.
        gpu_share: GPU share, 0 for CPU-only points.
        mean_ms: mean batch latency in ms.
        p95_ms: 95th percentile batch latency in ms, if measured.
    """

    stage: str
    hardware: str
    batch: int
    vcpus: int
    gpu_share: float
    mean_ms: float
    p95_ms: float | None = None

    def __post_init__(self) -> None:
        if not self.stage:
            raise ProfileError(f"stage must be a non-empty name, got {self.stage!r}")
        if not self.hardware:
            raise ProfileError(f"hardware must be a non-empty name, got {self.hardware!r}")
        Config(self.batch, self.vcpus, self.gpu_share)  # validates the three values
        object.__setattr__(self, "gpu_share", normalize_share(self.gpu_share))
        if (self.gpu_share == 0.0) != (self.hardware == CPU):
            raise ProfileError(
                f"hardware {self.hardware!r} does not fit gpu_share {self.gpu_share}: "
                f"CPU points have gpu_share 0 and hardware {CPU!r}"
            )
        if not (math.isfinite(self.mean_ms) and self.mean_ms > 0):
            raise ProfileError(f"mean_ms must be a finite number > 0, got {self.mean_ms!r}")
        if self.p95_ms is not None and not (math.isfinite(self.p95_ms) and self.p95_ms > 0):
            raise ProfileError(f"p95_ms must be a finite number > 0 or empty, got {self.p95_ms!r}")

    def value(self, percentile: Percentile) -> float:
        """The statistic to plan with: p95 where measured, else the mean."""
        if percentile == "p95" and self.p95_ms is not None:
            return self.p95_ms
        return self.mean_ms


class _Grid:
    """Measured points of one (stage, hardware), indexed for interpolation."""

    __slots__ = ("by_resources", "shares", "vcpus")

    def __init__(self, points: Iterable[ProfilePoint]) -> None:
        self.by_resources: dict[tuple[int, float], dict[int, ProfilePoint]] = {}
        for p in points:
            row = self.by_resources.setdefault((p.vcpus, p.gpu_share), {})
            if p.batch in row:
                raise ProfileError(
                    f"duplicate profile point for stage {p.stage!r} on {p.hardware!r}: "
                    f"batch={p.batch} vcpus={p.vcpus} gpu_share={p.gpu_share}"
                )
            row[p.batch] = p
        self.vcpus = sorted({v for v, _ in self.by_resources})
        self.shares = sorted({s for _, s in self.by_resources})

    def batch_latency(self, vcpus: int, share: float, batch: int, pct: Percentile) -> float | None:
        row = self.by_resources.get((vcpus, share))
        if row is None:
            return None
        if batch in row:
            return row[batch].value(pct)
        batches = sorted(row)
        i = bisect.bisect_left(batches, batch)
        if i == 0 or i == len(batches):
            return None  # outside the measured batch range: never extrapolate
        b0, b1 = batches[i - 1], batches[i]
        l0, l1 = row[b0].value(pct), row[b1].value(pct)
        return l0 + (l1 - l0) * (batch - b0) / (b1 - b0)


def _bracket(values: list[int] | list[float], x: float) -> tuple[float, float] | None:
    """The measured values that bracket x (equal if x itself was measured)."""
    i = bisect.bisect_left(values, x)
    if i < len(values) and values[i] == x:
        return values[i], values[i]
    if i == 0 or i == len(values):
        return None
    return values[i - 1], values[i]


def _check_overhead(key: tuple[str, str], ms: float) -> None:
    """A per-batch overhead is a finite number of ms >= 0."""
    if not (math.isfinite(ms) and ms >= 0):
        raise ProfileError(f"latency overhead for {key} must be a finite number >= 0 ms, got {ms!r}")


def _inverse_lerp(x0: float, y0: float, x1: float, y1: float, x: float) -> float:
    """Linear interpolation in 1/x between (x0, y0) and (x1, y1)."""
    if x0 == x1:
        return y0
    t = (1.0 / x - 1.0 / x0) / (1.0 / x1 - 1.0 / x0)
    return y0 + (y1 - y0) * t


class LatencyProfile:
    """Measured batch latencies and cold starts of stages, with interpolation.

    Args:
        points: the measured points.
        cold_start_ms: model load time per ``(stage, hardware)``; missing pairs
            cost 0 ms to start.
        sizes: the input-size model fitted from the same profiling runs
            (Cypress, :mod:`esg_prefect.model.size_model`), or None for a
            count-only profile. The table answers for batches of typical items;
            :meth:`size_factor` rescales it for a batch's real items.
        overheads: a per-batch time in ms per ``(stage, hardware)`` added to
            every batch after any size factor (what :meth:`scaled` learns from
            the online correction); missing pairs add 0 ms.

    Raises:
        ProfileError: on duplicate points, negative cold starts or overheads.

    Examples:
        >>> prof = LatencyProfile([
        ...     ProfilePoint("enc", "cpu", 1, 1, 0.0, 10.0),
        ...     ProfilePoint("enc", "cpu", 4, 1, 0.0, 22.0),
        ... ])
        >>> prof.latency_ms("enc", Config(2, 1, 0.0), "cpu")
        14.0
    """

    def __init__(
        self,
        points: Iterable[ProfilePoint],
        cold_start_ms: Mapping[tuple[str, str], float] | None = None,
        sizes: SizeModel | None = None,
        overheads: Mapping[tuple[str, str], float] | None = None,
    ) -> None:
        self._points = tuple(points)
        self.sizes = sizes
        grouped: dict[tuple[str, str], list[ProfilePoint]] = {}
        for p in self._points:
            grouped.setdefault((p.stage, p.hardware), []).append(p)
        self._grids = {key: _Grid(pts) for key, pts in grouped.items()}
        self._cold: dict[tuple[str, str], float] = {}
        for key, ms in (cold_start_ms or {}).items():
            if not (math.isfinite(ms) and ms >= 0):
                raise ProfileError(f"cold_start_ms for {key} must be >= 0, got {ms!r}")
            self._cold[key] = float(ms)
        self._overheads: dict[tuple[str, str], float] = {}
        for key, ms in (overheads or {}).items():
            _check_overhead(key, ms)
            if ms > 0:
                self._overheads[key] = float(ms)

    @property
    def points(self) -> tuple[ProfilePoint, ...]:
        """Every measured point, in the order given (without the per-batch overheads: :meth:`overhead_ms`)."""
        return self._points

    def overhead_ms(self, stage: str, hardware: str) -> float:
        """The per-batch time added to every batch of ``stage`` on ``hardware``, whatever its items' size."""
        return self._overheads.get((stage, hardware), 0.0)

    def stages(self) -> frozenset[str]:
        """Stages with at least one measured point."""
        return frozenset(stage for stage, _ in self._grids)

    def all_hardware(self) -> frozenset[str]:
        """Every hardware type with a measured point, whatever the stage."""
        return frozenset(hw for _, hw in self._grids)

    def hardware_types(self, stage: str) -> frozenset[str]:
        """Hardware types on which ``stage`` was measured."""
        return frozenset(hw for st, hw in self._grids if st == stage)

    def measured_configs(self, stage: str, hardware: str) -> list[Config]:
        """Every configuration measured for ``stage`` on ``hardware``."""
        grid = self._grids.get((stage, hardware))
        if grid is None:
            return []
        return sorted(Config(b, v, s) for (v, s), row in grid.by_resources.items() for b in row)

    def cold_start_ms(self, stage: str, hardware: str) -> float:
        """Time to start a worker and load the stage's model on ``hardware``."""
        return self._cold.get((stage, hardware), 0.0)

    def latency_ms(
        self, stage: str, config: Config, hardware: str, percentile: Percentile = "p95", size_factor: float = 1.0
    ) -> float:
        """Predicted latency of one batch of ``stage`` with ``config`` on ``hardware``.

        ``table * size_factor + overhead``: the measured table answers for
        typical items, ``size_factor`` (:meth:`size_factor`) rescales it for
        the batch's own, and the per-batch overhead (:meth:`overhead_ms`) is
        added once, since it does not grow with the items' size.

        Raises:
            MissingProfileError: when the measured points do not cover the query.
            ProfileError: when ``percentile`` is not ``"p95"`` or ``"mean"``.
        """
        value = self.try_latency_ms(stage, config, hardware, percentile, size_factor)
        if value is None:
            raise MissingProfileError(
                f"no profile covers stage {stage!r} on {hardware!r} with {config}; "
                f"measured hardware for it: {sorted(self.hardware_types(stage)) or 'none'}"
            )
        return value

    def try_latency_ms(
        self, stage: str, config: Config, hardware: str, percentile: Percentile = "p95", size_factor: float = 1.0
    ) -> float | None:
        """Like :meth:`latency_ms` but returns None where the profile has no cover."""
        value = self._table_ms(stage, config, hardware, percentile)
        if value is None:
            return None
        return value * size_factor + self.overhead_ms(stage, hardware)

    def _table_ms(self, stage: str, config: Config, hardware: str, percentile: Percentile) -> float | None:
        """The measured table's latency, interpolated (None where it has no cover)."""
        if percentile not in _PERCENTILES:
            raise ProfileError(f"percentile must be one of {_PERCENTILES}, got {percentile!r}")
        if (config.gpu_share == 0.0) != (hardware == CPU):
            return None
        grid = self._grids.get((stage, hardware))
        if grid is None:
            return None
        vb = _bracket(grid.vcpus, config.vcpus)
        sb = _bracket(grid.shares, config.gpu_share)
        if vb is None or sb is None:
            return None
        corners: dict[tuple[float, float], float] = {}
        for v in set(vb):
            for s in set(sb):
                lat = grid.batch_latency(int(v), s, config.batch, percentile)
                if lat is None:
                    return None
                corners[(v, s)] = lat
        v0, v1 = vb
        s0, s1 = sb
        if s0 == 0.0:  # CPU-only: nothing to interpolate over the share
            return _inverse_lerp(v0, corners[(v0, s0)], v1, corners[(v1, s0)], config.vcpus)
        low_v = _inverse_lerp(s0, corners[(v0, s0)], s1, corners[(v0, s1)], config.gpu_share)
        high_v = _inverse_lerp(s0, corners[(v1, s0)], s1, corners[(v1, s1)], config.gpu_share)
        return _inverse_lerp(v0, low_v, v1, high_v, config.vcpus)

    def with_sizes(self, sizes: SizeModel | None) -> LatencyProfile:
        """A copy of this profile carrying ``sizes`` (None: count-only)."""
        return LatencyProfile(self._points, self._cold, sizes, self._overheads)

    def aliased(self, aliases: Mapping[str, str]) -> LatencyProfile:
        """A copy in which each stage ``alias`` answers with the measurements of ``aliases[alias]``.

        A pool gives a stage another name when its name is taken by other code
        (:mod:`esg_prefect.runtime.bindings`), or a stage names another's profile
        (``profile_name``); the name is planned with the profile of the stage it
        was declared as, in place of any points of its own.
        """
        aliases = {a: st for a, st in aliases.items() if a != st}
        extra = [
            ProfilePoint(alias, p.hardware, p.batch, p.vcpus, p.gpu_share, p.mean_ms, p.p95_ms)
            for alias, stage in aliases.items()
            for p in self._points
            if p.stage == stage
        ]
        kept = [p for p in self._points if p.stage not in aliases]
        cold = dict(self._cold)
        cold.update({(a, hw): ms for a, st in aliases.items() for (s, hw), ms in self._cold.items() if s == st})
        over = {(s, hw): ms for (s, hw), ms in self._overheads.items() if s not in aliases}
        over.update({(a, hw): ms for a, st in aliases.items() for (s, hw), ms in self._overheads.items() if s == st})
        sizes = None if self.sizes is None else self.sizes.aliased(aliases)
        return LatencyProfile([*kept, *extra], cold, sizes, over)

    def size_factor(self, stage: str, config: Config, hardware: str, item_sizes: Iterable[float]) -> float:
        """How much the batch of ``item_sizes`` runs longer (> 1) or shorter than typical items; 1 if count-only.

        Item sizes are in the stage's own unit (its size function's, as the
        profiler measured them). See :meth:`SizeModel.factor`. Pass it to
        :meth:`latency_ms` rather than multiplying its answer, which holds the
        per-batch overhead that items' size does not scale.
        """
        if self.sizes is None:
            return 1.0
        sizes = list(item_sizes)
        if not sizes:
            return 1.0
        return self.sizes.factor(stage, sizes, hardware=hardware, vcpus=config.vcpus, gpu_share=config.gpu_share)

    def scaled(
        self, factors: Mapping[tuple[str, str], float], overheads: Mapping[tuple[str, str], float] | None = None
    ) -> LatencyProfile:
        """A copy whose batch latencies of each ``(stage, hardware)`` are ``latency * factor + overhead``.

        This is how an online correction (:mod:`esg_prefect.model.correction`)
        reaches the scheduler: one factor per (stage, hardware) scales the whole
        measured table, so the profile's shape over batch sizes and resources is
        kept and only its level moves; one overhead in ms (what a batch's round
        trip to its worker costs beyond the model's own time) is added to every
        batch, its mean and p95 alike, after any size factor (:meth:`latency_ms`):
        it is kept apart from the points, not folded into them. Cold starts are
        left alone (model loading is not what drifts with load). Pairs absent
        from ``factors`` keep factor 1, from ``overheads`` overhead 0.

        Raises:
            ProfileError: for a factor that is not a finite number > 0, or an
                overhead that is not a finite number >= 0.
        """
        for key, f in factors.items():
            if not (math.isfinite(f) and f > 0):
                raise ProfileError(f"latency factor for {key} must be a finite number > 0, got {f!r}")
        extra = dict(overheads or {})
        for key, o in extra.items():
            _check_overhead(key, o)
        # This profile's own overheads scale with the factor: (table + own) * f + o.
        over = {key: o * factors.get(key, 1.0) for key, o in self._overheads.items()}
        for key, o in extra.items():
            over[key] = over.get(key, 0.0) + o

        def moved(p: ProfilePoint) -> ProfilePoint:
            f = factors.get((p.stage, p.hardware), 1.0)
            if f == 1.0:
                return p
            p95 = None if p.p95_ms is None else p.p95_ms * f
            return ProfilePoint(p.stage, p.hardware, p.batch, p.vcpus, p.gpu_share, p.mean_ms * f, p95)

        return LatencyProfile([moved(p) for p in self._points], self._cold, self.sizes, over)

    # ---- CSV -------------------------------------------------------------

    @classmethod
    def from_csv(cls, source: str | Path | io.TextIOBase) -> LatencyProfile:
        """Load a profile from a CSV file path or an open text stream.

        From a path ``<name>.csv``, the per-call samples the profiler writes
        beside it (``<name>_samples.csv``), when present, are fitted into the
        profile's size model (:attr:`sizes`), so a profile measured by
        ``esg-prefect profile`` comes with its Cypress model.

        Raises:
            ProfileError: naming the row and column of a malformed value.
        """
        if isinstance(source, (str, Path)):
            with open(source, newline="", encoding="utf-8-sig") as fh:  # a spreadsheet's BOM is not a column name
                profile = cls._parse(csv.DictReader(fh), str(source))
            samples = Path(source).with_name(f"{Path(source).stem}_samples.csv")
            return profile.with_sizes(SizeModel.from_samples_csv(samples)) if samples.exists() else profile
        return cls._parse(csv.DictReader(source), "<stream>")

    @classmethod
    def _parse(cls, reader: csv.DictReader[str], origin: str) -> LatencyProfile:
        header = list(reader.fieldnames or ())
        missing = set(PROFILE_COLUMNS[:6]) - set(header)
        if missing:  # most often another table (validation, stalls) given as the profile
            raise ProfileError(f"{origin}: missing columns {sorted(missing)}; its header: {header}")
        misnamed = misnamed_columns(header, PROFILE_COLUMNS[6:], PROFILER_COLUMNS)  # the optional columns
        if misnamed:
            raise ProfileError(f"{origin}: {'; '.join(misnamed)}")
        points: list[ProfilePoint] = []
        cold: dict[tuple[str, str], float] = {}
        for lineno, row in enumerate(reader, start=2):
            try:
                check_row_width(row, len(header))
                p95 = row.get("p95_ms") or ""
                point = ProfilePoint(
                    stage=row["stage"],
                    hardware=row["hardware"],
                    batch=integer(row, "batch"),
                    vcpus=integer(row, "vcpus"),
                    gpu_share=decimal(row, "gpu_share"),
                    mean_ms=decimal(row, "mean_ms"),
                    p95_ms=decimal(row, "p95_ms") if p95.strip() else None,
                )
                cs = (row.get("cold_start_ms") or "").strip()
                if cs:
                    ms = decimal(row, "cold_start_ms")
                    # Check here, not in __init__: max() below would turn a negative or NaN
                    # value into 0 silently, and here the error can name the line.
                    if not (math.isfinite(ms) and ms >= 0):
                        raise ProfileError(f"cold_start_ms must be a finite number >= 0, got {ms!r}")
                    key = (point.stage, point.hardware)
                    cold[key] = max(cold.get(key, 0.0), ms)
            except (ValueError, TypeError) as exc:
                raise ProfileError(f"{origin} line {lineno}: {exc}") from exc
            points.append(point)
        return cls(points, cold)

    def to_csv(self, target: str | Path) -> None:
        """Write the profile in the format :meth:`from_csv` reads (its points and cold starts; not the overheads).

        A correction's per-batch overheads belong to the pool that learned
        them, not to the measured table.
        """
        with open(target, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=PROFILE_COLUMNS)
            writer.writeheader()
            for p in self._points:
                writer.writerow(
                    {
                        "stage": p.stage,
                        "hardware": p.hardware,
                        "batch": p.batch,
                        "vcpus": p.vcpus,
                        "gpu_share": p.gpu_share,
                        "mean_ms": p.mean_ms,
                        "p95_ms": "" if p.p95_ms is None else p.p95_ms,
                        "cold_start_ms": self._cold.get((p.stage, p.hardware), ""),
                    }
                )
