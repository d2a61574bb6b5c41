"""The pool service's answers while it shuts down: 503 with a jittered Retry-After, never a 500.

A caller told 503 posts its call again (to this service once it is back, or to its
successor), so a request caught by the shutdown costs a retry, not the call's failure.
:func:`retry_after` is the header of every answer that sends a caller back later
(the 429 of a full service too).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from esg_prefect.service.wire import JITTER

__all__ = ["answer_503_when_cancelled", "retry_after", "shutting_down"]


def retry_after() -> dict[str, str]:
    """A jittered Retry-After, so that rejected callers do not all come back in the same second."""
    return {"Retry-After": str(JITTER.randint(1, 3))}


def shutting_down() -> JSONResponse:
    """503 "the service is shutting down", with a Retry-After: the caller posts its call again."""
    return JSONResponse({"error": "the service is shutting down"}, status_code=503, headers=retry_after())


def answer_503_when_cancelled(
    handler: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """``handler``, answering 503 with Retry-After where uvicorn cancels it when its shutdown grace runs out.

    The cancel lands in any await (reading the body, waiting on the call, rendering its answer); uncaught,
    it is a 500 the client takes for the call's failure. On a 503 the client posts the call again; an
    outcome is stored before its answer renders, so the retry gets it from the store, not a second run
    (after a restart only with a results file: the in-memory store goes with the process).
    """

    @functools.wraps(handler)
    async def answered(request: Request) -> Response:
        try:
            return await handler(request)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            return shutting_down()

    return answered
