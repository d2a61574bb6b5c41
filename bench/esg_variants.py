"""ESG's settings variants on the whole-bill cells over extra seeds: the harness behind the decision notes.

A single run of the bursty code trace swings by 10-20 % from one seed to the
next, so a change to ESG is judged here on several seeds per cell, never on the
grid's one (docs/decisions/whole-bill.md). Each variant is a set of ESG
settings (``--variant 'k=v,k=v'``, repeat; the first is the reference, by
default ESG's defaults); each runs ESG alone on every cell of
``bench/whole_bill.py``'s grid but the standard case's seeds 1 and 2 (the
standard case runs at seed 0 only: its three seeds are one trace), at each
cell's seed plus each of ``--seeds`` (default 10, 11, 12: the grid's own seed
is left out, so a change is not tuned on the runs that report it). Runs are
``whole_bill.py``'s (30 s, 10 s warm-up, the bill over the window after it).

Per cell and variant it prints the geometric mean of the whole bill per
request over the seeds, its change against the reference, the mean SLO hit
rate and its change in points, the lowest hit rate of a seed, the p99 misses
(workflow-seeds over the SLO), the mean number of workers started, and, seed by
seed against the reference, on how many seeds it is cheaper and its largest fall
of the SLO hit rate on one seed (a rule that collapses one run and helps the
others reads as a small loss in the means), then

  RESULT variant=<label of the last variant> cells_cheaper=<n>/<cells> whole_change_median=<x> slo_points_min=<y>
    slo_points_worst_seed=<z>

comparing the last variant with the reference: how many cells it made cheaper,
the median change of the whole bill, its worst change of a cell's mean SLO hit
rate, and its worst fall on one seed of one cell.

  python bench/esg_variants.py --variant consolidate_slack=0          # against the defaults
  python bench/esg_variants.py --seeds 13,14,15 --only conv-mid,code-near --variant max_batch_wait_ms=30
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import typer

from esg_prefect.cli.args import parse_settings, setting_pairs
from esg_prefect.scheduling import ESGSettings

sys.path.insert(0, str(Path(__file__).resolve().parent))

import whole_bill as wb  # the bench next to this one

Setting = tuple[tuple[str, Any], ...]


def parse_variant(text: str) -> Setting:
    """``'k=v,k=v'`` as a setting, read and checked as ``--set`` pairs are; '' is the defaults."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        parse_settings(ESGSettings(), parts)  # refuses unknown keys and bad values, naming them
        return tuple(setting_pairs(parts))
    except typer.BadParameter as exc:
        raise SystemExit(f"esg_variants: --variant {text!r}: {exc.message}") from None


def label(setting: Setting) -> str:
    """A variant's name in the tables."""
    return ",".join(f"{k}={v}" for k, v in setting) or "defaults"


def cells(only: Sequence[str], seeds: Sequence[int]) -> list[wb.Cell]:
    """The grid's cells (standard at seed 0 only), each at its seed plus each of ``seeds``."""
    base = [c for c in wb.grid_cells() if not c.name.startswith("standard-s") or c.name == "standard-s0"]
    if only:
        unknown = sorted(set(only) - {short(c) for c in base})
        if unknown:
            raise SystemExit(f"esg_variants: no cell {unknown[0]!r}; cells: {', '.join(short(c) for c in base)}")
        base = [c for c in base if short(c) in only]
    return [replace(c, seed=c.seed + s) for c in base for s in seeds]


def short(cell: wb.Cell) -> str:
    """A cell's name without its seed: ``standard``, ``code-low``, ..."""
    return wb.cell_type(cell.name)


def summarise(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """One cell's runs of one variant: geometric mean of the whole bill, SLO means, p99 misses, workers.

    A seed whose window holds no request (the code trace's low rate has one at seed + 10) has no bill
    per request or hit rate: it is left out, and ``seeds`` says how many were counted.
    """
    counted = [r for r in rows if r["requests"] > 0]
    if not counted:
        nan = math.nan
        return {"whole": nan, "slo": nan, "slo_min": nan, "p99_misses": 0.0, "workers": nan, "seeds": 0.0}
    return {
        "whole": math.exp(statistics.fmean(math.log(max(r["whole"], 1e-15)) for r in counted)),
        "slo": statistics.fmean(r["slo_hit_rate"] for r in counted),
        "slo_min": min(r["slo_hit_rate"] for r in counted),
        "p99_misses": float(sum(1 for r in counted for p99, slo in r["p99"].values() if p99 > slo)),
        "workers": statistics.fmean(r["workers"] for r in counted),
        "seeds": float(len(counted)),
    }


def paired(ref: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """A variant's runs against the reference's, seed by seed (the same seeds, in the same order).

    ``cheaper``: seeds where the variant's whole bill per request is lower; ``worst_points``: the largest
    fall of the SLO hit rate on one seed, in points (0 when none fell). The means hide what a rule does to
    one seed: a change that collapses one run in three and helps the other two reads as a small loss.
    Seeds where either run has no request are left out; ``seeds`` counts the rest.
    """
    pairs = [(a, b) for a, b in zip(ref, rows, strict=True) if a["requests"] > 0 and b["requests"] > 0]
    return {
        "cheaper": float(sum(1 for a, b in pairs if b["whole"] < a["whole"])),
        "worst_points": min([0.0, *((b["slo_hit_rate"] - a["slo_hit_rate"]) * 100.0 for a, b in pairs)]),
        "seeds": float(len(pairs)),
    }


def main(argv: Sequence[str] | None = None) -> None:
    """Run every variant on every cell and seed; print the table and the RESULT line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--variant", action="append", default=None, help="ESG settings 'k=v,k=v' (repeat)")
    parser.add_argument("--seeds", default="10,11,12", help="added to each cell's seed (default 10,11,12)")
    parser.add_argument("--only", default="", help="cells without their seed, e.g. conv-mid,code-near")
    parser.add_argument(
        "--duration", type=float, default=None, help="run length of every cell, s (default: each cell's own)"
    )
    parser.add_argument("--warmup", type=float, default=wb.WARMUP_S, help="warm-up left out, s")
    parser.add_argument("--processes", type=int, default=0, help="worker processes (0: one per CPU; 1: this one)")
    args = parser.parse_args(argv)
    texts = args.variant or [""]
    if len(texts) == 1 and texts[0]:
        texts = ["", *texts]  # one variant: against the defaults
    variants = [parse_variant(t) for t in texts]
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        raise SystemExit(f"esg_variants: --seeds wants integers, got {args.seeds!r}") from None
    if not seeds or args.warmup < 0 or (args.duration is not None and not 0 <= args.warmup < args.duration):
        raise SystemExit("esg_variants: give at least one seed, a duration > 0 and 0 <= warm-up < duration")
    grid = cells([c for c in args.only.split(",") if c], seeds)
    length = {c: wb.cell_duration(c, args.warmup) if args.duration is None else args.duration for c in grid}
    jobs = [wb.Job(c, wb.ESG, v, length[c], args.warmup) for c in grid for v in variants]
    processes = args.processes or max(1, len(os.sched_getaffinity(0)))
    t0 = time.perf_counter()
    rows = wb.run_jobs(jobs, processes)
    by: dict[tuple[str, Setting], list[dict[str, Any]]] = {}
    for job, row in zip(jobs, rows, strict=True):
        by.setdefault((short(job.cell), job.setting), []).append(row)
    names = list(dict.fromkeys(short(c) for c in grid))
    runs = "each cell's own run length" if args.duration is None else f"{args.duration:g} s runs"
    print(f"ESG over seeds +{','.join(map(str, seeds))} per cell ({runs}, {args.warmup:g} s warm-up)")
    print()
    head = ("cell", "variant", "seeds", "whole $/req (geo. mean)", "change", "SLO hit", "change, points", "lowest",
            "p99 misses", "workers", "seeds cheaper", "worst seed, points")  # fmt: skip
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    changes: list[float] = []
    points: list[float] = []
    worst: list[float] = []
    for name in names:
        ref = summarise(by[(name, variants[0])])
        for v in variants:
            s = summarise(by[(name, v)])
            change = s["whole"] / ref["whole"] - 1.0
            pts = (s["slo"] - ref["slo"]) * 100.0
            pair = paired(by[(name, variants[0])], by[(name, v)])
            if v is variants[-1] and len(variants) > 1:
                changes.append(change)
                points.append(pts)
                worst.append(pair["worst_points"])
            print(
                f"| {name} | {label(v)} | {s['seeds']:.0f} | {s['whole']:.3e} | {change:+.1%} | {s['slo']:.4f} | "
                f"{pts:+.2f} | {s['slo_min']:.4f} | {s['p99_misses']:.0f} | {s['workers']:.0f} | "
                f"{pair['cheaper']:.0f}/{pair['seeds']:.0f} | {pair['worst_points']:+.2f} |"
            )
    print()
    print(f"{len(jobs)} runs in {time.perf_counter() - t0:.0f} s on {processes} processes")
    if changes:
        cheaper = sum(1 for c in changes if c < 0)
        print(
            f"RESULT variant={label(variants[-1])} cells_cheaper={cheaper}/{len(changes)} "
            f"whole_change_median={statistics.median(changes):+.3f} slo_points_min={min(points):+.2f} "
            f"slo_points_worst_seed={min(worst):+.2f}"
        )


if __name__ == "__main__":
    main()
