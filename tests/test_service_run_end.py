"""A flow run's end reaches the pool service through a restart, a shutdown or a busy spell, within a bound.

Only the end closes a run in the service (its cost row finished, its artifacts
published, its records released), so the client posts it again on a refused
connection, a timeout, ``429`` or ``503``, as it does a call, for up to
``END_DEADLINE_S``. The waits go through a fake (no test sleeps); the service's
answers come from ``httpx.MockTransport``, forwarded to a real service where the
end must close a run.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import httpx
import pytest
from starlette.testclient import TestClient

import esg_prefect.service.client as client_module
from esg_prefect.control.records import RunRecords
from esg_prefect.runtime.pool import Pool
from esg_prefect.service.app import PoolService
from esg_prefect.service.client import END_DEADLINE_S, JITTER_MAX, MAX_BACKOFF_S, PoolClient
from tests.toy_calls import toy_call

LOCAL = "http://127.0.0.1:4270"
END = "/v1/runs/r1/end"


class FakeWait(threading.Event):
    """The client's stop event, whose timed waits return at once and advance ``clock`` by the time asked."""

    def __init__(self, clock: list[float]) -> None:
        super().__init__()
        self.clock = clock
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is not None:
            self.waits.append(timeout)
            self.clock[0] += timeout
        return self.is_set()


def _client(handler: Callable[[httpx.Request], httpx.Response], deadline_s: float = 600.0) -> PoolClient:
    client = PoolClient(LOCAL, deadline_s=deadline_s, threads=2, poll_s=7.0)
    client._http = httpx.Client(base_url=LOCAL, transport=httpx.MockTransport(handler))
    return client


def _ended(client: PoolClient) -> None:
    """Wait for the client's background posts (the end, with its retries) to finish."""
    client._executor.shutdown(wait=True)


def _end_on(client: PoolClient, clock: list[float]) -> None:
    """End run r1 through a client the service has answered before, its waits on ``clock``; wait for the posts."""
    client._answered = True
    client._stop = FakeWait(clock)
    try:
        client.end_run("r1")
        _ended(client)
    finally:
        client.close()


def _lost(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "end of flow run" in r.message]


def test_an_end_met_by_a_refused_connection_then_a_503_closes_the_run_once_the_service_answers(
    pool: Pool, caplog: pytest.LogCaptureFixture
) -> None:
    """The end was posted once and dropped on any error: the run stayed open in the service, unpublished.

    Now it is posted again after a refused connection (a service restarting) and a ``503`` (one
    shutting down), honouring its ``Retry-After``; an end whose answer is lost reaches the service
    twice, and the run is still handed to its run listeners once.
    """
    ended: list[RunRecords] = []
    pool.add_run_listener(ended.append)
    with TestClient(PoolService(pool, ["tests"]).app(), base_url=LOCAL) as http:
        ends: list[str] = []

        def handler(request: httpx.Request) -> httpx.Response:
            if request.url.path == END:
                ends.append(request.url.path)
                if len(ends) == 1:
                    raise httpx.ConnectError("connection refused", request=request)
                if len(ends) == 2:
                    return httpx.Response(503, headers={"Retry-After": "2"}, json={"error": "shutting down"})
            got = http.request(request.method, request.url.path, params=request.url.params, content=request.content)
            if len(ends) == 3:  # the service ended the run; its answer is lost on the way back
                raise httpx.ReadError("connection reset", request=request)
            return httpx.Response(got.status_code, content=got.content, headers={"Content-Type": "application/json"})

        client = _client(handler)
        client._stop = FakeWait([0.0])
        try:
            assert client.submit(toy_call(1)).result(30).output == 2
            client.end_run("r1")
            _ended(client)
        finally:
            client.close()
    pool.close()  # hands every ended run to the listeners and waits for them
    assert len(ends) == 4
    waits = client._stop.waits  # type: ignore[attr-defined]
    assert len(waits) == 3 and 0.2 <= waits[0] <= 0.3 and 2.0 <= waits[1] <= 3.0 and 4.0 <= waits[2] <= 6.0
    assert [r.run_id for r in ended] == ["r1"] and len(ended[0].calls) == 1
    assert _lost(caplog) == []


@pytest.mark.parametrize(("deadline_s", "bound"), [(600.0, END_DEADLINE_S), (5.0, 5.0)])
def test_an_end_never_answered_gives_up_after_its_bound_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, deadline_s: float, bound: float
) -> None:
    """A service gone for good holds the end (and the flow process's exit) for the bound, not ``deadline_s``."""
    clock = [1000.0]
    monkeypatch.setattr(client_module.time, "monotonic", lambda: clock[0])
    posts: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        posts.append(clock[0])
        raise httpx.ConnectError("connection refused", request=request)

    _end_on(_client(handler, deadline_s), clock)  # the service served the run's calls, then went
    span = posts[-1] - posts[0]  # it gives up when the next wait (at most 5 s, jittered by half) would pass the bound
    assert len(posts) > 3 and bound - MAX_BACKOFF_S * JITTER_MAX < span <= bound
    assert _lost(caplog) == [
        f"the end of flow run r1 did not reach the pool service at {LOCAL} (no answer for {bound:g} s; "
        "last: ConnectError: connection refused): the run is not published"
    ]


def test_a_retry_after_of_zero_still_backs_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """A proxy's ``Retry-After: 0`` made every later wait 0 (the backoff doubles the last one): the end was
    posted in a busy loop until its bound, thousands of times a second."""
    clock = [1000.0]
    monkeypatch.setattr(client_module.time, "monotonic", lambda: clock[0])
    posts: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        posts.append(clock[0])
        if len(posts) == 1:
            return httpx.Response(503, headers={"Retry-After": "0"}, json={"error": "shutting down"})
        if len(posts) > 100:  # the busy loop: its fake clock never moves, so end it here
            client._stop.set()
        raise httpx.ConnectError("connection refused", request=request)

    client = _client(handler)
    _end_on(client, clock)
    assert 5 < len(posts) < 20  # 0.2 s doubling to 5 s over the 30 s bound


def test_close_stops_a_retrying_end_at_once(caplog: pytest.LogCaptureFixture) -> None:
    """An end waiting out a busy service's ``Retry-After`` (15 s) stops when the client closes, with a warning."""
    posted = threading.Event()

    def handler(request: httpx.Request) -> httpx.Response:
        posted.set()
        return httpx.Response(429, headers={"Retry-After": "15"}, json={"error": "busy"})

    client = _client(handler)
    client._answered = True
    client.end_run("r1")
    assert posted.wait(30)
    client.close()
    joined = threading.Thread(target=_ended, args=(client,))
    joined.start()
    joined.join(10)  # the retry's wait ends at the close, not after its 15 s or more
    assert not joined.is_alive()
    (lost,) = _lost(caplog)
    assert "flow run r1" in lost and LOCAL in lost and "the client closed while retrying; last: 429" in lost


@pytest.mark.parametrize("status", [401, 404])
def test_an_end_refused_for_good_is_not_posted_again(caplog: pytest.LogCaptureFixture, status: int) -> None:
    """A wrong token or a service without the route answers the same each time: one post, one warning."""
    posts: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        posts.append(request.url.path)
        return httpx.Response(status, json={"error": "no"})

    client = _client(handler)
    client._answered = True
    try:
        client.end_run("r1")
        _ended(client)
    finally:
        client.close()
    assert posts == [END]
    (lost,) = _lost(caplog)
    assert f"it answered {status}" in lost and "r1" in lost


def test_the_end_to_a_service_that_never_answered_this_client_is_posted_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """None of the run's calls reached such a service (not started, a wrong address): no run to close, no wait."""
    posts: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        posts.append(request.url.path)
        raise httpx.ConnectError("connection refused", request=request)

    client = _client(handler)
    try:
        client.end_run("r1")
        _ended(client)
    finally:
        client.close()
    assert posts == [END] and _lost(caplog) == []


def test_a_run_id_travels_percent_encoded_and_one_no_path_can_name_is_warned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A caller's own run id with a space or a ``?`` went into the path as it was: the service saw another
    path (or a query), and the run never ended."""
    raw: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        raw.append(request.url.raw_path)
        return httpx.Response(200, json={})

    client = _client(handler)
    client._answered = True
    try:
        client.end_run("batch 7?x")
        client.end_run("a/b")
        _ended(client)
    finally:
        client.close()
    assert raw == [b"/v1/runs/batch%207%3Fx/end"]
    (lost,) = _lost(caplog)
    assert "flow run a/b" in lost and "no URL path segment can name this run id" in lost
