"""What a profile run produces: measured points and per-call samples, and their CSV files.

The profile CSV is a superset of the latency-profile format
(:meth:`esg_prefect.model.LatencyProfile.from_csv` reads its first eight
columns and skips the rest), so the scheduler plans with it directly
(``Pool(profile=LatencyProfile.from_csv(path))``). The extra columns keep what
the profiler knows beyond the planning numbers: the median, peak memory, the
model load time, the repetitions and how quiet the machine was.

The samples CSV holds one row per timed call with the batch's total input
size: what :class:`esg_prefect.model.size_model.SizeModel` is fitted on.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from esg_prefect.model.csv_rows import read_rows
from esg_prefect.model.profile import PROFILE_COLUMNS, PROFILER_COLUMNS
from esg_prefect.model.size_model import SAMPLE_COLUMNS
from esg_prefect.model.size_model import SizeSample as Sample
from esg_prefect.model.size_model import read_samples_csv as read_samples_csv  # re-exported: the samples' reader

__all__ = [
    "EXTRA_FIELDS",
    "ProfiledPoint",
    "Sample",
    "config_label",
    "read_profile_csv",
    "read_samples_csv",
    "write_profile_csv",
    "write_samples_csv",
]

PROFILE_FIELDS = PROFILE_COLUMNS  # what the latency profile reads (model/profile.py)
EXTRA_FIELDS = PROFILER_COLUMNS  # what it skips: the profiler's own columns, written after those
SAMPLE_FIELDS = SAMPLE_COLUMNS  # the reader's columns (model/size_model.py), written in this order


def config_label(hardware: str, vcpus: int, gpu_share: float) -> str:
    """A configuration's name in the run's account: ``cpu/1vcpu``, or ``H100/2vcpu/0.5`` with a GPU share."""
    base = f"{hardware}/{vcpus}vcpu"
    return base if gpu_share == 0.0 else f"{base}/{gpu_share:g}"


@dataclass(frozen=True, slots=True)
class ProfiledPoint:
    """One measured (stage, hardware, batch, vcpus, gpu_share) point.

    ``cold_start_ms`` is the in-process cold start (model build plus the first
    call); :attr:`total_cold_start_ms` adds the start of the worker process.
    ``peak_mem_mb`` is what a worker serving only this stage would hold at most
    (its model's resident memory plus the calls' peak above the level before the
    point, see :mod:`~esg_prefect.profiler.measure`; not the profiling process's
    resident memory); ``model_mem_mb`` the model's part;
    ``gpu_peak_mem_mb`` is ``torch.cuda.max_memory_allocated`` during the
    point (0 on CPU). ``other_cpu`` is the cores other processes used meanwhile.
    """

    stage: str
    hardware: str
    batch: int
    vcpus: int
    gpu_share: float
    mean_ms: float
    p50_ms: float
    p95_ms: float
    cold_start_ms: float
    load_ms: float
    peak_mem_mb: float
    gpu_peak_mem_mb: float = 0.0
    model_mem_mb: float = 0.0
    worker_start_ms: float = 0.0
    reps: int = 1
    attempts: int = 1
    other_cpu: float = 0.0
    quiet: bool = True
    mean_input_size: float = 0.0
    pipeline: str = ""

    @property
    def config_label(self) -> str:
        """The point's configuration as the run names it: ``cpu/1vcpu`` or ``H100/2vcpu/0.5``."""
        return config_label(self.hardware, self.vcpus, self.gpu_share)

    @property
    def total_cold_start_ms(self) -> float:
        """Worker start plus model build plus first call: what a cold worker costs."""
        return self.cold_start_ms + self.worker_start_ms

    def to_dict(self) -> dict[str, Any]:
        """The point as a JSON-able dict (for the worker's reply and the store)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProfiledPoint:
        """The inverse of :meth:`to_dict`."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def write_profile_csv(points: Sequence[ProfiledPoint], out: Path) -> None:
    """Write ``points`` as a latency-profile CSV with the profiler's extra columns."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=(*PROFILE_FIELDS, *EXTRA_FIELDS))
        writer.writeheader()
        for p in points:
            writer.writerow(
                {
                    "stage": p.stage,
                    "hardware": p.hardware,
                    "batch": p.batch,
                    "vcpus": p.vcpus,
                    "gpu_share": f"{p.gpu_share:g}",
                    "mean_ms": f"{p.mean_ms:.3f}",
                    "p95_ms": f"{p.p95_ms:.3f}",
                    "cold_start_ms": f"{p.total_cold_start_ms:.3f}",
                    "p50_ms": f"{p.p50_ms:.3f}",
                    "peak_mem_mb": f"{p.peak_mem_mb:.1f}",
                    "model_mem_mb": f"{p.model_mem_mb:.1f}",
                    "gpu_peak_mem_mb": f"{p.gpu_peak_mem_mb:.1f}",
                    "load_ms": f"{p.load_ms:.3f}",
                    "worker_start_ms": f"{p.worker_start_ms:.1f}",
                    "reps": p.reps,
                    "attempts": p.attempts,
                    "other_cpu": f"{p.other_cpu:.3f}",
                    "quiet": int(p.quiet),
                    "mean_input_size": f"{p.mean_input_size:.2f}",
                    "pipeline": p.pipeline,
                }
            )


def read_profile_csv(path: Path) -> list[ProfiledPoint]:
    """Points of a CSV written by :func:`write_profile_csv` (a plain profile CSV reads with defaults).

    Raises:
        ProfileError: naming the file and line of a malformed row.
    """

    def point(r: dict[str, str]) -> ProfiledPoint:
        worker = float(r.get("worker_start_ms") or 0.0)
        mean = float(r["mean_ms"])
        return ProfiledPoint(
            stage=r["stage"],
            hardware=r["hardware"],
            batch=int(r["batch"]),
            vcpus=int(r["vcpus"]),
            gpu_share=float(r["gpu_share"]),
            mean_ms=mean,
            p50_ms=float(r.get("p50_ms") or mean),
            p95_ms=float(r.get("p95_ms") or mean),
            cold_start_ms=float(r.get("cold_start_ms") or 0.0) - worker,
            load_ms=float(r.get("load_ms") or 0.0),
            peak_mem_mb=float(r.get("peak_mem_mb") or 0.0),
            model_mem_mb=float(r.get("model_mem_mb") or 0.0),
            gpu_peak_mem_mb=float(r.get("gpu_peak_mem_mb") or 0.0),
            worker_start_ms=worker,
            reps=int(r.get("reps") or 0),
            attempts=int(r.get("attempts") or 1),
            other_cpu=float(r.get("other_cpu") or 0.0),
            quiet=(r.get("quiet") or "1") not in ("0", "False", "false"),
            mean_input_size=float(r.get("mean_input_size") or 0.0),
            pipeline=r.get("pipeline") or "",
        )

    return read_rows(path, point, required=PROFILE_COLUMNS[:6], kind="a latency profile CSV")


def write_samples_csv(samples: Sequence[Sample], out: Path) -> None:
    """Write one row per timed call (the size model's training data)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(SAMPLE_FIELDS)
        for s in samples:
            writer.writerow(
                [s.stage, s.hardware, s.batch, s.vcpus, f"{s.gpu_share:g}", f"{s.total_size:g}", f"{s.latency_ms:.3f}"]
            )
