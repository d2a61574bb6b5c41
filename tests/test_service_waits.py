"""Long waits through the pool service: a call still pending is told from a service that is gone.

A paused pool (maintenance) or a long queue keeps a call waiting for longer
than any fixed deadline; the service answers ``202`` while it holds the call,
and the client waits on. A client that gives up asks the service to withdraw
the call, so that it is not run and billed for nobody.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from starlette.testclient import TestClient

from esg_prefect.exceptions import PoolClosedError
from esg_prefect.model import PriceSheet
from esg_prefect.runtime import pool as pool_module
from esg_prefect.runtime.pool import Pool
from esg_prefect.runtime.workers import InlineBackend
from esg_prefect.service.app import PoolService
from esg_prefect.service.client import PoolClient
from esg_prefect.service.results import ResultCache
from esg_prefect.service.wire import call_body, call_digest, error_body
from tests.toy_calls import toy_call
from tests.toy_stages import toy_profile

LOCAL = "http://127.0.0.1:4270"


def test_a_call_held_past_wait_s_is_answered_pending_and_joined_when_asked_again(pool: Pool) -> None:
    pool.pause()
    with TestClient(PoolService(pool, ["tests"]).app(), base_url=LOCAL) as client:  # one event loop for both
        first = client.post("/v1/calls", params={"wait_s": "0.2"}, json=call_body(toy_call(1)))
        assert first.status_code == 202 and first.json() == {
            "ok": None,
            "pending": True,
            "paused": True,
            "digest": call_digest(call_body(toy_call(1))),
        }
        pool.resume()
        again = client.post("/v1/calls", params={"wait_s": "30"}, json=call_body(toy_call(1)))
        assert again.status_code == 200 and again.json()["result"]["output"] == 2
    assert len([c for c in pool.snapshot().calls if c.call_id == "c1"]) == 1  # joined, ran once


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "x", "3601"])
def test_a_bad_wait_s_is_a_400_naming_it(pool: Pool, bad: str) -> None:
    client = TestClient(PoolService(pool, ["tests"]).app(), base_url=LOCAL)
    resp = client.post("/v1/calls", params={"wait_s": bad}, json=call_body(toy_call(2)))
    assert resp.status_code == 400 and f"wait_s must be a number of seconds in (0, 3600], got {bad!r}" in resp.text
    assert pool.snapshot().calls == ()


def _client(handler: Any, deadline_s: float) -> PoolClient:
    client = PoolClient(LOCAL, deadline_s=deadline_s, threads=1, poll_s=7.0)
    client._http = httpx.Client(base_url=LOCAL, transport=httpx.MockTransport(handler))
    return client


def test_a_call_the_service_reports_pending_waits_past_the_clients_deadline() -> None:
    seen: list[httpx.Request] = []
    answers = [httpx.Response(202, json={"ok": None, "pending": True, "paused": True})] * 5

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if answers:
            time.sleep(0.03)  # five of these outlast the 0.05 s deadline: only the 202s keep the call waiting
            return answers.pop()
        return httpx.Response(200, json={"ok": True, "result": _result("c3", 4)})

    client = _client(handler, deadline_s=0.05)
    try:
        assert client.submit(toy_call(3)).result(30).output == 4
    finally:
        client.close()
    assert len(seen) == 6 and all(r.url.params["wait_s"] == "7" for r in seen)


def test_a_client_that_gives_up_asks_the_service_to_withdraw_the_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("esg_prefect.service.client.time.sleep", lambda s: None)
    cancelled = threading.Event()

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/calls/c4/cancel":
            cancelled.set()
            return httpx.Response(200, json={"ok": True})
        return httpx.Response(503, headers={"Retry-After": "0"}, json={"error": "the service is shutting down"})

    client = _client(handler, deadline_s=0.05)
    try:
        with pytest.raises(PoolClosedError, match=r"gave the call no answer for 0.05 s \(503"):
            client.submit(toy_call(4)).result(30)
        assert cancelled.wait(10)
    finally:
        client.close()


@pytest.mark.parametrize("how", ["answered", "never answered"])
def test_a_call_ended_otherwise_than_by_giving_up_sends_no_cancel(how: str) -> None:
    """A 200 answer reporting a closed pool ends the call, and a service never reached holds nothing:
    neither is told to withdraw it (only a client whose deadline passed while the service held it does)."""
    paths: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        if how == "never answered":
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(200, json=error_body(PoolClosedError("the pool closed before call 'c12' ran")))

    client = _client(handler, deadline_s=5.0)
    client._connect_grace_s = 0.0  # the first refusal gives up
    try:
        with pytest.raises(PoolClosedError):
            client.submit(toy_call(12)).result(30)
        client._executor.shutdown(wait=True)  # a cancel would have been queued behind the call: now sent
    finally:
        client.close()
    assert paths == ["/v1/calls"]


def _result(call_id: str, output: int) -> dict[str, Any]:
    return {
        "call_id": call_id,
        "output": output,
        "batch_id": "b1",
        "batch_size": 1,
        "worker_id": "w1",
        "hardware": "cpu",
        "vcpus": 1,
        "gpu_share": 0.0,
        "queue_wait_ms": 1.0,
        "predicted_ms": 2.0,
        "actual_ms": 2.0,
        "cold_start": False,
        "at_risk": False,
        "reason": "",
        "co_batched_runs": 1,
    }


def test_a_runner_with_a_service_address_takes_its_token_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from esg_prefect import ESGTaskRunner
    from esg_prefect.integration.runner import close_shared_pools

    monkeypatch.setenv("ESG_PREFECT_TOKEN", "a-token-of-thirty-two-characters")
    try:
        got = ESGTaskRunner(address=LOCAL).pool_client()
        assert isinstance(got, PoolClient)
        assert got._http.headers["Authorization"] == "Bearer a-token-of-thirty-two-characters"
        given = ESGTaskRunner(address=LOCAL, token="another-token-of-32-characters!!").pool_client()
        assert given._http.headers["Authorization"] == "Bearer another-token-of-32-characters!!"  # type: ignore[attr-defined]
    finally:
        close_shared_pools()


def _wait_until(cond: Any, timeout_s: float = 20.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return False


def test_a_call_whose_caller_stopped_asking_is_withdrawn_not_run(pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A killed client's long-polled call would run and be billed for nobody."""
    monkeypatch.setattr("esg_prefect.service.watch.ABANDONED_POLLS", 1)
    monkeypatch.setattr("esg_prefect.service.watch.ABANDON_MARGIN_S", 0.0)
    service = PoolService(pool, ["tests"])
    pool.pause()
    with TestClient(service.app(), base_url=LOCAL) as client:
        assert client.post("/v1/calls", params={"wait_s": "0.1"}, json=call_body(toy_call(5))).status_code == 202
        assert _wait_until(lambda: not service._inflight)  # no one asked again: withdrawn
    pool.resume()
    (rec,) = [c for c in pool.snapshot().calls if c.call_id == "c5"]
    assert not rec.ok and "caller stopped waiting" in rec.error
    assert pool.snapshot().batches == ()  # it never ran


def test_a_caller_that_keeps_asking_keeps_its_call(pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("esg_prefect.service.watch.ABANDON_MARGIN_S", 2.0)  # 3 x 0.2 s + 2 s without asking
    service = PoolService(pool, ["tests"])
    pool.pause()
    with TestClient(service.app(), base_url=LOCAL) as client:
        t_end = time.monotonic() + 3.0
        while time.monotonic() < t_end:  # longer than the limit, asking all along
            resp = client.post("/v1/calls", params={"wait_s": "0.2"}, json=call_body(toy_call(6)))
            assert resp.status_code == 202
        pool.resume()
        done = client.post("/v1/calls", params={"wait_s": "30"}, json=call_body(toy_call(6)))
    assert done.status_code == 200 and done.json()["result"]["output"] == 7


def test_a_pending_call_is_joined_by_id_and_digest_without_its_body(pool: Pool) -> None:
    pool.pause()
    with TestClient(PoolService(pool, ["tests"]).app(), base_url=LOCAL) as client:
        first = client.post("/v1/calls", params={"wait_s": "0.1"}, json=call_body(toy_call(7)))
        digest = first.json()["digest"]
        pending = client.get("/v1/calls/c7", params={"wait_s": "0.1", "digest": digest})
        assert pending.status_code == 202 and pending.json()["digest"] == digest
        other = client.get("/v1/calls/c7", params={"wait_s": "0.1", "digest": "0" * len(digest)})
        assert other.status_code == 409 and "was used for another call" in other.text
        assert client.get("/v1/calls/c7", params={"wait_s": "0.1"}).status_code == 400  # no digest
        unknown = client.get("/v1/calls/c99", params={"wait_s": "0.1", "digest": digest})
        assert unknown.status_code == 404 and "'c99' is not held here: post it again" in unknown.text
        pool.resume()
        done = client.get("/v1/calls/c7", params={"wait_s": "30", "digest": digest})
        assert done.status_code == 200 and done.json()["result"]["output"] == 8
        stored = client.get("/v1/calls/c7", params={"digest": digest})  # finished: from the stored outcomes
        assert stored.status_code == 200 and stored.json()["result"]["output"] == 8
    assert len([c for c in pool.snapshot().calls if c.call_id == "c7"]) == 1


def test_the_client_polls_by_id_after_a_202_and_posts_again_when_the_service_lost_the_call() -> None:
    seen: list[tuple[str, str, bytes]] = []
    answers = [
        httpx.Response(202, json={"ok": None, "pending": True, "paused": True, "digest": "d1"}),
        httpx.Response(202, json={"ok": None, "pending": True, "paused": True, "digest": "d1"}),
        httpx.Response(404, json={"error": "call 'c8' is not held here: post it again"}),  # restarted
        httpx.Response(202, json={"ok": None, "pending": True, "paused": False, "digest": "d2"}),
        httpx.Response(200, json={"ok": True, "result": _result("c8", 9)}),
    ]

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path, request.read()))
        return answers.pop(0)

    client = _client(handler, deadline_s=5.0)
    try:
        assert client.submit(toy_call(8)).result(30).output == 9
    finally:
        client.close()
    assert [(m, p) for m, p, _ in seen] == [
        ("POST", "/v1/calls"),
        ("GET", "/v1/calls/c8"),
        ("GET", "/v1/calls/c8"),
        ("POST", "/v1/calls"),
        ("GET", "/v1/calls/c8"),
    ]
    assert all(body == b"" for m, _, body in seen if m == "GET") and all(b"inc" in b for m, _, b in seen if m == "POST")


@pytest.mark.parametrize("odd_id", ["a/b", ".", "..", "x" * 201])
def test_an_id_unfit_for_a_path_keeps_posting_its_body(odd_id: str) -> None:
    """A '/' is decoded before routing and dots alone are a dot segment: no GET could name these."""
    seen: list[str] = []
    answers = [httpx.Response(202, json={"ok": None, "pending": True, "paused": True, "digest": "d"})] * 2

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.method)
        return answers.pop() if answers else httpx.Response(200, json={"ok": True, "result": _result(odd_id, 1)})

    odd = toy_call(0, call_id=odd_id, run="r")
    client = _client(handler, deadline_s=5.0)
    try:
        assert client.submit(odd).result(30).output == 1
    finally:
        client.close()
    assert seen == ["POST", "POST", "POST"]


def test_a_real_client_waits_out_a_pause_joining_by_id(pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The client against the service itself: a paused pool, then resumed; the call runs once."""
    pool.pause()
    with TestClient(PoolService(pool, ["tests"]).app(), base_url=LOCAL) as http:
        client, gets = _counting_client(http, monkeypatch, threads=1)
        fut = client.submit(toy_call(9))
        assert _wait_until(lambda: len(gets) >= 3)  # polls by id while paused
        pool.resume()
        assert fut.result(30).output == 10
        client._executor.shutdown(wait=True)
    assert len([c for c in pool.snapshot().calls if c.call_id == "c9"]) == 1
    assert set(gets) == {"/v1/calls/c9"}


class _SlowReads(ResultCache):
    """Outcomes whose second read of ``c10`` sees the store before the call's outcome is put, and returns
    after the call has left the service's calls in flight: the interleaving of a POST that comes as it finishes."""

    def __init__(self) -> None:
        super().__init__()
        self.service: PoolService | None = None
        self.put_done = threading.Event()
        self.reads = 0

    def get(self, call_id: str) -> tuple[dict[str, Any], str] | None:
        got = super().get(call_id)
        if call_id == "c10":
            self.reads += 1
        if call_id == "c10" and got is None and self.reads == 2:  # the first read is the first POST's
            assert self.put_done.wait(30) and _wait_until(lambda: "c10" not in self.service._inflight)  # type: ignore[union-attr]
        return got

    def put(self, call_id: str, body: dict[str, Any], digest: str = "") -> None:
        super().put(call_id, body, digest)
        if call_id == "c10":
            self.put_done.set()


def test_a_post_that_comes_as_its_call_finishes_joins_it_not_runs_it_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The call is looked up in flight before in the stored outcomes: it stores its outcome before it leaves."""
    monkeypatch.setattr(pool_module, "_DONE_MEMORY", 0)  # the pool's own memory of ids would hide a second run
    p = Pool(toy_profile(), PriceSheet(1e-5, {}), backend=InlineBackend())
    results = _SlowReads()
    service = PoolService(p, ["tests"], results=results)
    results.service = service
    try:
        p.pause()
        with TestClient(service.app(), base_url=LOCAL) as client:
            assert client.post("/v1/calls", params={"wait_s": "0.05"}, json=call_body(toy_call(10))).status_code == 202
            watched = service._watched._calls["c10"]
            with concurrent.futures.ThreadPoolExecutor(1) as ex:
                again = ex.submit(client.post, "/v1/calls", params={"wait_s": "30"}, json=call_body(toy_call(10)))
                assert _wait_until(lambda: results.reads == 2 or watched.waiting > 0)  # it came
                p.resume()
                assert again.result(30).json()["result"]["output"] == 11
        assert len([c for c in p.snapshot().calls if c.call_id == "c10"]) == 1  # ran once
    finally:
        p.close()


def test_any_other_id_is_joined_by_a_get_of_its_percent_encoded_path(
    pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ids of flow runs' calls (``<task run id>:<attempt>``) too: polls do not post the body again, and
    a full service (429 to every new POST) cannot refuse the polls of the calls it holds."""
    ids = ["0b7e2c4a-5d0f-4b4e-9a51-3c2f1d0e9b8a:1", "a b", "50%", "x?y#z", "é"]
    pool.pause()
    with TestClient(PoolService(pool, ["tests"], max_pending=len(ids)).app(), base_url=LOCAL) as http:
        client, gets = _counting_client(http, monkeypatch, threads=len(ids))
        futs = [client.submit(toy_call(i, call_id=cid)) for i, cid in enumerate(ids)]
        assert _wait_until(lambda: all(gets.count(f"/v1/calls/{quote(cid, safe='')}") >= 2 for cid in ids))
        pool.resume()
        assert [f.result(30).output for f in futs] == [1, 2, 3, 4, 5]
        client._executor.shutdown(wait=True)
    assert sorted(c.call_id for c in pool.snapshot().calls) == sorted(ids)  # each ran once


def test_a_cancel_names_its_call_percent_encoded() -> None:
    paths: list[bytes] = []
    done = threading.Event()

    def handler(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.raw_path)
        done.set()
        return httpx.Response(200, json={"ok": True})

    client = _client(handler, deadline_s=5.0)
    try:
        client.cancel("0b7e2c4a:1 x")
        assert done.wait(10)
    finally:
        client.close()
    assert paths == [b"/v1/calls/0b7e2c4a%3A1%20x/cancel"]


@pytest.mark.parametrize("bad", [0, -1.0, 3601, float("nan"), True, "50"])
def test_a_bad_poll_s_is_refused_when_the_client_is_made(bad: object) -> None:
    from esg_prefect.exceptions import InvalidInputError
    from esg_prefect.service import app, client

    assert client.MAX_POLL_S == app.MAX_WAIT_S  # what the service accepts as wait_s
    with pytest.raises(InvalidInputError, match=r"poll_s must be a number of seconds in \(0, 3600\], got "):
        PoolClient(LOCAL, poll_s=bad)  # type: ignore[arg-type]


def test_a_call_posted_to_wait_and_then_polled_leaves_nothing_behind(pool: Pool) -> None:
    """A caller that posted without wait_s and polled with it: the call is not watched (its first request
    waits on it), and nothing of it is left behind."""
    service = PoolService(pool, ["tests"])
    pool.pause()
    with TestClient(service.app(), base_url=LOCAL) as client:
        digest = call_digest(call_body(toy_call(11)))
        blocking = threading.Thread(target=client.post, args=("/v1/calls",), kwargs={"json": call_body(toy_call(11))})
        blocking.start()
        assert _wait_until(lambda: "c11" in service._inflight)
        polled = client.get("/v1/calls/c11", params={"wait_s": "0.05", "digest": digest})
        assert polled.status_code == 202 and "c11" not in service._watched._calls
        pool.resume()
        blocking.join(30)
        assert _wait_until(lambda: not service._inflight)
    assert service._watched._calls == {}


def _counting_client(http: TestClient, monkeypatch: pytest.MonkeyPatch, threads: int) -> tuple[PoolClient, list[str]]:
    """A client polling every 50 ms through ``http`` (the service itself), and the paths of its GETs."""
    client = PoolClient(LOCAL, deadline_s=30.0, threads=threads, poll_s=0.05)
    client._http = http
    gets: list[str] = []
    get = http.get

    def counted(url: Any, **kwargs: Any) -> httpx.Response:
        gets.append(str(url))
        return get(url, **kwargs)

    monkeypatch.setattr(http, "get", counted)
    return client, gets


def test_a_call_held_when_the_server_stops_is_answered_503_so_its_caller_posts_it_again(pool: Pool) -> None:
    """uvicorn cancels the requests still waiting when its shutdown grace runs out (Ctrl-C on a paused
    pool, a long queue): the held call gets a 503 with Retry-After, which the client retries against the
    restarted service, not a 500 that fails the flow run."""
    import asyncio
    import json

    pool.pause()
    body = json.dumps(call_body(toy_call(7))).encode()
    sent: list[dict[str, Any]] = []

    async def serve_then_stop() -> None:
        service = PoolService(pool, ["tests"])
        app = service.app()
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
            "scheme": "http", "path": "/v1/calls", "raw_path": b"/v1/calls", "query_string": b"wait_s=30",
            "root_path": "", "headers": [(b"host", b"127.0.0.1:4270"), (b"content-type", b"application/json")],
            "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 4270),
        }  # fmt: skip
        chunks = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, Any]:
            if chunks:
                return chunks.pop()
            await asyncio.Event().wait()  # the client stays connected
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        task = asyncio.create_task(app(scope, receive, send))
        while "c7" not in service._inflight:  # accepted, held by the paused pool
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # the handler is waiting on the call
        task.cancel(msg="Task cancelled, timeout graceful shutdown exceeded")  # as uvicorn does
        await task

    asyncio.run(serve_then_stop())
    start = next(m for m in sent if m["type"] == "http.response.start")
    headers = dict(start["headers"])
    assert start["status"] == 503 and b"retry-after" in headers
    assert b"shutting down" in b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def test_a_service_that_dropped_a_held_call_is_waited_for_as_one_that_answered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A service killed (SIGKILL) while it held a client's first calls never answered that client, but
    it took them: the client waits for its restart to the deadline, not only the grace for a wrong
    address, and its calls are not failed as if no service had ever been started."""
    import esg_prefect.service.client as client_module

    clock = [1000.0]  # the client's monotonic clock: the first request is held 2 s before it drops
    monkeypatch.setattr(client_module.time, "monotonic", lambda: clock[0])
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        if len(seen) == 1:  # accepted and held, then the service died
            clock[0] += client_module.HELD_S + 1.0
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)
        if len(seen) < 4:  # down until it restarts
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(200, json={"ok": True, "result": _result("c13", 14)})

    client = _client(handler, deadline_s=30.0)
    client._connect_grace_s = 0.0  # a refusal from a service never reached gives up at once
    try:
        assert client.submit(toy_call(13)).result(60).output == 14
    finally:
        client.close()
    assert len(seen) == 4


def test_a_listener_that_drops_every_request_at_once_is_a_wrong_address(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrong port whose listener closes each connection (or ``http://`` to a TLS service) dropped the first
    request at once; that was read as a service that took the call, and the client waited its whole deadline
    (600 s by default) before failing, with no word of the address. It now gets the grace of an address no
    service answers at, and the hint."""
    import esg_prefect.service.client as client_module
    from esg_prefect.exceptions import PoolClosedError

    monkeypatch.setattr(client_module.time, "monotonic", lambda: 1000.0)  # no request is held for any time

    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)

    client = _client(handler, deadline_s=600.0)
    client._connect_grace_s = 0.0
    try:
        with pytest.raises(
            PoolClosedError, match=r"no pool service answers at .*RemoteProtocolError.*check the address"
        ):
            client.submit(toy_call(14)).result(60)
    finally:
        client.close()
    assert not client._answered


def test_the_first_ctrl_c_says_what_becomes_of_the_calls_in_flight(capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C on `pool serve` was silent for the shutdown grace, then logged only uvicorn's 'Cancel N
    running task(s)': the first one now says how many calls are in flight and what their callers do."""
    import signal

    import uvicorn

    from esg_prefect.cli.pool import SHUTDOWN_GRACE_S, announcing_server

    in_flight = [3]
    server = announcing_server(uvicorn.Config(lambda *a: None), lambda: in_flight[0])
    server.handle_exit(signal.SIGINT, None)
    err = capsys.readouterr().err
    assert f"stopping: 3 calls in flight; a request open gets its answer within {SHUTDOWN_GRACE_S} s or a 503" in err
    assert "Ctrl-C again to stop at once" in err and server.should_exit
    server.handle_exit(signal.SIGINT, None)  # the second: uvicorn stops at once, nothing more is said
    assert capsys.readouterr().err == "" and server.force_exit
    in_flight[0] = 0
    announcing_server(uvicorn.Config(lambda *a: None), lambda: in_flight[0]).handle_exit(signal.SIGTERM, None)
    assert capsys.readouterr().err.strip() == "stopping: no calls in flight"
