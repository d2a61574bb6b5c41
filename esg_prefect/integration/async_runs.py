"""Many async flow runs on one event loop: one Prefect API client for them all.

Prefect 3's async flow engine makes a new API client for every flow run (and
for every sync task a run calls), on the event loop's thread. Each client loads
the CA bundle, even for a plain-HTTP API. While one run does so, no other run on
the loop moves: runs started together reach their first stage call one after
another, and the pool runs most of those calls alone. Flow runs in threads pay
the same, but side by side. (The engine's blocking read of the server's default
result storage, once per run, stays: see docs/architecture.md.)

:func:`shared_prefect_clients` enters Prefect's own client contexts once, so
every flow run started inside it takes their clients instead of making its own
(Prefect looks in these contexts before it makes one).

Example:
    >>> async def serve(seeds):   # doctest: +SKIP
    ...     async with shared_prefect_clients():
    ...         return await asyncio.gather(*(pooled(request_seed=s) for s in seeds))
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator


@contextlib.asynccontextmanager
async def shared_prefect_clients() -> AsyncIterator[None]:
    """Within the block, the flow and task runs on this event loop share one async and one sync Prefect client.

    Enter it around the code that starts the concurrent flow runs (``asyncio.gather``, a
    web server's lifespan): runs started elsewhere, or on another loop, make their own.
    Without a ``PREFECT_API_URL``, entering it starts Prefect's temporary API if it is not
    up yet (as a first flow run would).
    """
    from prefect.context import AsyncClientContext, SyncClientContext

    # Nested inside an outer one, Prefect's get_or_create keeps the outer clients.
    with SyncClientContext.get_or_create():
        async with AsyncClientContext.get_or_create():
            yield
