"""Measure the CPU latency profile of every example stage and write it as a latency-profile CSV.

Usage::

    python -m esg_prefect.examples.measure --out esg_prefect/data/profiles/examples_cpu.csv
    python -m esg_prefect.examples.measure --quick --out /tmp/quick.csv   # 1 repetition, batches 1 and 2

A thin wrapper over the profiler (:mod:`esg_prefect.profiler`, also
``esg-prefect profile``), kept for the shipped file's format: the eight
latency-profile columns only. Method (see :mod:`esg_prefect.profiler.measure`
and :mod:`esg_prefect.profiler.run`): each thread count runs in a fresh worker
process (threads set before any torch work); in it each pipeline runs once
stage by stage on seeded requests, each stage's model is built as it is reached
and its cold start timed (build plus first call on one real job); then every
stage and batch size gets warm-up calls and timed calls on the stage's real
jobs, round robin, timed again when other processes disturbed them.

The ``cold_start_ms`` column adds the start of a worker process as the pool starts
one (a fork of the pool's pre-imported fork server; a fresh interpreter importing
torch and the examples where there is no fork server; the median of three
launches) to the in-process build and first call: the cost of a cold start.

The CSV is checked by loading it back with :meth:`esg_prefect.model.LatencyProfile.from_csv`.
The summary printed at the end gives the per-item speedup of batch 8 over batch 1
(``8 * mean(1) / mean(8)``).
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from esg_prefect.profiler.machine import (
    allowed_other_cpu,
    is_quiet,
    repetitions,
    wait_for_quiet,
    worker_start_ms,
)

if TYPE_CHECKING:
    from esg_prefect.profiler.measure import MeasureSettings
    from esg_prefect.profiler.results import ProfiledPoint

BATCHES: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
THREADS: tuple[int, ...] = (1, 2)
QUICK_BATCHES: tuple[int, ...] = (1, 2)
__all__ = [
    "BATCHES",
    "FIELDS",
    "QUICK_BATCHES",
    "THREADS",
    "Row",
    "allowed_other_cpu",
    "is_quiet",
    "main",
    "measure_pipeline",
    "read_csv_rows",
    "repetitions",
    "summary",
    "wait_for_quiet",
    "worker_start_ms",
    "write_csv",
]
FIELDS = ("stage", "hardware", "batch", "vcpus", "gpu_share", "mean_ms", "p95_ms", "cold_start_ms")


@dataclass(frozen=True, slots=True)
class Row:
    """One measured (stage, batch, threads) point; ``cold_start_ms`` is in-process here (no worker start)."""

    stage: str
    batch: int
    vcpus: int
    mean_ms: float
    p95_ms: float
    cold_start_ms: float
    reps: int
    other_cpu: float = 0.0
    attempts: int = 1
    quiet: bool = True


def measure_pipeline(
    name: str,
    *,
    vcpus: int,
    batches: Sequence[int] = BATCHES,
    pool: int = 32,
    warmup: int = 2,
    min_reps: int = 7,
    max_reps: int = 15,
    budget_s: float = 2.0,
    max_attempts: int = 4,
    max_other_cpu: float = 0.15,
    seed: int = 0,
) -> list[Row]:
    """Measure every stage of pipeline ``name`` in this process with its current torch thread settings.

    A thin wrapper over the profiler (:func:`esg_prefect.profiler.targets.prepare` and
    :func:`esg_prefect.profiler.measure.measure_point`); the arguments are those of
    :class:`~esg_prefect.profiler.measure.MeasureSettings`. ``vcpus`` is the thread count
    to record (the caller has set it in torch).
    """
    from esg_prefect.profiler.measure import MeasureSettings, measure_point
    from esg_prefect.profiler.targets import prepare

    settings = MeasureSettings(
        tuple(batches), pool, warmup, min_reps, max_reps, budget_s, max_attempts, max_other_cpu, seed
    )
    rows = []
    for stage in prepare([f"examples:{name}"], pool=pool, seed=seed):
        for b in batches:
            p, _ = measure_point(stage, b, vcpus=vcpus, settings=settings)
            rows.append(_row(p))
    return rows


def _row(p: ProfiledPoint) -> Row:
    return Row(
        stage=p.stage,
        batch=p.batch,
        vcpus=p.vcpus,
        mean_ms=p.mean_ms,
        p95_ms=p.p95_ms,
        cold_start_ms=p.cold_start_ms,
        reps=p.reps,
        other_cpu=p.other_cpu,
        attempts=p.attempts,
        quiet=p.quiet,
    )


def _settings(quick: bool) -> MeasureSettings:
    from esg_prefect.profiler.measure import MeasureSettings

    return MeasureSettings.quick(QUICK_BATCHES) if quick else MeasureSettings(BATCHES)


def write_csv(rows: Sequence[Row], start_ms: dict[int, float], out: Path) -> None:
    """Write ``rows`` in the latency-profile CSV format, adding the worker start to each cold start."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=FIELDS)
        writer.writeheader()
        for r in rows:
            writer.writerow(
                {
                    "stage": r.stage,
                    "hardware": "cpu",
                    "batch": r.batch,
                    "vcpus": r.vcpus,
                    "gpu_share": 0,
                    "mean_ms": f"{r.mean_ms:.3f}",
                    "p95_ms": f"{r.p95_ms:.3f}",
                    "cold_start_ms": f"{r.cold_start_ms + start_ms.get(r.vcpus, 0.0):.1f}",
                }
            )


def read_csv_rows(path: Path) -> list[Row]:
    """Rows of a CSV written by :func:`write_csv` (cold starts as written: worker start included; reps unknown, 0)."""
    with open(path, newline="", encoding="utf-8") as fh:
        return [
            Row(
                stage=r["stage"],
                batch=int(r["batch"]),
                vcpus=int(r["vcpus"]),
                mean_ms=float(r["mean_ms"]),
                p95_ms=float(r["p95_ms"]),
                cold_start_ms=float(r["cold_start_ms"]),
                reps=0,
            )
            for r in csv.DictReader(fh)
        ]


def summary(rows: Sequence[Row]) -> str:
    """A text table: per stage and threads, batch 1 and 8 means, per-item speedup at 8, batch 32, cold start."""
    by = {(r.stage, r.vcpus, r.batch): r for r in rows}
    stages = list(dict.fromkeys(r.stage for r in rows))
    threads = sorted({r.vcpus for r in rows})
    head = f"{'stage':<14}{'thr':>4}{'b1 mean':>10}{'b1 p95':>10}{'b8 mean':>10}{'b8 p95':>10}{'x/item@8':>10}"
    head += f"{'b32 mean':>10}{'cold(in-proc)':>15}"
    lines = [head, "-" * len(head)]
    for s in stages:
        for t in threads:
            b1, b8, b32 = by.get((s, t, 1)), by.get((s, t, 8)), by.get((s, t, 32))
            if b1 is None:
                continue

            def f(r: Row | None, attr: str) -> str:
                return f"{getattr(r, attr):10.2f}" if r is not None else f"{'-':>10}"

            speed = f"{8 * b1.mean_ms / b8.mean_ms:10.2f}" if b8 is not None else f"{'-':>10}"
            lines.append(
                f"{s:<14}{t:>4}{f(b1, 'mean_ms')}{f(b1, 'p95_ms')}{f(b8, 'mean_ms')}{f(b8, 'p95_ms')}{speed}"
                f"{f(b32, 'mean_ms')}{b1.cold_start_ms:15.1f}"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure in one worker process per thread count, write and verify the CSV, print a summary."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=Path("esg_prefect/data/profiles/examples_cpu.csv"))
    parser.add_argument("--quick", action="store_true", help="1 repetition, batches 1 and 2 (for tests)")
    parser.add_argument("--threads", type=int, nargs="+", default=list(THREADS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--max-wait-s", type=float, default=120.0, help="wait up to this long for other processes to quiet down"
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the rows of the existing --out file for thread counts not measured now",
    )
    args = parser.parse_args(argv)

    import torch

    from esg_prefect.model import LatencyProfile

    t_start = time.perf_counter()
    load = os.getloadavg()[0]
    print(f"python {platform.python_version()}, torch {torch.__version__}, {os.cpu_count()} CPUs, load {load:.2f}")
    if load > 0.5:
        print(f"warning: load average {load:.2f} before measuring: other processes will add noise", file=sys.stderr)
    from esg_prefect.profiler.run import ProfileRequest, run_profile

    request = ProfileRequest(
        specs=("examples",),
        vcpus=tuple(args.threads),
        gpu_shares=(),
        settings=replace(_settings(args.quick), seed=args.seed),
        wait_quiet_s=0.0 if args.quick else args.max_wait_s,
        worker_start_launches=1 if args.quick else 3,
    )
    run = run_profile(request, lambda done, total, label: None)
    rows = [_row(p) for p in run.points]
    start_ms = dict(run.worker_start_ms)
    for label, other in run.other_cpu.items():
        if other is not None:
            print(f"{label}: other processes used {other:.0%} of a core")
    measured = list(rows)
    if args.merge and args.out.exists():
        rows += [r for r in read_csv_rows(args.out) if r.vcpus not in args.threads]
    order = {s: i for i, s in enumerate(dict.fromkeys(r.stage for r in measured))}
    rows.sort(key=lambda r: (order.get(r.stage, len(order)), r.stage, r.vcpus, r.batch))
    write_csv(rows, start_ms, args.out)
    profile = LatencyProfile.from_csv(args.out)  # the check that the file is a valid profile
    print(summary(rows))
    print(f"worker start (as the pool starts one), ms: {', '.join(f'{t} thr {ms:.0f}' for t, ms in start_ms.items())}")
    print(f"repetitions per point: {min(r.reps for r in measured)}..{max(r.reps for r in measured)}")
    noisy = [r for r in measured if not r.quiet]
    print(
        f"points timed again for interference: {sum(r.attempts > 1 for r in measured)}; "
        f"still noisy after {max(r.attempts for r in measured)} attempts: "
        + (", ".join(f"{r.stage}/b{r.batch}/t{r.vcpus} ({r.other_cpu:.2f} cores)" for r in noisy) or "none")
    )
    print(f"wrote {args.out}: {len(profile.points)} points, {len(profile.stages())} stages")
    print(f"load average at end {os.getloadavg()[0]:.2f}; wall time {time.perf_counter() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
