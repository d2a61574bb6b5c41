"""The whole-bill bench's goal test and its report: choosing, judging and printing the rows of its runs.

``bench/whole_bill.py`` runs the grid and turns each run into a row (a dict of
figures); this module picks each baseline's lifecycle setting, judges ESG
against the best baseline in each cell (the goal test of that module's
docstring), and prints the outcome: the markdown tables, the keep-alive sweep,
the report check, the plot and the ``RESULT`` line. Kept apart so the bench holds the runs and
this the verdicts.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from esg_prefect.simulator.experiments import PRIOR_WORK

if TYPE_CHECKING:
    from whole_bill import Cell, Setting

ESG = "esg"
SLO_TOLERANCE = 0.005
"""0.5 points of SLO hit rate."""
GOAL_RATIO = 1.25


# ---- choosing and judging --------------------------------------------------------------------


def setting_label(setting: Setting) -> str:
    """How a lifecycle setting prints: ``defaults``, ``fixed 3 s``..."""
    if not setting:
        return "defaults"
    d = dict(setting)
    parts = []
    if "keep_alive_policy" in d:
        parts.append(str(d.pop("keep_alive_policy")))
    if "keep_alive_s" in d:
        parts.append(f"{d.pop('keep_alive_s'):g} s")
    parts.extend(f"{k}={v}" for k, v in d.items())
    return " ".join(parts)


def pick_setting(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Of one baseline's rows in one cell: the cheapest whole bill within SLO_TOLERANCE of its best SLO hit rate."""
    rows = list(rows)
    top = max(r["slo_hit_rate"] for r in rows)
    ok = [r for r in rows if r["slo_hit_rate"] >= top - SLO_TOLERANCE - 1e-12]
    return min(ok, key=lambda r: (r["whole"], -r["slo_hit_rate"]))


def _beside(x: float, limit: float, sign: str = "") -> str:
    """``x`` to two decimals, or as many more as it takes not to read as ``limit`` (1.249 is not "1.25")."""
    for digits in (2, 3, 4, 5):
        text = f"{x:{sign}.{digits}f}"
        if float(text) != limit:
            return text
    return f"{x:{sign}g}"


@dataclass(frozen=True, slots=True)
class Verdict:
    """The goal test of one cell (module docstring)."""

    cell: str
    esg: dict[str, Any]
    chosen: dict[str, dict[str, Any]]
    best: dict[str, Any]
    ratio: float
    slo_delta_points: float
    p99_over: tuple[str, ...]

    @property
    def misses(self) -> list[str]:
        """The conditions missed, in words (empty: the cell is won)."""
        out = []
        if not self.esg["requests"]:
            return ["no requests in the window"]
        if not self.ratio >= GOAL_RATIO:
            out.append(f"cost: whole-bill ratio {_beside(self.ratio, GOAL_RATIO)} < {GOAL_RATIO:g}")
        if self.slo_delta_points < -SLO_TOLERANCE * 100 - 1e-9:
            points = _beside(self.slo_delta_points, -SLO_TOLERANCE * 100, "+")
            out.append(f"SLO: {points} points vs best baseline")
        if self.p99_over:  # the best baseline's own misses beside them: near capacity it may miss as well
            theirs = [f"{wf} {p:.0f}>{slo:.0f} ms" for wf, (p, slo) in self.best.get("p99", {}).items() if p > slo]
            also = f" (the best baseline's too: {', '.join(theirs)})" if theirs else ""
            out.append("p99 over SLO: " + ", ".join(self.p99_over) + also)
        return out

    @property
    def won(self) -> bool:
        """Whether every condition holds."""
        return not self.misses


def judge(cell: str, rows: Sequence[dict[str, Any]]) -> Verdict:
    """ESG against the best baseline in one cell's rows."""
    esg = next(r for r in rows if r["scheduler"] == ESG)
    chosen = {
        b: pick_setting(r for r in rows if r["scheduler"] == b)
        for b in PRIOR_WORK
        if any(r["scheduler"] == b for r in rows)
    }
    top = max(r["slo_hit_rate"] for r in chosen.values())
    near_top = [r for r in chosen.values() if r["slo_hit_rate"] >= top - SLO_TOLERANCE - 1e-12]
    best = min(near_top, key=lambda r: (r["whole"], -r["slo_hit_rate"]))
    ratio = best["whole"] / esg["whole"] if esg["whole"] > 0 else math.nan
    over = tuple(f"{wf} {p:.0f}>{slo:.0f} ms" for wf, (p, slo) in esg["p99"].items() if p > slo)
    delta = (esg["slo_hit_rate"] - best["slo_hit_rate"]) * 100.0
    return Verdict(cell, esg, chosen, best, ratio, delta, over)


def result_line(verdicts: Sequence[Verdict], wall_s: float) -> str:
    """The bench's last line (module docstring)."""
    judged = [v for v in verdicts if not math.isnan(v.ratio)] or list(verdicts)
    worst = min(judged, key=lambda v: v.ratio)
    won = sum(1 for v in verdicts if v.won)
    median = statistics.median(v.ratio for v in judged)
    slo_min = min(v.esg["slo_hit_rate"] for v in verdicts)
    p99_miss = sum(1 for v in verdicts if v.p99_over)
    return (
        f"RESULT worst_cell={worst.cell} whole_bill_ratio_worst={worst.ratio:.3f} "
        f"cells_won={won}/{len(verdicts)} whole_bill_ratio_median={median:.3f} "
        f"esg_slo_min={slo_min:.4f} p99_misses={p99_miss} wall_s={wall_s:.0f}"
    )


# ---- printing --------------------------------------------------------------------------------


def _worst_p99(p99: dict[str, tuple[float, float]]) -> str:
    wf, (p, slo) = max(p99.items(), key=lambda kv: kv[1][0] / kv[1][1])
    mark = " **over**" if p > slo else ""
    shown = "inf" if math.isinf(p) else f"{p:.0f}"
    return f"{shown}/{slo:.0f} {wf}{mark}"


def table_rows(verdicts: Sequence[Verdict]) -> list[str]:
    """The markdown table of every cell and scheduler."""
    out = [
        "| cell | rate /s | scheduler | setting | SLO hit | whole $/req | busy | idle | cold "
        "| batch $/req (paper) | worst p99/SLO ms | workers | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for v in verdicts:
        for r in (v.esg, *v.chosen.values()):
            if r is v.esg:
                verdict = "won" if v.won else "**missed**: " + "; ".join(v.misses)
            else:
                verdict = "best baseline" if r is v.best else ""
            out.append(
                f"| {v.cell} | {r['rate_per_s']:g} | {r['scheduler']} | {setting_label(r['setting'])} "
                f"| {r['slo_hit_rate']:.4f} | {r['whole']:.3e} | {r['busy']:.2e} | {r['idle']:.2e} "
                f"| {r['cold']:.2e} | {r['batch']:.3e} | {_worst_p99(r['p99'])} | {r['workers']} | {verdict} |"
            )
    return out


def summary_rows(verdicts: Sequence[Verdict]) -> list[str]:
    """One markdown row per cell: the goal test."""
    out = [
        "| cell | best baseline (setting) | its whole $/req | ESG whole $/req | ratio | ESG SLO | baseline SLO "
        "| ratio incl. warm-up | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for v in verdicts:
        b, e = v.best, v.esg
        warm = b["whole_run"] / e["whole_run"] if e["whole_run"] > 0 else math.inf
        verdict = "won" if v.won else "**missed**: " + "; ".join(v.misses)
        out.append(
            f"| {v.cell} | {b['scheduler']} ({setting_label(b['setting'])}) | {b['whole']:.3e} "
            f"| {e['whole']:.3e} | {v.ratio:.2f} | {e['slo_hit_rate']:.4f} | {b['slo_hit_rate']:.4f} "
            f"| {warm:.2f} | {verdict} |"
        )
    return out


def cell_type(cell: str) -> str:
    """A cell's name without its seed: ``code-low-s3`` and ``code-low`` are both ``code-low``."""
    head, _, tail = cell.rpartition("-s")
    return head if head and tail.isdigit() else cell


def type_rows(verdicts: Sequence[Verdict]) -> list[str]:
    """Per cell type over its seeds: cells won, the ratio's spread, the SLO delta; [] when no type has two seeds.

    The goal is judged cell by cell; this table says how a type fares over its seeds, where one
    seed's clump can decide a cell. A cell with no request in its window counts among the seeds
    only, as the RESULT line leaves it out of the ratios.
    """
    by: dict[str, list[Verdict]] = {}
    for v in verdicts:
        by.setdefault(cell_type(v.cell), []).append(v)
    if all(len(vs) < 2 for vs in by.values()):
        return []
    out = [
        "| cell type | seeds | won | ratio median (min-max) | SLO delta, points: mean (worst) | ESG SLO mean | "
        "best baseline SLO mean | cells with a p99 over |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, vs in by.items():
        won, p99 = sum(v.won for v in vs), sum(1 for v in vs if v.p99_over)
        judged = [v for v in vs if v.esg["requests"] and not math.isnan(v.ratio)]  # as the RESULT line's ratios
        if not judged:
            out.append(f"| {name} | {len(vs)} | {won} | - | - | - | - | {p99} |")
            continue
        ratios = [v.ratio for v in judged]
        deltas = [v.slo_delta_points for v in judged]
        out.append(
            f"| {name} | {len(vs)} | {won} | {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) "
            f"| {statistics.mean(deltas):+.2f} ({min(deltas):+.2f}) | "
            f"{statistics.mean(v.esg['slo_hit_rate'] for v in judged):.4f} | "
            f"{statistics.mean(v.best['slo_hit_rate'] for v in judged):.4f} | {p99} |"
        )
    return out


def idle_rows(verdicts: Sequence[Verdict]) -> list[str]:
    """One markdown row per cell and scheduler (ESG, the best baseline): where the idle bill goes (:class:`Bill`).

    ESG's row also gives the ratio it would reach if its workers cost nothing
    before their first batch or after their last: the most a lifecycle rule
    alone could win at today's batches and utilisation.
    """
    out = [
        "| cell | scheduler | idle $/req | between batches | before first / after last | share utilisation "
        "| ratio without the ends |",
        "|---|---|---|---|---|---|---|",
    ]
    for v in verdicts:
        for r in (v.esg, v.best):
            ends = r["idle"] - r["idle_gaps"]
            bound = ""
            if r is v.esg:
                rest = r["whole"] - ends
                bound = f"{v.best['whole'] / rest:.2f}" if rest > 0 else "inf"
            out.append(
                f"| {v.cell} | {r['scheduler']} | {r['idle']:.2e} | {r['idle_gaps']:.2e} | {ends:.2e} "
                f"| {r['share_utilisation']:.2f} | {bound} |"
            )
    return out


def sweep_lines(rows: Sequence[dict[str, Any]], cells: Sequence[Cell]) -> list[str]:
    """Every baseline setting run: SLO hit rate and whole bill per request, the chosen one starred."""
    out = []
    for cell in cells:
        for b in PRIOR_WORK:
            mine = [r for r in rows if r["cell"] == cell.name and r["scheduler"] == b]
            if not mine:
                continue
            pick = pick_setting(mine)
            parts = [
                f"{setting_label(r['setting'])}{'*' if r is pick else ''}: {r['slo_hit_rate']:.4f} / {r['whole']:.2e}"
                for r in mine
            ]
            out.append(f"{cell.name:<12} {b:<15} " + "   ".join(parts))
    return out


def print_report(verdicts: Sequence[Verdict], rows: Sequence[dict[str, Any]], cells: Sequence[Cell]) -> None:
    """Print the grid's tables in order, then whether every run's split agreed with its report."""
    sections = [
        (
            "Every cell, ESG and each baseline at its chosen setting ($ per request; busy + idle + cold = whole):",
            table_rows(verdicts),
        ),
        (
            "The goal test per cell (ratio = best baseline's whole bill / ESG's; 'incl. warm-up': whole runs):",
            summary_rows(verdicts),
        ),
        ("Per cell type over its seeds (ratio and SLO delta as above):", type_rows(verdicts)),
        (
            "Where the idle bill goes (between two batches of a worker, or before its first / after its last):",
            idle_rows(verdicts),
        ),
    ]
    for title, lines in sections:
        if lines:
            print(f"\n{title}\n")
            print("\n".join(lines))
    print("\nKeep-alive sweep (SLO hit rate / whole $ per request; * = chosen):")
    print("\n".join(sweep_lines(rows, cells)))
    disagree = [f"{r['cell']}/{r['scheduler']}/{setting_label(r['setting'])}" for r in rows if not r["report_agrees"]]
    print(
        "report check: busy + idle + cold equals the report's busy + idle cost in every run"
        if not disagree
        else f"report check: **{len(disagree)} runs disagree** with their report: {', '.join(disagree)}"
    )


def plot(verdicts: Sequence[Verdict], path: str) -> None:
    """Stacked busy/idle/cold bars per scheduler, one panel per cell (own y axis: ranges differ)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(verdicts)
    cols = min(3, n)
    nrows = math.ceil(n / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.2 * cols, 3.6 * nrows), squeeze=False)
    parts = (("busy", "#4c72b0"), ("idle", "#dd8452"), ("cold", "#c44e52"))
    for ax, v in zip(axes.flat, verdicts, strict=False):
        rows = [v.esg, *v.chosen.values()]
        names = [r["scheduler"] + (" (best)" if r is v.best else "") for r in rows]
        bottom = [0.0] * len(rows)
        for key, color in parts:
            vals = [r[key] * 1e6 for r in rows]
            ax.bar(names, vals, bottom=bottom, color=color, label=key)
            bottom = [a + b for a, b in zip(bottom, vals, strict=True)]
        ax.set_title(f"{v.cell} ({v.esg['rate_per_s']:g}/s): ratio {v.ratio:.2f}{'' if v.won else ' (missed)'}")
        ax.set_ylabel("$ per million requests")
        ax.tick_params(axis="x", labelrotation=35, labelsize=8)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper right", ncol=3)
    fig.suptitle(
        "Whole bill per request: ESG (defaults) vs prior work (each at its best lifecycle setting); "
        "ratio = best baseline / ESG"
    )
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
