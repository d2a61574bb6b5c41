"""ESG's idle cost and its overload behaviour under its best-effort tolerance and the keep-alive by price.

Every run names ``keep_alive_by_price`` (on by default since 2026-11-24), so
that the tables do not move with the default: parts 1-3 keep every idle worker
``keep_alive_s`` (the knob off, as they were measured before) unless a row says
"keep-alive by price".

Part 1, the standard case (60 s, 20 s warm-up) on ``--seeds`` (default 0 1 3):
ESG with a tolerance of 0.1 and every idle worker kept 60 s, with the spec's best
effort (tolerance 0, the fastest option), with ``keep_alive_by_price`` (ESG's
defaults), with ``best_effort_tolerance`` 0.25, with both of
those, and FaST-GShare-like with the keep-alive by price (its workers are all on T4s, so the knob changes nothing
for it). Columns: SLO hit rate, batch cost per request (the paper's cost model),
total cost per request (warm workers' keep-alive idle time billed too), workers
started (of them for at-risk dispatches).

Part 2, short runs (16 s, 6 s warm-up, as E1 and E6 of ``compare --quick``),
seed 0 unless named: ESG with ``best_effort_tolerance`` 0 (the spec's fastest
option), 0.1 and 0.25 at 150, 450 and 600 requests/s, 600 on seed 1, and the
bursty Azure LLM code trace at 300 requests/s.

Part 3, the default tolerance (0.1) against the spec's 0 over seeds 0, 1 and
3 (16 s runs, 6 s warm-up): 150 and 300 requests/s, 600 requests/s, the bursty
LLM code trace, and SLOs of 2x, 3x and 8x the batch-1 critical path on a T4;
per case the SLO hit rates and the change in batch cost per request.

Part 4, the keep-alive by price on and off over seeds 0, 1 and 3 (16 s runs,
6 s warm-up): 150, 300, 450 and 600 requests/s, the bursty LLM code and the
steady conversation traces, and SLOs of 2x the batch-1 critical path; per case
the SLO hit rates, the change in batch cost and in total cost per request.

All four are written up in docs/results.md, "Best effort: the cheapest option
near the fastest" and "Idle cost". Runs go to ``--processes``
worker processes (default one per CPU); every run is a function of its case and
seed, so the tables do not depend on the machine (the wall time does).

RESULT line (means over the seeds of part 1, and part 2's 600 requests/s seed-0 run):
  total_cost_cut_keep_alive_by_price = 1 - ESG's total cost with the knob / without (tolerance 0.1);
  batch_cost_rise_keep_alive_by_price = ESG's batch cost with the knob / without - 1;
  total_cost_cut_keep_alive_by_price_short = the first, mean over part 4's runs;
  slo_drop_keep_alive_by_price_worst = part 4's largest fall in SLO hit rate with the knob (points);
  batch_cost_rise_tolerance_0_1 = ESG's batch cost with its default tolerance / with the spec's 0 - 1;
  batch_cost_rise_tight_slo = the same, mean over part 3's SLO 2x and 3x runs (all seeds);
  slo_at_600_tolerance_0 / slo_at_600_tolerance_0_1 = ESG's SLO hit rate at 600
      requests/s with the spec's best effort and with a tolerance of 0.1.

Run:  python bench/idle_cost.py [--seeds 0 1 3] [--processes P]
Ends with: RESULT total_cost_cut_keep_alive_by_price=<x> batch_cost_rise_keep_alive_by_price=<y>
           total_cost_cut_keep_alive_by_price_short=<s> slo_drop_keep_alive_by_price_worst=<d>
           batch_cost_rise_tolerance_0_1=<v> batch_cost_rise_tight_slo=<u>
           slo_at_600_tolerance_0=<z> slo_at_600_tolerance_0_1=<w>
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import replace
from multiprocessing import get_context
from typing import Any

import esg_prefect.scheduling  # noqa: F401 - registers the baselines
from esg_prefect.simulator import simulate, standard_case

# Part 1's rows: (label, scheduler, settings changes).
FLAT: dict[str, Any] = {"keep_alive_by_price": False}  # every idle worker kept keep_alive_s
STANDARD_ROWS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("esg, tolerance 0.1", "esg", {**FLAT, "best_effort_tolerance": 0.1}),
    ("esg, tolerance 0 (spec)", "esg", {**FLAT, "best_effort_tolerance": 0.0}),
    ("esg, keep-alive by price", "esg", {"keep_alive_by_price": True, "best_effort_tolerance": 0.1}),
    ("esg, tolerance 0.25", "esg", {**FLAT, "best_effort_tolerance": 0.25}),
    ("esg, both (0.25)", "esg", {"keep_alive_by_price": True, "best_effort_tolerance": 0.25}),
    ("fast-gshare, by price", "fast-gshare", {"keep_alive_by_price": True}),
)
# Part 2's cases: (label, trace, requests/s, seed).
SHORT_CASES: tuple[tuple[str, str, float, int], ...] = (
    ("150 requests/s", "azure_functions_2019", 150.0, 0),
    ("450 requests/s", "azure_functions_2019", 450.0, 0),
    ("600 requests/s", "azure_functions_2019", 600.0, 0),
    ("600 requests/s, seed 1", "azure_functions_2019", 600.0, 1),
    ("LLM code trace (bursty)", "azure_llm_code", 300.0, 0),
)
TOLERANCES = (0.0, 0.1, 0.25)
# Part 3's cases: (label, standard_case keyword arguments).
SEED_CASES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("150 requests/s", {"rate_per_s": 150.0}),
    ("300 requests/s", {}),
    ("600 requests/s", {"rate_per_s": 600.0}),
    ("LLM code trace (bursty)", {"trace": "azure_llm_code"}),
    ("SLO 2x", {"tightness": 2.0}),
    ("SLO 3x", {"tightness": 3.0}),
    ("SLO 8x", {"tightness": 8.0}),
)
SEED_TOLERANCES = (0.0, 0.1)
SEEDS_OF_PART_3 = (0, 1, 3)

SHORT_RUN: dict[str, Any] = {"duration_s": 16.0, "warmup_s": 6.0}  # parts 2-4, as E1 and E6 of compare --quick
# Part 4's cases: (label, standard_case keyword arguments).
PRICED_CASES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("150 requests/s", {"rate_per_s": 150.0}),
    ("300 requests/s", {}),
    ("450 requests/s", {"rate_per_s": 450.0}),
    ("600 requests/s", {"rate_per_s": 600.0}),
    ("LLM code trace (bursty)", {"trace": "azure_llm_code"}),
    ("LLM conversation trace", {"trace": "azure_llm_conv"}),
    ("SLO 2x", {"tightness": 2.0}),
)

Job = tuple[str, str, str, int, dict[str, Any], dict[str, Any]]
"""(part, label, scheduler, seed, settings changes, other standard_case arguments)."""


def run_one(job: Job) -> dict[str, Any]:
    """One simulation; the figures the tables need."""
    part, label, name, seed, changes, case_kw = job
    case = standard_case(name, seed=seed, **case_kw)
    case = replace(case, settings=replace(case.settings, **changes))
    t0 = time.perf_counter()
    run = simulate(case)
    o = run.report.overall
    return {
        "part": part,
        "label": label,
        "seed": seed,
        "changes": changes,
        "slo": o.slo_hit_rate,
        "batch": o.batch_cost_per_request,
        "total": o.cost_per_request,
        "workers": run.cold_starts,
        "at_risk": run.at_risk_cold_starts,
        "wall_s": time.perf_counter() - t0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 3], help="seeds of part 1")
    parser.add_argument("--processes", type=int, default=0, help="worker processes (0: one per CPU)")
    args = parser.parse_args()
    jobs: list[Job] = []
    for seed in args.seeds:
        for label, name, changes in STANDARD_ROWS:
            jobs.append(("standard", label, name, seed, changes, {}))
    for label, trace, rate, seed in SHORT_CASES:
        for tol in TOLERANCES:
            case_kw = {"trace": trace, "rate_per_s": rate, **SHORT_RUN}
            jobs.append(("short", label, "esg", seed, {**FLAT, "best_effort_tolerance": tol}, case_kw))
    for label, case_kw in SEED_CASES:
        for seed in SEEDS_OF_PART_3:
            for tol in SEED_TOLERANCES:
                jobs.append(
                    ("seeds", label, "esg", seed, {**FLAT, "best_effort_tolerance": tol}, {**case_kw, **SHORT_RUN})
                )
    for label, case_kw in PRICED_CASES:
        for seed in SEEDS_OF_PART_3:
            for by_price_on in (False, True):
                jobs.append(
                    ("priced", label, "esg", seed, {"keep_alive_by_price": by_price_on}, {**case_kw, **SHORT_RUN})
                )
    jobs.sort(key=lambda j: j[0] != "standard")  # the long runs first, so that the pool ends together
    processes = min(args.processes or os.cpu_count() or 1, len(jobs))
    t0 = time.perf_counter()
    if processes <= 1:
        results = [run_one(j) for j in jobs]
    else:
        with get_context("fork").Pool(processes) as pool:
            results = pool.map(run_one, jobs, chunksize=1)
    wall = time.perf_counter() - t0

    std = {(r["label"], r["seed"]): r for r in results if r["part"] == "standard"}
    print(f"Part 1: the standard case, 60 s (20 s warm-up), seeds {' '.join(map(str, args.seeds))}")
    header = f"{'seed':>4} {'run':<28} {'SLO hit':>8} {'batch $/req':>12} {'total $/req':>12} {'workers (at risk)':>18}"
    print(header)
    print("-" * len(header))
    for seed in args.seeds:
        for label, _, _ in STANDARD_ROWS:
            r = std[(label, seed)]
            workers = f"{r['workers']} ({r['at_risk']})"
            print(f"{seed:>4} {label:<28} {r['slo']:8.4f} {r['batch']:12.3e} {r['total']:12.3e} {workers:>18}")
    print()
    short = {(r["label"], r["changes"]["best_effort_tolerance"]): r for r in results if r["part"] == "short"}
    print("Part 2: ESG, 16 s runs (6 s warm-up); SLO hit / batch $/req / workers started per best-effort tolerance")
    header = f"{'case':<26}" + "".join(f" {'tolerance ' + format(t, 'g'):>28}" for t in TOLERANCES)
    print(header)
    print("-" * len(header))
    for label, _, _, _ in SHORT_CASES:
        cells = []
        for tol in TOLERANCES:
            r = short[(label, tol)]
            cells.append(f"{r['slo']:.4f} / {r['batch']:.2e} / {r['workers']}")
        print(f"{label:<26}" + "".join(f" {c:>28}" for c in cells))
    print()

    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs)

    def per_seed(title: str, labels: list[str], cell: Callable[[str, int], str], width: int) -> None:
        """One table: a row per case, a column per seed of parts 3 and 4."""
        print(title)
        header = f"{'case':<26}" + "".join(f" {'seed ' + str(s):>{width}}" for s in SEEDS_OF_PART_3)
        print(header)
        print("-" * len(header))
        for label in labels:
            print(f"{label:<26}" + "".join(f" {cell(label, seed):>{width}}" for seed in SEEDS_OF_PART_3))
        print()

    by_seed = {
        (r["label"], r["seed"], r["changes"]["best_effort_tolerance"]): r for r in results if r["part"] == "seeds"
    }
    tight: list[float] = []

    def tolerance_cell(label: str, seed: int) -> str:
        at_0, at_default = by_seed[(label, seed, 0.0)], by_seed[(label, seed, 0.1)]
        change = at_default["batch"] / at_0["batch"] - 1
        if label in ("SLO 2x", "SLO 3x"):
            tight.append(change)
        return f"{at_0['slo']:.3f} -> {at_default['slo']:.3f}, {change:+.1%}"

    per_seed(
        "Part 3: ESG, 16 s runs (6 s warm-up); SLO hit at tolerance 0 -> 0.1 and batch $/req change, per seed",
        [label for label, _ in SEED_CASES],
        tolerance_cell,
        26,
    )

    by_price = {
        (r["label"], r["seed"], r["changes"]["keep_alive_by_price"]): r for r in results if r["part"] == "priced"
    }
    cuts: list[float] = []
    drops: list[float] = []

    def price_cell(label: str, seed: int) -> str:
        off, on = by_price[(label, seed, False)], by_price[(label, seed, True)]
        cuts.append(1 - on["total"] / off["total"])
        drops.append((off["slo"] - on["slo"]) * 100)
        batch = on["batch"] / off["batch"] - 1
        total = on["total"] / off["total"] - 1
        return f"{off['slo']:.4f} -> {on['slo']:.4f}, {batch:+.1%}, {total:+.1%}"

    per_seed(
        "Part 4: ESG, 16 s runs (6 s warm-up); keep-alive by price off -> on: SLO hit, batch and total $/req change",
        [label for label, _ in PRICED_CASES],
        price_cell,
        36,
    )

    priced = [std[("esg, keep-alive by price", s)] for s in args.seeds]
    flat = [std[("esg, tolerance 0.1", s)] for s in args.seeds]
    spec = [std[("esg, tolerance 0 (spec)", s)] for s in args.seeds]
    cut = mean([1 - p["total"] / b["total"] for p, b in zip(priced, flat, strict=True)])
    rise = mean([p["batch"] / b["batch"] - 1 for p, b in zip(priced, flat, strict=True)])
    rise_tol = mean([d["batch"] / b["batch"] - 1 for d, b in zip(flat, spec, strict=True)])
    print(f"{len(jobs)} simulations in {wall:.0f} s over {processes} process(es)")
    print(
        f"RESULT total_cost_cut_keep_alive_by_price={cut:.3f} batch_cost_rise_keep_alive_by_price={rise:.3f} "
        f"total_cost_cut_keep_alive_by_price_short={mean(cuts):.3f} "
        f"slo_drop_keep_alive_by_price_worst={max(drops):.2f} "
        f"batch_cost_rise_tolerance_0_1={rise_tol:.3f} batch_cost_rise_tight_slo={mean(tight):.3f} "
        f"slo_at_600_tolerance_0={short[('600 requests/s', 0.0)]['slo']:.4f} "
        f"slo_at_600_tolerance_0_1={short[('600 requests/s', 0.1)]['slo']:.4f}"
    )


if __name__ == "__main__":
    main()
