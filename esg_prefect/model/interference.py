"""Co-run interference: the measured co-run table, and the slowdown model built on it.

PALDIA's hybrid spatio-temporal sharing (ESG-SPEC section 7) weighs co-running
a batch beside busy tenants now, at an interference slowdown, against waiting
for them to finish. This module is the domain side of that: the co-run table
the profiler measures (:mod:`esg_prefect.profiler.interference` measures it and
re-exports these types), and :class:`CoRunModel`, which answers
``slowdown(stage, hardware, co_runners)`` for the scheduler and the simulator
alike. Pure: no torch, no clock (``tests/test_layering.py``).

CSV (one row per stage, hardware, configuration and co-runner count)::

    stage,hardware,batch,vcpus,gpu_share,co_runners,alone_ms,corun_ms,slowdown
    detect,cpu,4,1,0,1,33.1,39.8,1.202

Design choices of :class:`CoRunModel` (each with its reason):

* **Measured rows first.** Where the table has the (stage, hardware), its
  interpolation is used (:meth:`InterferenceTable.slowdown`): a measurement
  beats any model.
* **Same hardware, other stages.** Where the stage has no row but the hardware
  has rows for other stages, the mean measured slope per co-runner of that
  hardware is used: tenants of one device contend for the same memory system,
  and the shipped CPU table (``data/profiles/profiler_examples_cpu_corun.csv``,
  12 stages at one co-runner) spreads only from 1.42 to 2.49.
* **GPUs without any row: a linear default,** ``1 + GPU_SLOWDOWN_PER_CORUNNER
  * co_runners`` with ``GPU_SLOWDOWN_PER_CORUNNER = 0.15``. The project has no
  GPU co-run measurement (its development machine has no GPU), so the slope is
  taken from published MPS measurements of co-located inference, and stated as
  an assumption: about +7.5 % throughput loss and +19.5 % per-token latency for
  two vLLM processes sharing an A100 under MPS (Pebble, "NVIDIA MPS vs dedicated
  GPU allocation for LLM inference", 2025 case study), and "around 30 %" worse
  performance for MPS co-execution under memory contention, best cases 30 %
  better (Villarrubia, Costero, Igual, Olcoz, "A comprehensive evaluation of
  spatial co-execution on GPUs using MPS and MIG technologies", arXiv
  2604.22430, 2026). 0.15 per co-runner sits in the middle of 7.5-30 % for one
  co-runner; linear growth per tenant is the same form as the simulator's
  historical ``interference_per_corunner`` (5 %, an unsourced assumption kept
  for the standard case so that its results stay as published).
* **No co-runner, no slowdown**: ``slowdown(..., 0) == 1.0`` always.

Example:
    >>> m = CoRunModel()
    >>> m.slowdown("resnet50", "T4", 0), m.slowdown("resnet50", "T4", 2)
    (1.0, 1.3)
"""

from __future__ import annotations

import bisect
import csv
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from esg_prefect.exceptions import ProfileError
from esg_prefect.model.csv_rows import config_columns, decimal, integer, read_rows
from esg_prefect.model.profile_source import PROFILE_DIR

__all__ = [
    "DEFAULT_CORUN_TABLE",
    "FIELDS",
    "GPU_SLOWDOWN_PER_CORUNNER",
    "CoRunModel",
    "CoRunRow",
    "InterferenceTable",
]

DEFAULT_CORUN_TABLE = PROFILE_DIR / "profiler_examples_cpu_corun.csv"
"""The shipped measured co-run table (CPU, the example stages; see its profile's README)."""

GPU_SLOWDOWN_PER_CORUNNER = 0.15
"""Slowdown per busy co-runner on a GPU without a measured row (module docstring: sources)."""

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

    def has(self, stage: str, hardware: str) -> bool:
        """Whether a co-run of ``stage`` on ``hardware`` was measured."""
        return bool(self._by.get((stage, hardware)))

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
                        f"{r.alone_ms:.6g}",  # significant digits: sub-ms stages keep their ratio
                        f"{r.corun_ms:.6g}",
                        f"{r.slowdown:.4f}",
                    ]
                )

    @classmethod
    def from_csv(cls, path: str | Path) -> InterferenceTable:
        """Load a table written by :meth:`to_csv`.

        Raises:
            ProfileError: naming the file, line and problem.
        """

        def row(r: dict[str, str]) -> CoRunRow:
            return CoRunRow(
                *config_columns(r),
                integer(r, "co_runners"),
                decimal(r, "alone_ms"),
                decimal(r, "corun_ms"),
            )

        return cls(read_rows(path, row, required=FIELDS[:-1]))


class CoRunModel:
    """``slowdown(stage, hardware, co_runners)`` from a measured table, with documented defaults.

    Args:
        table: measured co-runs (None: none measured).
        gpu_per_corunner: slope of the GPU default (module docstring).

    Raises:
        ProfileError: on a negative or non-finite slope.

    Example:
        >>> t = InterferenceTable([CoRunRow("det", "cpu", 4, 1, 0.0, 1, 10.0, 15.0)])
        >>> m = CoRunModel(t)
        >>> m.slowdown("det", "cpu", 1), m.slowdown("other", "cpu", 2), m.slowdown("x", "A100", 1)
        (1.5, 2.0, 1.15)
    """

    def __init__(self, table: InterferenceTable | None = None, gpu_per_corunner: float = GPU_SLOWDOWN_PER_CORUNNER):
        if not (math.isfinite(gpu_per_corunner) and gpu_per_corunner >= 0):
            raise ProfileError(f"gpu_per_corunner must be a finite number >= 0, got {gpu_per_corunner!r}")
        self.table = table if table is not None else InterferenceTable(())
        self.gpu_per_corunner = float(gpu_per_corunner)
        slopes: dict[str, list[float]] = {}
        for r in self.table.rows:
            if r.co_runners > 0:
                slopes.setdefault(r.hardware, []).append((r.slowdown - 1.0) / r.co_runners)
        self._slope = {hw: max(0.0, statistics.fmean(v)) for hw, v in slopes.items()}
        self._memo: dict[tuple[str, str, int], float] = {}

    @classmethod
    def load(cls, source: str | Path | None = "default") -> CoRunModel:
        """The model of a co-run CSV; ``"default"`` is the shipped CPU table, None no table at all.

        Raises:
            ProfileError: naming the file when it is missing or malformed.
        """
        if source is None:
            return cls()
        path = DEFAULT_CORUN_TABLE if source == "default" else Path(source)
        if not path.exists():
            raise ProfileError(f"co-run table {str(source)!r} not found (give a CSV path or 'default')")
        return cls(InterferenceTable.from_csv(path))

    def slowdown(self, stage: str, hardware: str, co_runners: int) -> float:
        """Factor on a batch's latency with ``co_runners`` busy tenants beside it (module docstring).

        Raises:
            ProfileError: on a negative count.
        """
        key = (stage, hardware, co_runners)
        got = self._memo.get(key)
        if got is not None:
            return got
        if co_runners < 0:
            raise ProfileError(f"co_runners must be >= 0, got {co_runners}")
        if co_runners == 0:
            value = 1.0
        elif stage in self.table.stages() and self.table.has(stage, hardware):
            value = self.table.slowdown(stage, hardware, co_runners)
        elif hardware in self._slope:
            value = 1.0 + self._slope[hardware] * co_runners
        else:
            value = 1.0 + self.gpu_per_corunner * co_runners
        self._memo[key] = value
        return value
