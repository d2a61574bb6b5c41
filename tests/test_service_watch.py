"""Long-polled calls whose callers stopped asking: one sweep withdraws them, any ask keeps them.

Times are a fake clock moved by the tests; the sweeps themselves are awaited as conditions.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
import types
from typing import Any

import pytest
from starlette.testclient import TestClient

from esg_prefect.runtime.pool import Pool
from esg_prefect.service.app import PoolService
from esg_prefect.service.watch import PollWatch
from esg_prefect.service.wire import call_body
from tests.test_service_waits import LOCAL
from tests.toy_calls import toy_call


def _wait_until(cond: Any, timeout_s: float = 60.0) -> bool:
    end = time.monotonic() + timeout_s  # a ceiling on a condition, not a wait for it
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return False


def test_one_sweep_withdraws_only_the_calls_whose_callers_stopped_asking() -> None:
    """Limits here are 3 x 1 s + 30 s = 33 s; an ask is a request coming or leaving, and one waiting keeps it."""
    now = [0.0]
    withdrawn: list[str] = []

    async def main() -> None:
        watch = PollWatch(withdrawn.append, lambda: now[0])
        for call_id in ("gone", "polled", "waiting"):
            watch.watch(call_id, 1.0)
        now[0] = 20.0
        with watch.asking("polled"):
            pass
        with watch.asking("waiting"):
            now[0] = 40.0
            assert watch.sweep() == ["gone"]
            now[0] = 100.0
            assert watch.sweep() == ["polled"]  # asked at 20: gone by 53
        assert watch.sweep() == []  # its request left at 100
        now[0] = 134.0
        assert watch.sweep() == ["waiting"]
        assert watch.sweep() == []  # withdrawn once
        with watch.asking("never watched"):  # a call posted without wait_s: left alone
            pass
        assert watch._calls == {}

    asyncio.run(main())
    assert withdrawn == ["gone", "polled", "waiting"]


def test_a_more_eager_call_wakes_the_sleeping_sweeper() -> None:
    """A sweeper sleeping for a call polled every hour looks at a call polled every 10 ms in time."""
    now = [0.0]
    withdrawn: list[str] = []

    async def main() -> None:
        watch = PollWatch(withdrawn.append, lambda: now[0])
        watch.watch("hourly", 3600.0)
        await asyncio.sleep(0)  # the sweeper starts its hour's sleep
        watch.watch("eager", 0.01)
        now[0] = 1000.0  # past the eager call's 30.03 s, far from the hourly one's 3 h
        end = time.monotonic() + 60.0  # a ceiling: without the wake it would be an hour
        while not withdrawn and time.monotonic() < end:
            await asyncio.sleep(0.01)
        watch.forget("hourly")

    asyncio.run(main())
    assert withdrawn == ["eager"]


def test_the_calls_of_a_service_are_watched_by_one_task(pool: Pool) -> None:
    service = PoolService(pool, ["tests"])
    pool.pause()
    with TestClient(service.app(), base_url=LOCAL) as client:
        for i in range(5):
            assert client.post("/v1/calls", params={"wait_s": "0.01"}, json=call_body(toy_call(i))).status_code == 202
        assert len(service._tasks) == 5  # each call's run, no watch of its own
        sweeper = service._watched._sweeper
        assert sweeper is not None and not sweeper.done() and len(service._watched._calls) == 5
        pool.resume()
        assert _wait_until(lambda: sweeper.done())  # no call left to watch: the sweeper ends
    assert service._watched._calls == {}


def test_a_caller_that_asks_again_without_wait_s_keeps_its_call(pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A POST without wait_s of a long-polled call is its caller asking, and it waits on the call until done:
    the call is not withdrawn meanwhile, however long that takes (here a fake clock jumps far past its limit)."""
    now = [0.0]
    monkeypatch.setattr("esg_prefect.service.app.time", types.SimpleNamespace(monotonic=lambda: now[0]))
    service = PoolService(pool, ["tests"])
    find = service._find

    async def find_then_jump(call_id: str) -> Any:
        got = await find(call_id)
        if call_id == "c13" and got[0] is not None:  # the second POST reached the call held: time jumps
            now[0] = 1000.0
        return got

    monkeypatch.setattr(service, "_find", find_then_jump)
    pool.pause()
    with TestClient(service.app(), base_url=LOCAL) as client:
        assert client.post("/v1/calls", params={"wait_s": "0.05"}, json=call_body(toy_call(13))).status_code == 202
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            waiting = ex.submit(client.post, "/v1/calls", json=call_body(toy_call(13)))
            assert _wait_until(lambda: now[0] == 1000.0)
            # a call posted now whose caller stops asking: its withdrawal shows that the calls were swept since
            assert client.post("/v1/calls", params={"wait_s": "0.05"}, json=call_body(toy_call(14))).status_code == 202
            now[0] = 2000.0
            assert _wait_until(lambda: "c14" not in service._inflight)
            pool.resume()
            answer = waiting.result(60).json()
    assert answer["ok"] is True and answer["result"]["output"] == 14, answer
