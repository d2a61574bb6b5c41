"""Batch sizes of the example text pipeline, N flow runs at once: sync flows in threads, or async flows on one loop.

``--mode sync`` runs ``text_flow`` in N threads; ``async`` gathers N runs of
``async_text_flow`` (stages awaited through ``.aio``) on one event loop;
``async-shared`` does so inside ``shared_prefect_clients()``. Inline backend,
Prefect's temporary API on an in-memory database, one warm-up run first.

    python bench/async_batching.py --mode async-shared --requests 20

Ends with ``RESULT mode=<m> calls=<n> batches=<b> alone=<a> sizes=<size:count,...> wall_s=<s>``
(``alone``: batches of one call; ``wall_s``: the N runs, from their start to the last one's end).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
from collections import Counter
from typing import Any


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("sync", "async", "async-shared"), required=True)
    ap.add_argument("--requests", type=int, default=20, help="flow runs at once, after one warm-up run")
    args = ap.parse_args()
    if args.requests < 1:
        ap.error(f"--requests must be at least 1, got {args.requests}")
    os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="esg-async-batching-")
    os.environ.pop("PREFECT_API_URL", None)
    from esg_prefect.integration.api_check import ephemeral_api_defaults

    ephemeral_api_defaults()  # before Prefect is imported
    from esg_prefect import ESGTaskRunner
    from esg_prefect.integration.runner import shared_pool

    pool = shared_pool(backend="inline", artifacts=False, store=False)
    runner = ESGTaskRunner(pool=pool, artifacts=False, store=False)
    try:
        wall = run(args.mode, args.requests, runner)
        batches = pool.snapshot().batches[3:]  # the warm-up run's three stage calls went alone
    finally:
        pool.close()
    sizes = Counter(len(b.items) for b in batches)
    print(
        f"RESULT mode={args.mode} calls={sum(len(b.items) for b in batches)} batches={len(batches)} "
        f"alone={sizes.get(1, 0)} sizes={','.join(f'{k}:{v}' for k, v in sorted(sizes.items()))} wall_s={wall:.2f}"
    )


def run(mode: str, n: int, runner: Any) -> float:
    """Run the warm-up run, then ``n`` runs at once; the seconds the ``n`` took."""
    import asyncio
    import concurrent.futures

    from esg_prefect import shared_prefect_clients
    from esg_prefect.examples.pipelines import async_text_flow, text_flow

    if mode == "sync":
        flow = text_flow.with_options(task_runner=runner)
        flow(request_seed=0)
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(n) as ex:
            list(ex.map(lambda s: flow(request_seed=s), range(n)))
        return time.perf_counter() - t0

    aflow = async_text_flow.with_options(task_runner=runner)

    async def runs() -> float:
        await aflow(request_seed=0)
        t0 = time.perf_counter()
        async with shared_prefect_clients() if mode == "async-shared" else contextlib.nullcontext():
            await asyncio.gather(*(aflow(request_seed=s) for s in range(n)))
        return time.perf_counter() - t0

    return asyncio.run(runs())


if __name__ == "__main__":
    main()
