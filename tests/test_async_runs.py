"""Concurrent async flow runs on one event loop share Prefect's API clients (``shared_prefect_clients``).

Prefect's async flow engine makes a client per flow run, and per sync task a
run calls, on the loop's thread; each loads the CA bundle, so async runs
started together reached their first stage call one after another and the pool
ran most of their calls alone. These tests count the clients made, not the
time: a run inside the block makes none.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import PrefectClient, SyncPrefectClient

from esg_prefect import ESGTaskRunner, shared_prefect_clients
from esg_prefect.model import PriceSheet
from esg_prefect.runtime.pool import Pool
from esg_prefect.runtime.workers import InlineBackend
from tests.toy_stages import inc, toy_profile

pytestmark = pytest.mark.usefixtures("prefect_harness")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def clients_made(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The names of the Prefect client classes constructed from now on, in order."""
    made: list[str] = []
    for cls in (PrefectClient, SyncPrefectClient):
        original = cls.__init__

        def counting(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> None:
            made.append(type(self).__name__)
            _original(self, *args, **kwargs)

        monkeypatch.setattr(cls, "__init__", counting)
    yield made


@task(cache_policy=NO_CACHE)
def ten_times(x: int) -> int:
    """A plain sync task, as the example's tokenize: Prefect runs it on the loop's thread."""
    return 10 * x


def test_async_runs_inside_the_block_make_no_client_and_their_calls_share_a_batch(clients_made: list[str]) -> None:
    paused = Pool(toy_profile(), PriceSheet(1e-5, {}), backend=InlineBackend(vcpus=2))
    paused.pause()  # every run's call queues before any batch starts: batching does not depend on timing

    @flow(task_runner=ESGTaskRunner(pool=paused, artifacts=False, store=False))
    async def aio_flow(x: int) -> int:
        return await inc.aio(ten_times(x))

    async def runs(n: int) -> list[int]:
        started = [asyncio.ensure_future(aio_flow(x)) for x in range(n)]
        while sum(paused.snapshot().queue_depths.values()) < n:
            await asyncio.sleep(0.02)
        paused.resume()
        out = await asyncio.gather(*started)
        paused.pause()
        return out

    async def both() -> tuple[int, int, list[int]]:
        await runs(1)  # Prefect's settings and the harness's API warmed up
        before = len(clients_made)
        await runs(4)
        alone = len(clients_made) - before
        async with shared_prefect_clients():
            before = len(clients_made)
            out = await runs(4)
            shared = len(clients_made) - before
        return alone, shared, out

    try:
        alone, shared, out = asyncio.run(both())
        assert out == [10 * x + 1 for x in range(4)]
        assert alone >= 4, alone  # Prefect: at least one per run (the reason for the block)
        assert shared == 0, clients_made
        batches = paused.snapshot().batches
        assert [len(b.items) for b in batches[-1:]] == [4]
    finally:
        paused.close()


def test_the_block_nests_and_leaves_the_outer_clients() -> None:
    from prefect.context import AsyncClientContext, SyncClientContext

    async def nested() -> bool:
        async with shared_prefect_clients():
            outer = (SyncClientContext.get(), AsyncClientContext.get())
            async with shared_prefect_clients():
                inner = (SyncClientContext.get(), AsyncClientContext.get())
            after = (SyncClientContext.get(), AsyncClientContext.get())
        return outer == inner == after and None not in outer and AsyncClientContext.get() is None

    assert asyncio.run(nested())


def test_the_async_requests_script_starts_its_runs_inside_the_block(
    monkeypatch: pytest.MonkeyPatch, clients_made: list[str]
) -> None:
    """flows/async_requests.py's ``serve(3)``: its warm-up run makes its clients, the 3 runs after it none."""
    import esg_prefect.examples.pipelines as pipelines

    @flow(name="text-pipeline-async")
    async def toy_text_flow(request_seed: int) -> dict[str, str]:
        return {"text": str(ten_times(request_seed))}

    asyncio.run(toy_text_flow(request_seed=7))  # a first run warms Prefect up
    before = len(clients_made)
    asyncio.run(toy_text_flow(request_seed=7))
    one_run = len(clients_made) - before
    monkeypatch.setattr(pipelines, "async_text_flow", toy_text_flow)
    spec = importlib.util.spec_from_file_location("async_requests_script", REPO / "flows" / "async_requests.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    before = len(clients_made)
    asyncio.run(script.serve(3))
    assert one_run >= 2, one_run  # Prefect: the run's own, one to read the result storage, one for its sync task
    assert len(clients_made) - before == one_run + 2, clients_made  # the warm-up run's, and the block's two
