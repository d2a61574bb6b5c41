"""Co-run interference: how much slower a stage runs beside tenants at the same share.

PALDIA's hybrid sharing (ESG-SPEC section 7) needs to know what co-running
costs: a batch either co-runs on a device now, paying a slowdown from a
*measured co-run table*, or waits. This module measures that table and loads it.

Method: ``k`` copies of the profiler's worker run the same stages at the same
configuration (batch, vcpus, GPU share) in separate processes. Each copy builds
its models, reports ready, and all start at one wall-clock time; every stage
gets a common slot in which each copy calls it back to back. The slowdown of
``co_runners = k - 1`` is the mean call time of the ``k`` copies over the mean
of one copy alone (``k = 1``), measured the same way. On a CPU, ``k`` copies
of ``vcpus`` threads want ``k * vcpus`` cores: beyond the machine's cores the
table measures time-slicing, and the run says so.

CSV (one row per stage, hardware, configuration and co-runner count)::

    stage,hardware,batch,vcpus,gpu_share,co_runners,alone_ms,corun_ms,slowdown
    detect,cpu,4,1,0,1,33.1,39.8,1.202
"""

from __future__ import annotations

import bisect
import csv
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from esg_prefect.exceptions import ProfileError

FIELDS = ("stage", "hardware", "batch", "vcpus", "gpu_share", "co_runners", "alone_ms", "corun_ms", "slowdown")


@dataclass(frozen=True, slots=True)
class CoRunRow:
    """One measured co-run: ``co_runners`` other tenants beside the stage at the same configuration."""

    stage: str
    hardware: str
    batch: int
    vcpus: int
    gpu_share: float
    co_runners: int
    alone_ms: float
    corun_ms: float

    def __post_init__(self) -> None:
        if self.co_runners < 0:
            raise ProfileError(f"co_runners must be >= 0, got {self.co_runners}")
        for name in ("alone_ms", "corun_ms"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ProfileError(f"{name} must be a finite number > 0, got {v!r}")

    @property
    def slowdown(self) -> float:
        """``corun_ms / alone_ms``."""
        return self.corun_ms / self.alone_ms


class InterferenceTable:
    """The measured co-run slowdowns, for the scheduler (no torch, no clock: a plain table).

    Args:
        rows: measured co-runs.

    Example:
        >>> t = InterferenceTable([CoRunRow("det", "cpu", 4, 1, 0.0, 1, 10.0, 12.0)])
        >>> t.slowdown("det", "cpu", 0), t.slowdown("det", "cpu", 1)
        (1.0, 1.2)
    """

    def __init__(self, rows: Iterable[CoRunRow]) -> None:
        self.rows = tuple(rows)
        self._by: dict[tuple[str, str], dict[int, list[float]]] = {}
        for r in self.rows:
            self._by.setdefault((r.stage, r.hardware), {}).setdefault(r.co_runners, []).append(r.slowdown)

    def stages(self) -> frozenset[str]:
        """Stages with a measured co-run."""
        return frozenset(s for s, _ in self._by)

    def slowdown(self, stage: str, hardware: str, co_runners: int) -> float:
        """Slowdown factor with ``co_runners`` tenants beside ``stage`` on ``hardware``.

        Zero co-runners is 1.0. Between measured counts it interpolates linearly;
        beyond the largest measured count it extrapolates linearly from the last two
        points (or from 1.0 at zero), since each tenant adds about the same contention
        until the device saturates. Several configurations of one count are averaged.

        Raises:
            ProfileError: a negative count, or no co-run measured for the stage on that hardware.
        """
        if co_runners < 0:
            raise ProfileError(f"co_runners must be >= 0, got {co_runners}")
        if co_runners == 0:
            return 1.0
        by = self._by.get((stage, hardware))
        if not by:
            raise ProfileError(
                f"no co-run measured for stage {stage!r} on {hardware!r}; stages: {sorted(self.stages())}"
            )
        known = {0: 1.0, **{k: statistics.fmean(v) for k, v in by.items()}}
        ks = sorted(known)
        if co_runners in known:
            return known[co_runners]
        i = bisect.bisect_left(ks, co_runners)
        k0, k1 = (ks[i - 1], ks[i]) if i < len(ks) else (ks[-2], ks[-1])
        y0, y1 = known[k0], known[k1]
        return max(1.0, y0 + (y1 - y0) * (co_runners - k0) / (k1 - k0))

    def to_csv(self, path: Path) -> None:
        """Write the table as CSV (see the module docstring)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(FIELDS)
            for r in self.rows:
                w.writerow(
                    [
                        r.stage,
                        r.hardware,
                        r.batch,
                        r.vcpus,
                        f"{r.gpu_share:g}",
                        r.co_runners,
                        f"{r.alone_ms:.3f}",
                        f"{r.corun_ms:.3f}",
                        f"{r.slowdown:.4f}",
                    ]
                )

    @classmethod
    def from_csv(cls, path: str | Path) -> InterferenceTable:
        """Load a table written by :meth:`to_csv`.

        Raises:
            ProfileError: naming the file, line and problem.
        """
        rows = []
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            missing = set(FIELDS[:-1]) - set(reader.fieldnames or ())
            if missing:
                raise ProfileError(f"{path}: missing columns {sorted(missing)}")
            for lineno, r in enumerate(reader, start=2):
                try:
                    rows.append(
                        CoRunRow(
                            r["stage"],
                            r["hardware"],
                            int(r["batch"]),
                            int(r["vcpus"]),
                            float(r["gpu_share"]),
                            int(r["co_runners"]),
                            float(r["alone_ms"]),
                            float(r["corun_ms"]),
                        )
                    )
                except ValueError as exc:
                    raise ProfileError(f"{path} line {lineno}: {exc}") from exc
        return cls(rows)


@dataclass(frozen=True, slots=True)
class CoRunMeasurement:
    """The table rows of one measurement and the other processes' CPU use during it (cores)."""

    rows: tuple[CoRunRow, ...]
    other_cores: dict[int, float | None]
    oversubscribed: bool


def _run_copies(
    k: int,
    job_for: Callable[[], object],
    progress: Callable[[str], None] | None,
) -> list[dict[str, list[float]]]:
    from esg_prefect.profiler.worker import READY, Job, ProfilerWorkerError, finish_worker, start_worker

    with tempfile.TemporaryDirectory(prefix="esg-corun-") as tmp:
        procs = []
        for i in range(k):
            job = job_for()
            assert isinstance(job, Job)
            out = Path(tmp) / f"copy{i}.json"
            procs.append((start_worker(job, out), out))
        for proc, _ in procs:  # wait until every copy has built its models
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.strip() == READY:
                    break
            else:
                raise ProfilerWorkerError(f"co-run copy exited with code {proc.wait()} before it was ready")
        start = time.time() + 0.5
        for proc, _ in procs:
            assert proc.stdin is not None
            proc.stdin.write(f"{start}\n")
            proc.stdin.close()
        return [finish_worker(proc, out, progress)["times"] for proc, out in procs]


def measure_interference(
    specs: Sequence[str],
    *,
    batch: int = 4,
    vcpus: int = 1,
    gpu_share: float = 0.0,
    device: str = "cpu",
    hardware: str = "cpu",
    co_runners: Sequence[int] = (1,),
    slot_s: float = 2.0,
    pool: int = 8,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> CoRunMeasurement:
    """Measure the co-run table of every stage of ``specs`` at one configuration (see the module docstring).

    Raises:
        ProfileError: on a co-runner count below 1 or a slot shorter than 0.05 s.
    """
    from esg_prefect.profiler.machine import CpuWatch
    from esg_prefect.profiler.worker import Job

    if not co_runners or min(co_runners) < 1:
        raise ProfileError(f"co_runners must be counts >= 1, got {list(co_runners)}")
    if slot_s < 0.05:
        raise ProfileError(f"slot_s must be >= 0.05 s, got {slot_s}")

    def job() -> Job:
        return Job(
            "corun",
            tuple(specs),
            vcpus,
            gpu_share,
            device,
            hardware,
            settings={"pool": pool, "seed": seed},
            args={"batch": batch, "slot_s": slot_s},
        )

    means: dict[int, dict[str, float]] = {}
    other: dict[int, float | None] = {}
    for k in [1, *sorted({c + 1 for c in co_runners})]:
        with CpuWatch(children=True) as watch:
            copies = _run_copies(k, job, progress)
        # our own k copies are children: what is left is the rest of the machine, in cores
        other[k] = watch.other_cores
        means[k] = {name: statistics.fmean(t for c in copies for t in c[name]) for name in copies[0]}
        if progress is not None:
            progress(f"co-run x{k}: done")
    rows = []
    for k, by_stage in means.items():
        if k == 1:
            continue
        for name, ms in by_stage.items():
            rows.append(CoRunRow(name, hardware, batch, vcpus, gpu_share, k - 1, means[1][name], ms))
    over = device == "cpu" and (1 + max(co_runners)) * vcpus > (os.cpu_count() or 1)
    return CoRunMeasurement(tuple(rows), other, over)
