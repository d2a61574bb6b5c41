"""Serve requests from async code: many async flow runs on one event loop, their stage calls pooled.

Each model stage is awaited through its ``.aio`` twin (``await encode.aio(tokens)``), so
while one run waits for its batch the loop runs the others, and their calls are batched
together. The runs share Prefect's API clients (``shared_prefect_clients``): each
run would otherwise make its own on the loop's thread, holding the other runs back
so that their calls reach the pool apart. A web handler that awaits a flow per
request works the same way, with the block around the server's lifespan.

    python flows/async_requests.py --requests 24
"""

from __future__ import annotations

import asyncio

from esg_prefect.integration.api_check import script_requests


async def serve(requests: int) -> None:
    from esg_prefect import ESGTaskRunner, shared_prefect_clients
    from esg_prefect.examples.pipelines import async_text_flow

    pooled = async_text_flow.with_options(task_runner=ESGTaskRunner())
    await pooled(request_seed=0)  # one run first: concurrent first runs would race to start Prefect's ephemeral API
    async with shared_prefect_clients():  # one client for all runs: making one per run stalls the loop
        outs = await asyncio.gather(*(pooled(request_seed=s) for s in range(requests)))
    for i, out in enumerate(outs):
        print(i, out["text"][:60])


def main() -> None:
    requests = script_requests(24, __doc__)
    asyncio.run(serve(requests))


if __name__ == "__main__":
    main()
