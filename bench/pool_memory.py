"""A long-lived pool's memory and speed: RSS, records kept and time per chunk of calls served.

Each call is its own flow run (one call of the toy stage 'inc', then ``end_run``),
32 at a time, on the inline backend. A pool that keeps every record grows by
about 1.4 KB a call and slows down as its run ends scan what it holds; a bounded
one levels off. ``--memory`` sets the records kept (``RECORD_MEMORY``), small so
that the plateau shows within a minute.

    python bench/pool_memory.py --calls 70000 --memory 500

Ends with ``RESULT rss_growth_kb_per_call_second_half=<x> chunk_time_ratio_last_over_first=<y>``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gc
import time
from pathlib import Path


def rss_mb() -> float:
    """This process's resident memory (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=70_000, help="calls served in all")
    ap.add_argument("--chunk", type=int, default=5_000, help="calls between two readings")
    ap.add_argument("--memory", type=int, default=500, help="records the pool keeps (RECORD_MEMORY)")
    args = ap.parse_args()

    import esg_prefect.runtime.pool as pool_module

    pool_module.RECORD_MEMORY = args.memory
    from esg_prefect.control.calls import StageCall, WorkflowDecl
    from esg_prefect.model import PriceSheet
    from esg_prefect.runtime.workers import InlineBackend
    from tests.toy_stages import toy_profile

    toy = WorkflowDecl("toy", 800, (("double", "inc"),))
    pool = pool_module.Pool(toy_profile(), PriceSheet(1e-5, {}), backend=InlineBackend(vcpus=2))

    def one(i: int) -> None:
        pool.submit(StageCall(f"c{i}", "inc", "tests.toy_stages:inc", toy, f"r{i}", f"r{i}", i % 20)).result(60)
        pool.end_run(f"r{i}")

    readings: list[tuple[int, float, float]] = []  # (calls, RSS MB, seconds for the chunk)
    done = 0
    try:
        with concurrent.futures.ThreadPoolExecutor(32) as ex:
            while done < args.calls:
                t0 = time.perf_counter()
                list(ex.map(one, range(done, done + args.chunk)))
                done += args.chunk
                spent = time.perf_counter() - t0
                gc.collect()
                t1 = time.perf_counter()
                snap = pool.snapshot()
                snap_ms = (time.perf_counter() - t1) * 1000
                readings.append((done, rss_mb(), spent))
                print(
                    f"{done} calls: RSS {readings[-1][1]:.0f} MB, kept {len(snap.calls)} calls, "
                    f"{len(snap.requests)} requests, {len(snap.batches)} batches; snapshot {snap_ms:.0f} ms; "
                    f"{spent:.2f} s for the chunk",
                    flush=True,
                )
    finally:
        pool.close()
    half = readings[len(readings) // 2]
    growth = (readings[-1][1] - half[1]) * 1024 / max(1, readings[-1][0] - half[0])
    print(
        f"RESULT rss_growth_kb_per_call_second_half={growth:.3f} "
        f"chunk_time_ratio_last_over_first={readings[-1][2] / readings[0][2]:.2f}"
    )


if __name__ == "__main__":
    main()
