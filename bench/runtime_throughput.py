"""Runtime throughput: ESGTaskRunner vs ThreadPoolTaskRunner vs an ideal direct loop, side by side.

The three example pipelines (image, text, video) run as real Prefect flow runs,
one per request, with arrivals from the Azure Functions 2019 trace slice shipped
with esg-prefect, at concurrency 1, 8 and 64 (most flow runs in flight at once;
the offered rate is high enough to keep that many busy):

* esg: ``ESGTaskRunner`` with a fresh embedded pool (worker processes, ESG);
* threadpool: Prefect's ``ThreadPoolTaskRunner``, one model call per item in the flow's process;
* ideal: no Prefect: warm models, every stage over the same requests in batches of 8 (the batch
  size the shipped CPU profile favours; 32 loses on large convolutions here), one request
  type after another.

Reported per runner and concurrency: throughput (requests/s of wall time), p50/p95 latency
from arrival to the flow's return, SLO hit rate against each pipeline's SLO, and cost per
request (ESG: worker busy + idle time at the default vCPU price; thread pool and ideal: the
calls' own time x torch threads at the same price; the ``busy $`` column bills ESG the same way,
its batches' time only, without the warm idle time that ESG-SPEC bills). These bursts saturate the machine, so
their latencies are backlog. The SLO phase that follows replays the trace at 80% of the
thread pool's measured throughput (a load it sustains on average) with the top concurrency
cap, and its SLO hit rates are the ones in the RESULT line. Then: the CPU seconds each part
used (this process: Prefect's flow and task engines, the pool's controller and the thread
pool's model calls; the Prefect API server; esg-prefect's worker processes).

Prefect runs its ephemeral API on an in-memory database here (see
``esg_prefect.examples.demo.quiet_prefect``) and flow-run heartbeats are off
(``latency_settings``): with Prefect's defaults both runners measure SQLite's
lock back-off and a heartbeat join instead of themselves.

Run:  python bench/runtime_throughput.py [--requests 120] [--concurrency 1 8 64]
Ends with: RESULT speedup_vs_threadpool_64=<x> overhead_vs_ideal_64=<y> slo_hit_esg_64=<a> slo_hit_threadpool_64=<b>
(speedup = esg throughput / threadpool throughput; overhead = ideal throughput / esg throughput).
"""

from __future__ import annotations

import argparse
import os
import random
import time
from collections.abc import Sequence

from esg_prefect.examples import demo as d

d.quiet_prefect()  # before prefect is imported: its ephemeral API on an in-memory database (see the function)

from esg_prefect.examples import catalog  # noqa: E402
from esg_prefect.examples.driver import RequestOutcome, percentile  # noqa: E402
from esg_prefect.examples.pipelines import SLO_MS  # noqa: E402
from esg_prefect.integration.stage import local_device  # noqa: E402
from esg_prefect.model.pricing import PriceSheet  # noqa: E402

WORKFLOWS = ("image", "text", "video")
HEADER = (
    f"{'runner':<11} {'conc':>4} {'req/s':>10} {'p50 ms':>9} {'p95 ms':>9} {'SLO hit':>8} {'cost/request $':>14}"
    f" {'busy $/req':>11}"
)


def process_cpu_s() -> dict[str, float]:
    """CPU seconds used so far by this process, the Prefect API server and esg-prefect's workers (Linux /proc)."""
    out = {"flows (this process)": 0.0, "Prefect API server": 0.0, "esg workers": 0.0}
    tick = os.sysconf("SC_CLK_TCK")
    me = os.getpid()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
                stat = fh.read()
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        cpu = (int(fields[11]) + int(fields[12])) / tick
        if int(pid) == me:
            out["flows (this process)"] += cpu
        elif "uvicorn" in cmd and "prefect" in cmd:
            out["Prefect API server"] += cpu
        elif "multiprocessing" in cmd and (f"{me}" in cmd or "forkserver" in cmd or "spawn_main" in cmd):
            out["esg workers"] += cpu
    return out


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}


def summarize(
    label: str, c: int, outcomes: Sequence[RequestOutcome], wall_s: float, cost: float, busy: float | None = None
) -> dict[str, float]:
    lat = [o.latency_ms for o in outcomes if o.ok]
    slo = SLO_MS
    hit = sum(1 for o in outcomes if o.ok and o.latency_ms <= slo[o.workflow]) / max(1, len(outcomes))
    row = {
        "throughput": len([o for o in outcomes if o.ok]) / wall_s,
        "p50": percentile(lat, 50),
        "p95": percentile(lat, 95),
        "slo_hit": hit,
        "cost_per_request": cost / max(1, len(outcomes)),
        "busy_per_request": (cost if busy is None else busy) / max(1, len(outcomes)),
    }
    print(
        f"{label:<11} {c:>4} {row['throughput']:10.2f} {row['p50']:9.0f} {row['p95']:9.0f} "
        f"{row['slo_hit']:8.0%} {row['cost_per_request']:14.3e} {row['busy_per_request']:11.3e}",
        flush=True,
    )
    return row


def ideal(arrivals: Sequence[tuple[float, str]], prices: PriceSheet) -> tuple[list[RequestOutcome], float, float]:
    """Every request of each workflow in batches of 8 with warm models; latency = completion time of its batch."""
    device = local_device()
    models = {n: catalog.load_pipeline(n, device) for n in WORKFLOWS}
    by_wf: dict[str, list[int]] = {n: [] for n in WORKFLOWS}
    for i, (_, wf) in enumerate(arrivals):
        by_wf[wf].append(i)
    inputs = {i: catalog.get_pipeline(wf).make_input(random.Random(i)) for i, (_, wf) in enumerate(arrivals)}
    t0 = time.perf_counter()
    outcomes = []
    for wf, idx in by_wf.items():
        for start in range(0, len(idx), 8):
            chunk = idx[start : start + 8]
            catalog.run_pipeline_direct(wf, [inputs[i] for i in chunk], batch_size=8, models=models[wf])
            end = (time.perf_counter() - t0) * 1000.0
            outcomes.extend(RequestOutcome(i, wf, 0.0, end, True) for i in chunk)
    wall = time.perf_counter() - t0
    cost = wall * d.local_price_per_s(prices)
    # Requests all "arrive" at 0 here: latency is time to completion, an upper bound for this loop.
    return outcomes, wall, cost


def slo_phase(
    rate: float, n: int, top: int, seed: int, prices: PriceSheet, vcpus: int | None = None, profile: str | None = None
) -> dict[str, dict[str, float]]:
    """Both runners on ``n`` trace arrivals at ``rate`` with at most ``top`` flow runs in flight."""
    print(f"\nSLO phase: {n} requests at {rate:.2f}/s, concurrency {top}")
    print(HEADER, flush=True)
    arrivals = d.demo_arrivals(n, rate, seed + 1, "azure_functions_2019")
    esg = d.run_esg(arrivals, max_concurrency=top, vcpus=vcpus, profile=profile)
    rows = {"esg": summarize("esg@load", top, esg.outcomes, esg.wall_s, esg.cost_total, esg.cost_busy)}
    tp = d.run_threadpool(arrivals, prices=prices, max_concurrency=top)
    rows["threadpool"] = summarize("tp@load", top, tp.outcomes, tp.wall_s, tp.cost_total)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=120, help="requests at concurrency 64 (fewer below)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument(
        "--slo-only", type=float, default=0.0, metavar="RATE", help="run only the SLO phase, at this rate (req/s)"
    )
    parser.add_argument(
        "--esg-vcpus", type=int, default=None, help="cores ESG's busy workers may use at once (default: all but one)"
    )
    parser.add_argument(
        "--profile",
        default=None,
        help="latency-profile CSV for ESG (on a GPU machine: the one `esg-prefect profile` measured there)",
    )
    args = parser.parse_args()
    if args.slo_only:
        d.warm_prefect()
        n = max(30, args.requests // 2)
        slo_phase(
            args.slo_only, n, max(args.concurrency), args.seed, PriceSheet.default(), args.esg_vcpus, args.profile
        )
        return
    d.warm_prefect()
    prices = PriceSheet.default()
    print(HEADER, flush=True)
    results: dict[tuple[str, int], dict[str, float]] = {}
    cpu: dict[tuple[str, int], dict[str, float]] = {}
    for c in args.concurrency:
        n = {1: max(12, args.requests // 8), 8: max(30, args.requests // 2)}.get(c, args.requests)
        rate = {1: 4.0, 8: 20.0}.get(c, 60.0)  # offered load well above what c flows in flight can serve
        arrivals = d.demo_arrivals(n, rate, args.seed, "azure_functions_2019")
        seen: dict[str, float] = {}
        before = process_cpu_s()
        esg = d.run_esg(
            arrivals,
            max_concurrency=c,
            before_close=lambda _pool, seen=seen: seen.update(process_cpu_s()),
            vcpus=args.esg_vcpus,
            profile=args.profile,
        )
        cpu[("esg", c)] = cpu_delta(before, seen)
        results[("esg", c)] = summarize("esg", c, esg.outcomes, esg.wall_s, esg.cost_total, esg.cost_busy)
        before = process_cpu_s()
        tp = d.run_threadpool(arrivals, prices=prices, max_concurrency=c)
        cpu[("threadpool", c)] = cpu_delta(before, process_cpu_s())
        results[("threadpool", c)] = summarize("threadpool", c, tp.outcomes, tp.wall_s, tp.cost_total)
        if c == max(args.concurrency):
            outs, wall, cost = ideal(arrivals, prices)
            results[("ideal", c)] = summarize("ideal", c, outs, wall, cost)
    # SLO phase: the same trace at a rate the thread pool sustains on average (80% of its measured
    # saturation throughput at the top concurrency), so that SLO hit rates compare service, not backlog.
    top = max(args.concurrency)
    slo_rows = slo_phase(
        0.8 * results[("threadpool", top)]["throughput"],
        max(30, args.requests // 2),
        top,
        args.seed,
        prices,
        args.esg_vcpus,
        args.profile,
    )
    print("\nwhere the CPU went (seconds, including each runner's warm-up requests):", flush=True)
    for (runner, c), parts in cpu.items():
        total = sum(parts.values())
        print(f"{runner:<11} {c:>4} total {total:6.1f}  " + "  ".join(f"{k} {v:5.1f}" for k, v in parts.items()))
    e, t, i = results[("esg", top)], results[("threadpool", top)], results[("ideal", top)]
    print(
        f"RESULT speedup_vs_threadpool_{top}={e['throughput'] / t['throughput']:.2f} "
        f"overhead_vs_ideal_{top}={i['throughput'] / e['throughput']:.2f} "
        f"slo_hit_esg_{top}={slo_rows['esg']['slo_hit']:.3f} "
        f"slo_hit_threadpool_{top}={slo_rows['threadpool']['slo_hit']:.3f}"
    )


if __name__ == "__main__":
    main()
