"""A request the server cancels at shutdown gets a 503, whichever await it was in, and loses no result.

uvicorn cancels the requests still open when its shutdown grace runs out. A
request cancelled while it waited on its call already got a 503 with
Retry-After (the client posts the call again to the restarted service); one
cancelled while its answer was being rendered (on a thread: outputs may be
large) got a 500, which the client takes for the call's failure. By then the
outcome is stored, so the retry is answered from the store: the call ran once.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import pytest

from esg_prefect.control.calls import StageCall
from esg_prefect.runtime.pool import Pool
from esg_prefect.service import app as app_module
from esg_prefect.service.app import PoolService
from esg_prefect.service.wire import call_body
from tests.toy_calls import toy_call

LOCAL = "http://127.0.0.1:4270"


class BlockingRender:
    """The service's renderer, held on an event the first ``blocked`` times: the window a cancel lands in."""

    def __init__(self, blocked: int = 1) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.blocked = blocked
        self.real = app_module._render

    def __call__(self, body: dict[str, Any]) -> bytes:
        if self.blocked > 0:
            self.blocked -= 1
            self.entered.set()
            assert self.release.wait(30), "the test never released the render"
        return self.real(body)


async def _cancelled_while_rendering(http: httpx.AsyncClient, render: BlockingRender, c: StageCall) -> httpx.Response:
    """POST ``c`` and cancel the request (as uvicorn does at shutdown) once its answer is being rendered."""
    task = asyncio.create_task(http.post("/v1/calls", json=call_body(c)))
    while not render.entered.is_set():
        await asyncio.sleep(0.01)
    task.cancel(msg="Task cancelled, timeout graceful shutdown exceeded")
    try:
        return await task  # the handler answers the cancel: the response is what the client gets
    finally:
        render.release.set()  # the render thread finishes (the loop waits for its threads when it closes)


@pytest.mark.parametrize("where", ["answer of a call it ran", "answer from the store"])
def test_a_request_cancelled_while_its_answer_renders_gets_503_and_its_retry_the_result_once(
    pool: Pool, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    c = toy_call(21)
    render = BlockingRender()

    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        service = PoolService(pool, ["tests"])
        transport = httpx.ASGITransport(app=service.app())
        async with httpx.AsyncClient(transport=transport, base_url=LOCAL) as http:
            if where == "answer from the store":
                first = await http.post("/v1/calls", json=call_body(c))  # ran and answered; its outcome stored
                assert first.status_code == 200 and first.json()["result"]["output"] == 22
            monkeypatch.setattr(app_module, "_render", render)
            cancelled = await _cancelled_while_rendering(http, render, c)
            retried = await http.post("/v1/calls", json=call_body(c))  # what the client does on a 503
        return cancelled, retried

    cancelled, retried = asyncio.run(scenario())
    assert cancelled.status_code == 503, cancelled.text
    assert 1 <= int(cancelled.headers["retry-after"]) <= 3 and "shutting down" in cancelled.text
    assert retried.status_code == 200 and retried.json()["result"]["output"] == 22
    assert len([x for x in pool.snapshot().calls if x.call_id == c.call_id]) == 1  # ran once, not again
