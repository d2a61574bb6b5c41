"""Cypress in esg-prefect: packing batches by predicted time vs by count, in the simulator and on the runtime.

Two parts, each run twice side by side, ESG with ``size_aware`` off (the
paper's count model) and on (:mod:`esg_prefect.scheduling.packing`):

1. Simulator: the input-size case (:mod:`esg_prefect.simulator.sized`: the
   text-classification pipeline on four 8-vCPU nodes, prompt lengths of the
   Azure LLM 2023 conversation trace) at a few loads and SLOs, over seeds.
2. Runtime: the same pipeline's pooled stages (``encode -> classify_text`` of
   the example text pipeline, real torch models in local worker processes)
   fed by two in-process :class:`~esg_prefect.runtime.pool.Pool` s side by side
   (count and size-aware, each request sent to both at once: a paired
   comparison, see :func:`runtime_paired`) with requests replayed from the
   same trace: arrival times scaled to ``--rate``, texts as long as the trace's
   prompts (relative to the typical text the profile was measured with, cut at
   the tokenizer's 128 tokens). Prefect is left out on purpose: its ~0.5 CPU-s
   per request would drown the effect on 2 cores (bench/runtime_throughput.py
   measures Prefect's part).

Ends with ``RESULT sim_slo_gain=<points> sim_cost_ratio=<count/aware>
runtime_slo_gain=<points> runtime_cost_ratio=<count/aware>`` (SLO gains in
percentage points, aware minus count; cost ratios > 1 mean packing is cheaper).

Usage: ``python bench/size_aware.py [--quick] [--skip-runtime]``
"""

from __future__ import annotations

import argparse
import concurrent.futures
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from esg_prefect.examples.demo import quiet_prefect

quiet_prefect()

from esg_prefect.simulator.run import simulate  # noqa: E402
from esg_prefect.simulator.sized import sized_case  # noqa: E402
from esg_prefect.workload.arrivals import arrivals  # noqa: E402
from esg_prefect.workload.sizes import request_sizes  # noqa: E402


def sim_part(quick: bool) -> tuple[float, float]:
    """The simulator comparison; returns (mean SLO gain in points, mean cost ratio count/aware)."""
    cells = [(100.0, 150.0), (200.0, 150.0), (100.0, 200.0)] if not quick else [(100.0, 150.0)]
    seeds = (0, 1, 2) if not quick else (0,)
    duration = 60.0 if not quick else 30.0
    print("== simulator: text-classify (tokenize -> encode -> classify_text), azure_llm_conv prompt lengths")
    print(
        f"{'rate/s':>7} {'SLO ms':>7} {'seed':>4} {'model':>6} {'SLO hit':>8} {'p99 ms':>7} {'$/req':>10} {'batch':>6}"
    )
    gains, ratios = [], []
    for rate, slo in cells:
        for seed in seeds:
            out = {}
            for aware in (False, True):
                case = sized_case(aware, rate_per_s=rate, slo_ms=slo, duration_s=duration, seed=seed)
                o = simulate(case).report.overall
                out[aware] = o
                label = "size" if aware else "count"
                print(
                    f"{rate:7.0f} {slo:7.0f} {seed:4d} {label:>6} {o.slo_hit_rate:8.1%} {o.latency_p99_ms:7.0f} "
                    f"{o.cost_per_request:10.3e} {o.mean_batch_size:6.2f}",
                    flush=True,
                )
            gains.append(100.0 * (out[True].slo_hit_rate - out[False].slo_hit_rate))
            ratios.append(out[False].cost_per_request / out[True].cost_per_request)
    return statistics.fmean(gains), statistics.fmean(ratios)


def _texts(n: int, seed: int) -> list[str]:
    """``n`` texts whose lengths follow the trace's prompts, relative to the profiled typical text (~70 words)."""
    from esg_prefect.examples.models import WORDS

    rng = random.Random(f"texts:{seed}")
    out = []
    for r in request_sizes("azure_llm_conv", n, seed):
        words = max(3, min(120, round(70 * r)))
        out.append(" ".join(rng.choice(WORDS) for _ in range(words)) + ".")
    return out


def runtime_paired(rate: float, n: int, slo_ms: float, seed: int) -> dict[bool, dict[str, Any]]:
    """Replay ``n`` requests through two fresh pools side by side, count model and size-aware.

    Paired on purpose: every request goes to both pools at the same instant
    (which pool hears of it first alternates), so both see the same arrivals,
    the same texts and the same disturbances from the rest of the machine.
    Run one after the other, the two halves of a comparison differed here by
    up to 11 points of SLO hit rate from run to run at the same settings,
    more than the effect. Each pool's busy workers may use one core.

    Returns, per ``size_aware``: SLO hit rate, p50/p99 latency (ms), busy cost per request, mean batch size.
    """
    from esg_prefect.control.calls import StageCall, WorkflowDecl
    from esg_prefect.examples import pipelines, text
    from esg_prefect.model import ConfigSpace, PriceSheet
    from esg_prefect.runtime.pool import Pool
    from esg_prefect.runtime.workers import LocalProcessBackend
    from esg_prefect.scheduling import ESGSettings

    decl = WorkflowDecl("text-classify", slo_ms, (("encode", "classify_text"),))
    enc = pipelines.encode.esg_stage
    cls = pipelines.classify_text.esg_stage
    pools: dict[bool, Pool] = {}
    for aware in (False, True):
        settings = ESGSettings(config_space=ConfigSpace(vcpus=(1,), gpu_shares=(0.0,)), size_aware=aware)
        pools[aware] = Pool(
            None, PriceSheet.default(), settings=settings, backend=LocalProcessBackend(vcpus=1, spares=0)
        )
    tok = text.load_tokenize()
    # Warm both stages' workers so that cold starts are out of the comparison.
    warm = WorkflowDecl("warm-up", 60_000.0, (("encode", "classify_text"),))
    ids = text.run_tokenize(tok, ["warm up the workers."])[0]
    for pool in pools.values():
        for i in range(2):
            h = pool.submit(StageCall(f"w{i}e", "encode", enc.import_path, warm, f"w{i}", f"w{i}", ids)).result(120)
            pool.submit(StageCall(f"w{i}c", "classify_text", cls.import_path, warm, f"w{i}", f"w{i}", h.output)).result(
                120
            )
    before = {aware: pool.report() for aware, pool in pools.items()}
    docs = _texts(n, seed)
    times = [t for t, _ in arrivals("azure_llm_conv", ["text-classify"], rate, n / rate * 1.2, seed, start_s=0.0)][:n]
    lat: dict[bool, list[float]] = {False: [], True: []}
    lock = threading.Lock()
    done = threading.Event()
    left = [2 * len(times)]

    def finish(aware: bool, t0: float) -> None:
        with lock:
            lat[aware].append(time.time() * 1000.0 - t0)
            left[0] -= 1
            if left[0] == 0:
                done.set()

    def second(aware: bool, rid: str, t0: float, fut: concurrent.futures.Future[Any]) -> None:
        try:
            hidden = fut.result().output
        except Exception:
            finish(aware, t0 - 1e9)  # a failed call counts as a miss
            return
        call = StageCall(f"{rid}c", "classify_text", cls.import_path, decl, rid, rid, hidden, arrival_ms=t0)
        pools[aware].submit(call).add_done_callback(lambda _f: finish(aware, t0))

    start = time.time() + 0.5
    order = [False, True]
    for i, (t_ms, doc) in enumerate(zip(times, docs, strict=False)):
        delay = start + t_ms / 1000.0 - time.time()
        if delay > 0:
            time.sleep(delay)
        t0 = time.time() * 1000.0
        ids = text.run_tokenize(tok, [doc])[0]  # the flow's own cheap step
        rid = f"r{i}"
        order.reverse()
        for aware in order:
            call = StageCall(f"{rid}e", "encode", enc.import_path, decl, rid, rid, ids, arrival_ms=t0)
            pools[aware].submit(call).add_done_callback(
                lambda f, aware=aware, rid=rid, t0=t0: second(aware, rid, t0, f)
            )
    done.wait(600)
    out: dict[bool, dict[str, Any]] = {}
    for aware, pool in pools.items():
        after = pool.report()
        pool.close()
        got = sorted(lat[aware])
        # Cost of the measured requests: busy time of their batches (warm idle time left out: both pools keep
        # the same workers warm for the same wall time, and it would only add the same constant).
        out[aware] = {
            "hit": sum(1 for x in got if x <= slo_ms) / len(got),
            "p50": got[len(got) // 2],
            "p99": got[min(len(got) - 1, int(0.99 * len(got)))],
            "cost": (after.busy_cost - before[aware].busy_cost) / len(got),
            "batch": after.overall.mean_batch_size,
        }
    return out


def runtime_part(quick: bool, rate: float, slo_ms: float) -> tuple[float, float]:
    """The runtime comparison; returns (mean SLO gain in points, mean cost ratio count/aware)."""
    n = 120 if quick else 300
    seeds = (0,) if quick else (0, 1, 2, 3)
    print(
        f"\n== runtime: encode -> classify_text in local worker processes, {n} requests at {rate}/s, SLO {slo_ms} ms, "
        "count and size-aware pools side by side"
    )
    print(f"{'seed':>4} {'model':>6} {'SLO hit':>8} {'p50 ms':>7} {'p99 ms':>7} {'busy $/req':>11} {'batch':>6}")
    gains, ratios = [], []
    for seed in seeds:
        out = runtime_paired(rate, n, slo_ms, seed)
        for aware in (False, True):
            r = out[aware]
            label = "size" if aware else "count"
            print(
                f"{seed:4d} {label:>6} {r['hit']:8.1%} {r['p50']:7.0f} {r['p99']:7.0f} {r['cost']:11.3e} "
                f"{r['batch']:6.2f}",
                flush=True,
            )
        gains.append(100.0 * (out[True]["hit"] - out[False]["hit"]))
        ratios.append(out[False]["cost"] / out[True]["cost"])
    return statistics.fmean(gains), statistics.fmean(ratios)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one cell, one seed, fewer requests")
    ap.add_argument("--skip-runtime", action="store_true", help="the simulator part only")
    ap.add_argument("--rate", type=float, default=15.0, help="runtime requests per second (to each of the two pools)")
    ap.add_argument("--slo-ms", type=float, default=100.0, help="runtime end-to-end SLO (ms)")
    args = ap.parse_args()
    sim_gain, sim_ratio = sim_part(args.quick)
    rt_gain, rt_ratio = (float("nan"), float("nan"))
    if not args.skip_runtime:
        rt_gain, rt_ratio = runtime_part(args.quick, args.rate, args.slo_ms)
    print(
        f"RESULT sim_slo_gain={sim_gain:.2f} sim_cost_ratio={sim_ratio:.3f} "
        f"runtime_slo_gain={rt_gain:.2f} runtime_cost_ratio={rt_ratio:.3f}"
    )


if __name__ == "__main__":
    main()
