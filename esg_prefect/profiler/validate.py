"""Validation: the profile's predictions against fresh measurements, error per stage.

A latency profile is useful to the scheduler only if it predicts what a batch
will cost at configurations it did *not* measure as well as at those it did.
:func:`validate` measures every stage again, in fresh worker processes, at
batch sizes between the measured ones (3, 6, 12, 24 by default) and at some
measured ones (1, 8), for each measured (hardware, vcpus, GPU share); it
predicts each with :meth:`LatencyProfile.latency_ms` (``percentile="mean"``,
the interpolated mean) and reports the absolute percentage error
``|predicted - measured| / measured`` per point, and its median per stage.
The project's target is a median of at most 15 % per stage on the CPU.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from esg_prefect.exceptions import InvalidInputError
from esg_prefect.model import Config, LatencyProfile
from esg_prefect.model.csv_rows import config_columns, decimal, read_rows
from esg_prefect.profiler.machine import CpuWatch
from esg_prefect.profiler.measure import MeasureSettings
from esg_prefect.profiler.results import ProfiledPoint
from esg_prefect.profiler.worker import Job, run_worker

VALIDATION_BATCHES: tuple[int, ...] = (1, 3, 6, 8, 12, 24)
TARGET_MEDIAN_APE = 0.15


@dataclass(frozen=True, slots=True)
class ValidationRow:
    """One fresh measurement and the profile's prediction for it."""

    stage: str
    hardware: str
    batch: int
    vcpus: int
    gpu_share: float
    interpolated: bool
    predicted_ms: float
    measured_ms: float
    quiet: bool

    @property
    def ape(self) -> float:
        """Absolute percentage error, as a fraction: ``|predicted - measured| / measured``."""
        return abs(self.predicted_ms - self.measured_ms) / self.measured_ms


@dataclass(frozen=True, slots=True)
class ValidationReport:
    """Every validation row, and how busy the rest of the machine was meanwhile (cores per configuration)."""

    rows: tuple[ValidationRow, ...]
    other_cpu: dict[str, float | None]
    target: float = TARGET_MEDIAN_APE

    def median_ape(self, stage: str | None = None, *, interpolated: bool | None = None) -> float:
        """Median APE over the rows of ``stage`` (all stages when None), optionally only (non-)interpolated ones.

        Raises:
            InvalidInputError: when no row matches.
        """
        errs = [
            r.ape
            for r in self.rows
            if (stage is None or r.stage == stage) and (interpolated is None or r.interpolated == interpolated)
        ]
        if not errs:
            raise InvalidInputError(f"no validation rows for stage {stage!r} (interpolated={interpolated})")
        return statistics.median(errs)

    def stages(self) -> list[str]:
        """Stages validated, in order of first appearance."""
        return list(dict.fromkeys(r.stage for r in self.rows))

    def per_stage(self) -> dict[str, float]:
        """Median APE per stage."""
        return {s: self.median_ape(s) for s in self.stages()}

    def passed(self) -> bool:
        """Whether every stage's median APE is within the target."""
        return all(v <= self.target for v in self.per_stage().values())

    def table(self) -> str:
        """A text table: per stage, points, median APE (all, interpolated only), max APE, and the verdict."""
        head = f"{'stage':<14}{'points':>7}{'median':>9}{'interp.':>9}{'max':>8}  within {self.target:.0%}"
        lines = [head, "-" * len(head)]
        for s in self.stages():
            rows = [r for r in self.rows if r.stage == s]
            interp = [r.ape for r in rows if r.interpolated]
            mi = f"{statistics.median(interp):9.1%}" if interp else f"{'-':>9}"
            med = self.median_ape(s)
            verdict = "yes" if med <= self.target else "NO"
            lines.append(f"{s:<14}{len(rows):>7}{med:9.1%}{mi}{max(r.ape for r in rows):8.1%}  {verdict}")
        lines.append(f"{'all':<14}{len(self.rows):>7}{self.median_ape():9.1%}")
        return "\n".join(lines)

    def to_csv(self, path: Path) -> None:
        """One row per validation point, with its APE."""
        import csv

        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", newline="", encoding="utf-8") as fh:
            names = [*ValidationRow.__dataclass_fields__, "ape"]
            w = csv.DictWriter(fh, fieldnames=names)
            w.writeheader()
            for r in self.rows:
                d = asdict(r)
                d.update(predicted_ms=f"{r.predicted_ms:.3f}", measured_ms=f"{r.measured_ms:.3f}", ape=f"{r.ape:.4f}")
                w.writerow(d)


def read_validation_csv(path: Path) -> ValidationReport:
    """A report from a CSV written by :meth:`ValidationReport.to_csv` (machine load unknown: empty).

    Raises:
        InvalidInputError: naming the file and line of a malformed row.
    """

    def row(r: dict[str, str]) -> ValidationRow:
        return ValidationRow(
            *config_columns(r),
            r["interpolated"] in ("True", "1", "true"),
            decimal(r, "predicted_ms"),
            decimal(r, "measured_ms"),
            r["quiet"] in ("True", "1", "true"),
        )

    required = (
        "stage",
        "hardware",
        "batch",
        "vcpus",
        "gpu_share",
        "interpolated",
        "predicted_ms",
        "measured_ms",
        "quiet",
    )
    return ValidationReport(tuple(read_rows(path, row, InvalidInputError, required, "a validation CSV")), {})


def repredict(measurements: ValidationReport, profile: LatencyProfile) -> ValidationReport:
    """The same fresh measurements, predicted by another profile: compare profiles on one set of runs.

    ``interpolated`` is recomputed for ``profile`` (whether it measured that batch size).

    Raises:
        MissingProfileError: when ``profile`` does not cover a measured point.
    """
    rows = []
    for r in measurements.rows:
        have = {c.batch for c in profile.measured_configs(r.stage, r.hardware) if c.vcpus == r.vcpus}
        pred = profile.latency_ms(r.stage, Config(r.batch, r.vcpus, r.gpu_share), r.hardware, "mean")
        rows.append(
            ValidationRow(
                r.stage, r.hardware, r.batch, r.vcpus, r.gpu_share, r.batch not in have, pred, r.measured_ms, r.quiet
            )
        )
    return ValidationReport(tuple(rows), dict(measurements.other_cpu), measurements.target)


def validation_points(
    profile: LatencyProfile, stages: Sequence[str], batches: Sequence[int] = VALIDATION_BATCHES
) -> dict[tuple[str, int, float], list[tuple[str, int, bool]]]:
    """Per (hardware, vcpus, share): the ``(stage, batch, interpolated)`` points the profile covers."""
    out: dict[tuple[str, int, float], list[tuple[str, int, bool]]] = {}
    for st in stages:
        for hw in sorted(profile.hardware_types(st)):
            measured = profile.measured_configs(st, hw)
            for v, s in sorted({(c.vcpus, c.gpu_share) for c in measured}):
                have = {c.batch for c in measured if c.vcpus == v and c.gpu_share == s}
                for b in batches:
                    if profile.try_latency_ms(st, Config(b, v, s), hw, "mean") is not None:
                        out.setdefault((hw, v, s), []).append((st, b, b not in have))
    return out


def validate(
    profile: LatencyProfile,
    specs: Sequence[str],
    *,
    batches: Sequence[int] = VALIDATION_BATCHES,
    settings: MeasureSettings | None = None,
    progress: Callable[[str], None] | None = None,
) -> ValidationReport:
    """Measure ``specs``' stages afresh at ``batches`` and compare with ``profile``'s predictions.

    Raises:
        InvalidInputError: when the profile covers none of the stages at these batch sizes.
    """
    from esg_prefect.profiler.targets import targets_of

    names: list[str] = []
    for spec in specs:
        names += [t.name for t in targets_of(spec)]
    plan = validation_points(profile, names, batches)
    if not plan:
        raise InvalidInputError(f"the profile covers none of the stages {names} at batch sizes {list(batches)}")
    s = settings or MeasureSettings()
    rows: list[ValidationRow] = []
    other: dict[str, float | None] = {}
    for (hw, v, share), pts in plan.items():
        device = "cpu" if hw == "cpu" else "cuda:0"
        job = Job(
            "points",
            tuple(specs),
            v,
            share,
            device,
            hw,
            settings=asdict(s),
            args={"points": [(st, b) for st, b, _ in pts]},
        )
        with CpuWatch(children=True) as watch:
            result = run_worker(job, progress)
        other[f"{hw}/{v}vcpu" + ("" if share == 0 else f"/{share:g}")] = watch.other_cores
        for (st, b, interp), d in zip(pts, result["points"], strict=True):
            p = ProfiledPoint.from_dict(d)
            pred = profile.latency_ms(st, Config(b, v, share), hw, "mean")
            rows.append(ValidationRow(st, hw, b, v, share, interp, pred, p.mean_ms, p.quiet))
    return ValidationReport(tuple(rows), other)
