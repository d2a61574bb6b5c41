"""Probe of the per-stage plan (#21): ESG held to one kind per stage, sized from the stage's rate.

Not a scheduler: an experiment that patches ESG in this process to test how much a per-stage plan
could win on the whole bill before anyone builds one. Per cell of ``bench/whole_bill.py``'s grid:

1. ESG at its defaults, less its own per-stage plan (``stage_plan``, the built form of this
   probe), runs the cell; each stage's mean rate is counted from its jobs (an oracle:
   the true mean over the window, which no online scheduler knows).
2. Per stage, the plan is the (hardware, vCPUs, share, batch) and worker count of least price per
   second (shares held for life, vCPUs while busy) whose batch fills and runs within the stage's
   part of the SLO (split in proportion to the stages' fastest latencies) at utilisation ``--rho``.
3. ESG runs the cell again, offered only the plan's kind for each stage and no cold start once the
   stage holds the plan's count (``--online``: the count follows the queues' EWMA rates each
   round, FaST-GShare-like's rule, instead of the oracle's mean), so a queue waits for a worker.

``--window-ms`` counts the stage's calls over a window instead of the EWMAs, ``--peak-s`` sizes for
the highest such count of the last seconds, ``--spill`` lets a stage below its count start any kind
when the plan's kind has no room, ``--soft`` lets any warm worker serve (the plan then holds only
which workers start, and how many).

Run:  python bench/plan_probe.py [--cells standard-s0,conv-mid] [--online [--window-ms 1000] [--peak-s 10]]
      [--spill] [--soft] [--rho 0.6] [--extra 0]
Prints per cell the plan and the whole bill per request and SLO hit rate of both runs; the best
baseline's figures are in ``bench/whole_bill.py``'s grid. Findings: docs/decisions/whole-bill.md.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import whole_bill as wb

from esg_prefect.scheduling import esg_1q
from esg_prefect.scheduling.esg import ESGScheduler
from esg_prefect.scheduling.stage_plan import plan_stage, stage_budgets
from esg_prefect.scheduling.tables import CandidateTables
from esg_prefect.simulator import simulate
from esg_prefect.simulator.case import Case

SPILL = False
"""``--spill``: below its count, a stage whose plan kind has no room may start any kind."""
SOFT = False
"""``--soft``: any warm worker may serve; the plan holds only which workers start, and how many."""

Plan = tuple[float, str, int, float, int, int, float]
"""(price per s, hardware, vcpus, share, batch, workers, batch latency ms)."""


def plan(case: Case, rates: dict[str, float], rho: float) -> dict[str, Plan]:
    """The least-price kind and count per stage that carries its rate within its budget
    (:func:`~esg_prefect.scheduling.stage_plan.plan_stage`, ESG's own planner)."""
    tables = CandidateTables(case.load_profile(), case.prices, case.settings)
    hardware = frozenset(case.cluster.gpu_counts()) | {"cpu"}
    budgets = stage_budgets(tuple(case.workflows), tables, hardware)
    out: dict[str, Plan] = {}
    for stage, lam in rates.items():
        p = plan_stage(tables, stage, lam, budgets[stage], hardware, rho)
        if p is not None:
            out[stage] = (p.price_per_s, p.hardware, p.vcpus, p.gpu_share, p.batch, p.workers(lam, rho), p.latency_ms)
    return out


def held_to(plans: dict[str, Plan], counts: dict[str, int]) -> Any:
    """ESG_1Q's placeable resources restricted to each stage's plan kind, and no start past its count."""
    original = esg_1q.ESG1Q._placeable

    def placeable(self: Any, stage: str, view: Any, now_ms: float | None) -> Any:
        out = original(self, stage, view, now_ms)
        p = plans.get(stage)
        if p is None:
            return out
        full = view.workers_of_kind(stage, p[1], p[2], p[3]) >= counts[stage]
        kind = (p[1], p[2], p[3])
        if SOFT:  # any warm worker; a new one only of the plan's kind, below the count
            kept = tuple(r for r in out if r[3] or ((r[0], r[1], r[2]) == kind and not full))
        else:
            kept = tuple(r for r in out if (r[0], r[1], r[2]) == kind and (r[3] or not full))
        if SPILL and not full and not any(not r[3] for r in kept):
            return out  # the plan's kind has no room left: any kind, as ESG would choose
        return kept

    return placeable


def counted_by_rate(
    plans: dict[str, Plan], counts: dict[str, int], rho: float, extra: int, window_ms: float, peak_ms: float = 0.0
) -> Any:
    """ESG's decide, with each stage's count set first from its rate: its queues' EWMA rates, or
    with ``window_ms`` the calls counted into its queues over that window (each call once)."""
    original = ESGScheduler.decide
    seen: set[str] = set()
    ready: dict[str, deque[float]] = {}
    peaks: dict[str, deque[tuple[float, float]]] = {}

    def decide(self: Any, snapshot: Any, now_ms: float) -> Any:
        lam: dict[str, float] = {}
        for q in snapshot.queues:
            if window_ms <= 0:
                lam[q.key.stage] = lam.get(q.key.stage, 0.0) + q.arrival_rate_per_s
                continue
            times = ready.setdefault(q.key.stage, deque())
            for j in q.jobs:
                if j.job_id not in seen:
                    seen.add(j.job_id)
                    times.append(j.ready_ms)
        for stage, times in ready.items():
            while times and times[0] < now_ms - window_ms:
                times.popleft()
            lam[stage] = len(times) / window_ms * 1000.0
            if peak_ms > 0:  # the highest such rate over the last peak_ms: up at once, down after peak_ms
                hist = peaks.setdefault(stage, deque())
                while hist and hist[-1][1] <= lam[stage]:
                    hist.pop()
                hist.append((now_ms, lam[stage]))
                while hist[0][0] < now_ms - peak_ms:
                    hist.popleft()
                lam[stage] = hist[0][1]
        for stage, p in plans.items():
            counts[stage] = max(1, math.ceil(lam.get(stage, 0.0) * p[6] / 1000.0 / p[4] / rho)) + extra
        return original(self, snapshot, now_ms)

    return decide


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cells", default=",".join(c.name for c in wb.grid_cells()))
    parser.add_argument("--online", action="store_true", help="count from the queues' EWMA rates each round")
    parser.add_argument("--rho", type=float, default=0.6, help="planned utilisation of a stage's workers")
    parser.add_argument("--extra", type=int, default=0, help="workers allowed past the count")
    parser.add_argument("--window-ms", type=float, default=0.0, help="--online: count calls over this window (0: EWMA)")
    parser.add_argument("--spill", action="store_true", help="below the count, any kind when the plan's has no room")
    parser.add_argument("--soft", action="store_true", help="any warm worker may serve; the plan holds the starts")
    parser.add_argument("--peak-s", type=float, default=0.0, help="--window-ms: size for the peak count of this long")
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=10.0)
    args = parser.parse_args()
    global SPILL, SOFT
    SPILL, SOFT = args.spill, args.soft
    cells = {c.name: c for c in wb.grid_cells()}
    unknown = [n for n in args.cells.split(",") if n not in cells]
    if unknown or not 0 < args.rho <= 1 or args.extra < 0:
        parser.error(f"cells must be among {sorted(cells)}, --rho in (0, 1], --extra >= 0; got {args}")
    placeable, decide = esg_1q.ESG1Q._placeable, ESGScheduler.decide
    for name in args.cells.split(","):
        job = wb.Job(cells[name], wb.ESG, (), args.duration, args.warmup)
        case = wb.job_case(job)  # ESG without its own per-stage plan: the probe holds it instead
        case = case.with_(settings=replace(case.settings, stage_plan=False))
        esg_1q.ESG1Q._placeable, ESGScheduler.decide = placeable, decide  # type: ignore[method-assign]
        base = simulate(case)
        rates: dict[str, float] = {}
        for s in base.report.stages:
            rates[s.stage] = rates.get(s.stage, 0.0) + s.jobs / (args.duration - args.warmup)
        plans = plan(case, rates, args.rho)
        counts = {stage: p[5] + args.extra for stage, p in plans.items()}
        esg_1q.ESG1Q._placeable = held_to(plans, counts)  # type: ignore[method-assign]
        if args.online:
            decide_by_rate = counted_by_rate(plans, counts, args.rho, args.extra, args.window_ms, args.peak_s * 1000.0)
            ESGScheduler.decide = decide_by_rate  # type: ignore[method-assign]
        held = simulate(case)
        print(f"{name}: " + "; ".join(f"{st} {p[1]} v{p[2]} s{p[3]} b{p[4]} n{p[5]}" for st, p in plans.items()))
        for label, run in (("ESG, no plan", base), ("held to plan", held)):
            n = run.report.overall.count or 1
            bill = wb.bill_split(run, case)
            print(
                f"  {label:13s} whole {bill.whole / n:.3e}/req (busy {bill.busy / n:.2e}, idle {bill.idle / n:.2e}) "
                f"SLO {run.report.overall.slo_hit_rate:.4f} workers {run.cold_starts}"
            )
    esg_1q.ESG1Q._placeable, ESGScheduler.decide = placeable, decide  # type: ignore[method-assign]


if __name__ == "__main__":
    main()
