"""Tables and figures of the profiler: the profile summary, the stall breakdown, the validation.

The tables are plain functions of the results (text or Markdown), so they are
tested without a plot; the figures are PNGs drawn with matplotlib's Agg
backend (no display needed): one stall-breakdown figure per pipeline and one
predicted-versus-measured figure for the validation.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

from esg_prefect.profiler.breakdown import COMPONENTS, StallRow
from esg_prefect.profiler.results import ProfiledPoint
from esg_prefect.profiler.validate import ValidationReport

_COLORS = {
    "compute": "#4C72B0",
    "h2d": "#8172B2",
    "interference": "#C44E52",
    "transfer": "#DD8452",
    "queueing": "#55A868",
    "cold_start": "#937860",
}


def profile_summary(points: Sequence[ProfiledPoint]) -> str:
    """Per stage and configuration: batch-1 and batch-8 mean/p95, per-item speedup at 8, peak memory, cold start."""
    by = {(p.stage, p.hardware, p.vcpus, p.gpu_share, p.batch): p for p in points}
    keys = list(dict.fromkeys((p.stage, p.hardware, p.vcpus, p.gpu_share) for p in points))
    head = (
        f"{'stage':<14}{'config':<16}{'b1 mean':>9}{'b1 p95':>9}{'b8 mean':>9}{'b8 p95':>9}"
        f"{'x/item@8':>9}{'peak MiB':>9}{'cold ms':>9}"
    )
    lines = [head, "-" * len(head)]
    for st, hw, v, s in keys:
        b1, b8 = by.get((st, hw, v, s, 1)), by.get((st, hw, v, s, 8))
        anyp = b1 or next(p for p in points if (p.stage, p.hardware, p.vcpus, p.gpu_share) == (st, hw, v, s))

        def f(p: ProfiledPoint | None, attr: str) -> str:
            return f"{getattr(p, attr):9.2f}" if p is not None else f"{'-':>9}"

        speed = f"{8 * b1.mean_ms / b8.mean_ms:9.2f}" if b1 is not None and b8 is not None else f"{'-':>9}"
        cfg = f"{hw}/{v}" + ("" if s == 0 else f"/{s:g}")
        peak = max(p.peak_mem_mb for p in points if (p.stage, p.hardware, p.vcpus, p.gpu_share) == (st, hw, v, s))
        lines.append(
            f"{st:<14}{cfg:<16}{f(b1, 'mean_ms')}{f(b1, 'p95_ms')}{f(b8, 'mean_ms')}{f(b8, 'p95_ms')}{speed}"
            f"{peak:9.0f}{anyp.total_cold_start_ms:9.0f}"
        )
    return "\n".join(lines)


FALL_RATIO = 0.7
"""A batch timed below this fraction of the next smaller batch's time is implausible: a bigger batch does
more work, so the smaller one was slowed by other processes or the bigger one timed in a lull."""
FALL_MIN_MS = 0.05
"""Falls smaller than this are left alone: on sub-millisecond calls they are the timer's and the caches' jitter."""


def _configs(points: Sequence[ProfiledPoint]) -> dict[tuple[str, str], list[ProfiledPoint]]:
    """Points by (stage, configuration label), each list in batch order, stages and configurations as measured."""
    out: dict[tuple[str, str], list[ProfiledPoint]] = {}
    for p in points:
        out.setdefault((p.stage, p.config_label), []).append(p)
    return {k: sorted(v, key=lambda p: p.batch) for k, v in out.items()}


def quiet_line(points: Sequence[ProfiledPoint]) -> str:
    """How many points per configuration stayed disturbed after every attempt (``quiet=0``), and in all."""
    by: dict[str, list[ProfiledPoint]] = {}
    for p in points:
        by.setdefault(p.config_label, []).append(p)
    each = ", ".join(f"{label} {sum(not p.quiet for p in ps)}/{len(ps)}" for label, ps in by.items())
    noisy = sum(not p.quiet for p in points)
    return (
        f"points not quiet (other processes on their cores after every attempt): {each}; {noisy}/{len(points)} in all"
    )


def falls(points: Sequence[ProfiledPoint]) -> list[tuple[ProfiledPoint, ProfiledPoint]]:
    """Pairs (smaller batch, next bigger batch) of one stage and configuration where the time falls beyond noise.

    Beyond noise: the bigger batch takes less than :data:`FALL_RATIO` of the smaller one's mean,
    by more than :data:`FALL_MIN_MS`.
    """
    out = []
    for ps in _configs(points).values():
        for small, big in itertools.pairwise(ps):
            if big.mean_ms < FALL_RATIO * small.mean_ms and small.mean_ms - big.mean_ms > FALL_MIN_MS:
                out.append((small, big))
    return out


def noise_warnings(points: Sequence[ProfiledPoint]) -> list[str]:
    """One line per stage whose points were not quiet or whose time falls as the batch grows, naming them.

    Such rows time the neighbours as much as the stage, and the scheduler would plan with them as
    they are: the line says which, and to profile again on a quieter machine.
    """
    lines = []
    fell = falls(points)
    for stage in dict.fromkeys(p.stage for p in points):
        mine = [p for p in points if p.stage == stage]
        parts = []
        noisy = {label: [p for p in ps if not p.quiet] for (_, label), ps in _configs(mine).items()}  # one stage
        if any(noisy.values()):
            where = "; ".join(f"{k} {', '.join(f'b{p.batch}' for p in v)}" for k, v in noisy.items() if v)
            parts.append(f"{sum(map(len, noisy.values()))} of {len(mine)} points not quiet ({where})")
        drops = [(a, b) for a, b in fell if a.stage == stage]
        if drops:
            named = ", ".join(
                f"{a.config_label} b{a.batch} {a.mean_ms:.3g} ms -> b{b.batch} {b.mean_ms:.3g} ms" for a, b in drops
            )
            parts.append(f"time falls as the batch grows ({named})")
        if parts:
            lines.append(
                f"warning: {stage}: {'; '.join(parts)}: these rows time other processes as much as the stage; "
                "profile again on a quieter machine (a longer --wait-quiet-s, more --max-attempts) before "
                "planning with them"
            )
    return lines


def breakdown_table(rows: Sequence[StallRow]) -> str:
    """A Markdown table of the stall breakdown, ms per batch; cold start per cold worker."""
    head = (
        "| pipeline | stage | batch | compute | + h2d | + interference (slowdown) | + transfer (KiB) "
        "| + queueing (p95) | warm total | + cold start |"
    )
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        h2d = "n/a" if r.h2d_ms is None else f"{r.h2d_ms:.2f}"
        lines.append(
            f"| {r.pipeline} | {r.stage} | {r.batch} | {r.compute_ms:.2f} | {h2d} "
            f"| {r.interference_ms:.2f} (x{r.slowdown:.2f}) | {r.transfer_ms:.2f} ({r.transfer_bytes / 1024:.0f}) "
            f"| {r.queueing_ms:.2f} ({r.queue_p95_ms:.1f}) | {r.warm_total_ms:.2f} | {r.cold_start_ms:.0f} |"
        )
    return "\n".join(lines)


def plot_breakdown(rows: Sequence[StallRow], pipeline: str, out: Path) -> Path:
    """Draw one pipeline's stall breakdown: warm stalls stacked per stage, cold start beside (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mine = [r for r in rows if r.pipeline == pipeline]
    if not mine:
        raise ValueError(f"no stall rows for pipeline {pipeline!r}")
    names = [r.stage for r in mine]
    fig, (ax, ax2) = plt.subplots(
        1, 2, figsize=(11, 0.55 * len(mine) + 2.3), gridspec_kw={"width_ratios": [3, 1]}, sharey=True
    )
    left = [0.0] * len(mine)
    for comp in COMPONENTS[:-1]:
        vals = [r.component_ms(comp) for r in mine]
        label = comp + (" (n/a on CPU)" if comp == "h2d" and all(r.h2d_ms is None for r in mine) else "")
        ax.barh(names, vals, left=left, color=_COLORS[comp], label=label)
        left = [a + b for a, b in zip(left, vals, strict=True)]
    ax.invert_yaxis()
    r0 = mine[0]
    cfg = f"{r0.hardware}, {r0.vcpus} vCPU" + ("" if r0.gpu_share == 0 else f", share {r0.gpu_share:g}")
    ax.set_xlabel(f"ms per batch of {r0.batch} ({cfg})")
    ax.set_title(
        f"{pipeline}: stalls per stage (co-runners {r0.co_runners}, queueing: {r0.queue_trace} at "
        f"{r0.queue_utilisation:.0%} load)",
        fontsize=9,
    )
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=5, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    ax2.barh(names, [r.cold_start_ms for r in mine], color=_COLORS["cold_start"])
    ax2.set_xlabel("cold start, ms (per cold worker)")
    ax2.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_validation(report: ValidationReport, out: Path) -> Path:
    """Predicted against measured batch latency, log-log, interpolated points marked (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 6))
    for interp, marker, label in ((False, "o", "measured batch size"), (True, "^", "between measured sizes")):
        pts = [r for r in report.rows if r.interpolated == interp]
        ax.scatter(
            [r.measured_ms for r in pts], [r.predicted_ms for r in pts], marker=marker, s=22, alpha=0.75, label=label
        )
    lo = min(min(r.measured_ms, r.predicted_ms) for r in report.rows) * 0.8
    hi = max(max(r.measured_ms, r.predicted_ms) for r in report.rows) * 1.25
    ax.plot([lo, hi], [lo, hi], color="k", lw=0.8)
    for f in (1 - report.target, 1 + report.target):
        ax.plot([lo, hi], [lo * f, hi * f], color="k", lw=0.5, ls="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured mean, ms (fresh run)")
    ax.set_ylabel("profile prediction (interpolated mean), ms")
    ax.set_title(f"validation: median APE {report.median_ape():.1%} (dashed: +-{report.target:.0%})", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
