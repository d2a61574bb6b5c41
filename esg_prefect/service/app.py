"""The pool service: an ASGI app (starlette, which Prefect ships) around one :class:`Pool`.

Endpoints:

* ``POST /v1/calls[?wait_s=S]``: one stage call (JSON, see :mod:`esg_prefect.service.wire`); the
  response comes when the call is done: ``{"ok": true, "result": ...}`` or
  ``{"ok": false, "error": {"type", "message", "traceback"}}``; with ``wait_s``, after at most
  that many seconds: ``202 {"pending": true, "paused": ..., "digest": ...}`` while it is queued or
  running, so a long wait (a paused pool) is told from a dead service; a call whose caller stops
  asking is withdrawn if still queued (:mod:`esg_prefect.service.watch`).
* ``GET /v1/calls/{call_id}?digest=D[&wait_s=S]``: join a call posted before, without sending its
  body again (``D`` is the ``digest`` of its ``202``): its outcome, ``202`` again, ``409`` for
  another call's digest, or ``404`` when the service does not hold it (restarted, or withdrawn):
  the caller then posts it again.
* ``POST /v1/runs/{run_id}/end``: a flow run finished.
* ``POST /v1/calls/{call_id}/cancel``: its caller stopped waiting; withdrawn if still queued.
* ``GET /healthz``: liveness (no token needed; says nothing about the work).
* ``GET /metrics``: queue depths, batch sizes, worker shares, decision times and the running
  totals (batches, calls, the bill so far), as JSON; in the
  Prometheus text or OpenMetrics format when the
  ``Accept`` header prefers ``text/plain`` or ``application/openmetrics-text``, or with
  ``?format=prometheus`` (:mod:`esg_prefect.service.prometheus`; ``?format=json`` forces JSON).
* ``GET /v1/batches?limit=N``: recent batches and the runs each served.
* ``POST /v1/pause`` / ``POST /v1/resume``: hold dispatching (calls keep queueing,
  none is failed) and release it (:meth:`Pool.pause`); ``/metrics`` says ``paused``.

Security (:mod:`esg_prefect.service.guards`): the service binds 127.0.0.1
unless told otherwise, and then needs a token; with one, every endpoint but
``/healthz`` checks ``Authorization: Bearer <token>`` in constant time; without
one, requests from web pages and to foreign host names are refused. Stage code
is imported only from the module prefixes allowed at start, and a call's stage
path must resolve to a stage of the call's name. Bodies are size-bounded while
they stream in, and all bodies being read or decoded at once share a byte
budget (past it: 429); they are decoded off the event loop, so a large one
holds no other request up. Nothing is unpickled.

Idempotency: a call id already finished gets its stored outcome
(:class:`~esg_prefect.service.results.ResultCache`, kept across restarts with a
file); one in flight is joined; either way only if it is the same call (its
digest), else 409. Backpressure: past ``max_pending`` calls in flight, new calls
get ``429`` with a jittered ``Retry-After``; while closing, or cancelled at shutdown, ``503``
(:mod:`esg_prefect.service.shutdown`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from esg_prefect.control.calls import StageCall
from esg_prefect.exceptions import (
    CallConflictError,
    InvalidInputError,
    PoolClosedError,
    StageCallError,
    UnknownStageError,
)
from esg_prefect.runtime.pool import Pool
from esg_prefect.runtime.stages import resolve_stage
from esg_prefect.service.codec import CodecError
from esg_prefect.service.guards import BearerAuth, BrowserGuard, check_bind, check_token
from esg_prefect.service.prometheus import negotiate, pool_registry, render, totals_body
from esg_prefect.service.results import ResultCache
from esg_prefect.service.shutdown import answer_503_when_cancelled, retry_after, shutting_down
from esg_prefect.service.watch import PollWatch
from esg_prefect.service.wire import (
    MAX_WAIT_S,
    BadRequest,
    call_digest,
    error_body,
    parse_call,
    result_body,
)

__all__ = ["BadRequest", "PoolService", "check_bind", "check_token", "parse_call"]

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024 * 1024
MAX_BATCHES_LIMIT = 10_000
METRICS_WINDOW = 1000  # /metrics reads the newest this many batches and decisions


class PoolService:
    """One pool behind HTTP.

    Args:
        pool: the pool that owns queues, scheduler and workers.
        allow: module prefixes stage code may be imported from.
        token: bearer token (:func:`check_token`); required by :func:`check_bind` off loopback.
        results: where finished outcomes are kept (in memory by default, bounded).
        max_pending: most calls in flight before new ones get 429.
        max_body_bytes: largest request body accepted.
        max_reading_bytes: most bytes of bodies read or decoded at once (default
            four of the largest); a body past it gets 429.
        on_call: called with each accepted call before it is submitted (the CLI
            notes the call's deployment there, for the cost store).
    """

    def __init__(
        self,
        pool: Pool,
        allow: Sequence[str],
        token: str | None = None,
        results: ResultCache | None = None,
        max_pending: int = 10_000,
        max_body_bytes: int = MAX_BODY_BYTES,
        on_call: Callable[[StageCall], None] | None = None,
        max_reading_bytes: int | None = None,
    ) -> None:
        if not allow:
            raise InvalidInputError("allow must name at least one module prefix stage code may come from")
        check_token(token)
        self.pool = pool
        self.allow = tuple(allow)
        self._token = token.encode() if token else None
        self.results = results or ResultCache()
        self.max_pending = max_pending
        self.max_body_bytes = max_body_bytes
        self.max_reading_bytes = 4 * max_body_bytes if max_reading_bytes is None else max_reading_bytes
        self._reading = 0  # bytes of bodies being read or decoded now
        self.on_call = on_call
        self._inflight: dict[str, tuple[asyncio.Future[dict[str, Any]], str]] = {}
        self._watched = PollWatch(pool.cancel, time.monotonic)  # calls posted with wait_s
        self._stage_names: dict[str, str] = {}  # stage path -> the name of the stage it resolves to
        self._tasks: set[asyncio.Task[Any]] = set()
        self.closing = False
        self.registry = pool_registry(pool, lambda: self.calls_in_flight, self.results.stored_bytes)

    @property
    def calls_in_flight(self) -> int:
        """Calls accepted and not yet answered (queued or running)."""
        return len(self._inflight)

    def app(self) -> ASGIApp:
        """The ASGI application."""
        app = Starlette(
            routes=[
                Route("/healthz", self.healthz, methods=["GET"]),
                Route("/metrics", self.metrics, methods=["GET"]),
                Route("/v1/calls", answer_503_when_cancelled(self.call), methods=["POST"]),
                Route("/v1/calls/{call_id}", answer_503_when_cancelled(self.join), methods=["GET"]),
                Route("/v1/runs/{run_id}/end", self.end_run, methods=["POST"]),
                Route("/v1/calls/{call_id}/cancel", self.cancel, methods=["POST"]),
                Route("/v1/batches", self.batches, methods=["GET"]),
                Route("/v1/pause", self.pause, methods=["POST"]),
                Route("/v1/resume", self.resume, methods=["POST"]),
            ]
        )
        return BearerAuth(app, self._token) if self._token is not None else BrowserGuard(app)

    async def healthz(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "closing" if self.closing else "ok"})

    async def metrics(self, request: Request) -> Response:
        try:
            accept = negotiate(request.headers.get("accept"), request.query_params.get("format"))
        except BadRequest as exc:
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        if accept is not None:
            text, content_type = await asyncio.to_thread(render, self.registry, accept)
            return Response(text, headers={"Content-Type": content_type, "Vary": "Accept"})
        snap = await asyncio.to_thread(self.pool.snapshot, 30.0, METRICS_WINDOW)
        times = sorted(d.decision_ms for d in snap.decisions if d.decision_ms is not None)
        sizes = [len(b.items) for b in snap.batches]
        return JSONResponse(
            {
                "queue_depths": snap.queue_depths,
                "paused": self.pool.paused,
                "calls_in_flight": self.calls_in_flight,
                "stored_result_bytes": self.results.stored_bytes(),
                "workers": [dataclasses.asdict(w) for w in snap.workers],
                "profile_corrections": [dataclasses.asdict(c) for c in snap.corrections],
                "totals": totals_body(snap, self.pool.prices),
                "recent_batches": len(sizes),
                "mean_batch_size": sum(sizes) / len(sizes) if sizes else 0.0,
                "decision_ms_p50": times[len(times) // 2] if times else None,
                "decision_ms_p99": times[min(len(times) - 1, int(0.99 * len(times)))] if times else None,
            },
            headers={"Vary": "Accept"},
        )

    async def batches(self, request: Request) -> JSONResponse:
        """The most recent batches (``?limit=N``, 1 to 10,000, default 100): size, worker, the runs they served."""
        raw = request.query_params.get("limit", "100")
        try:
            limit = int(raw)
        except ValueError:
            limit = 0
        if not 1 <= limit <= MAX_BATCHES_LIMIT:
            return JSONResponse({"error": f"limit must be an integer 1..{MAX_BATCHES_LIMIT}, got {raw!r}"}, 400)
        snap = await asyncio.to_thread(self.pool.snapshot, 30.0, limit)
        rows = [
            {
                "batch_id": b.batch_id,
                "worker_id": b.worker_id,
                "size": len(b.items),
                "runs": sorted({i.run_id for i in b.items}),
                "start_ms": b.start_ms,
                "end_ms": b.end_ms,
            }
            for b in snap.batches
        ]
        return JSONResponse({"batches": rows})

    async def pause(self, request: Request) -> JSONResponse:
        """Hold dispatching until ``/v1/resume``; calls keep being accepted and queue."""
        return await self._hold(True)

    async def resume(self, request: Request) -> JSONResponse:
        """Release a pause: everything that queued meanwhile is scheduled at once."""
        return await self._hold(False)

    async def _hold(self, paused: bool) -> JSONResponse:
        if self.closing:
            return shutting_down()
        await asyncio.to_thread(self.pool.pause if paused else self.pool.resume)
        return JSONResponse({"paused": paused})

    async def cancel(self, request: Request) -> JSONResponse:
        """The caller of a call stopped waiting (its task timed out): withdrawn if still queued."""
        self.pool.cancel(request.path_params["call_id"])
        return JSONResponse({"ok": True})

    async def end_run(self, request: Request) -> JSONResponse:
        self.pool.end_run(request.path_params["run_id"])
        return JSONResponse({"ok": True})

    def _take(self, nbytes: int) -> None:
        """Count ``nbytes`` more of bodies in hand, or refuse (429) past the budget."""
        if self._reading + nbytes > self.max_reading_bytes:
            raise BadRequest(429, f"{self._reading} bytes of other bodies are being read: retry later")
        self._reading += nbytes

    async def _read_body(self, request: Request) -> tuple[bytes, int]:
        """The body and the bytes it holds of the budget, refused (413) as soon as it passes the limit."""
        declared = request.headers.get("content-length")
        held = 0
        try:
            if declared is not None:
                if not declared.isdigit():
                    raise BadRequest(400, f"bad Content-Length {declared!r}")
                if int(declared) > self.max_body_bytes:
                    raise BadRequest(413, f"body of {declared} bytes exceeds {self.max_body_bytes}")
                self._take(int(declared))
                held = int(declared)
            chunks: list[bytes] = []
            size = 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > self.max_body_bytes:
                    raise BadRequest(413, f"body exceeds {self.max_body_bytes} bytes")
                if size > held:  # a chunked body, or one longer than it declared
                    self._take(size - held)
                    held = size
                chunks.append(chunk)
        except BaseException:
            self._reading -= held
            raise
        return b"".join(chunks), held

    async def _parse(self, request: Request) -> tuple[StageCall, str]:
        raw, held = await self._read_body(request)
        try:
            call, digest = await asyncio.to_thread(self._decode, raw)
        finally:
            self._reading -= held
        await self._check_stage(call)
        return call, digest

    def _decode(self, raw: bytes) -> tuple[StageCall, str]:
        """The call in a body and its digest (on a thread: a large tensor takes a while)."""
        try:
            body = json.loads(raw)
        except RecursionError:
            raise BadRequest(400, "body is nested too deeply") from None
        except ValueError as exc:  # JSONDecodeError, bad UTF-8, integers too long to read
            raise BadRequest(400, f"body is not JSON: {exc}") from None
        try:
            return parse_call(body, self.allow), call_digest(body)
        except RecursionError:
            raise BadRequest(400, "body is nested too deeply") from None

    async def _check_stage(self, call: StageCall) -> None:
        """The call's stage path must resolve to a stage named as the call says (else 404 or 400)."""
        name = self._stage_names.get(call.stage_path)
        if name is None:
            try:
                spec = await asyncio.to_thread(resolve_stage, call.stage_path)
            except UnknownStageError as exc:
                raise BadRequest(404, f"stage path {call.stage_path!r} is not a stage: {exc}") from None
            except (Exception, SystemExit) as exc:  # importing the module raised: the path is no usable stage
                why = (str(exc).splitlines() or [""])[0][:200]
                raise BadRequest(
                    404, f"stage path {call.stage_path!r} could not be imported: {type(exc).__name__}: {why}"
                ) from None
            name = self._stage_names.setdefault(call.stage_path, spec.name)
        if name != call.stage:
            raise BadRequest(400, f"stage path {call.stage_path!r} is stage {name!r}, not {call.stage!r}")

    async def call(self, request: Request) -> Response:
        try:
            wait_s = _wait_s(request.query_params.get("wait_s"))
        except BadRequest as exc:
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        if self.closing:
            return shutting_down()
        if len(self._inflight) >= self.max_pending:  # before reading the body: a full pool reads none
            return self._full()
        try:
            call, digest = await self._parse(request)
        except BadRequest as exc:
            headers = retry_after() if exc.status == 429 else None
            return JSONResponse({"error": str(exc)}, status_code=exc.status, headers=headers)
        held, stored = await self._find(call.call_id)
        if stored is not None:
            return await _stored_answer(call.call_id, stored, digest)
        if held is not None and held[1] != digest:
            return _conflict(call.call_id)
        if held is None:
            if len(self._inflight) >= self.max_pending:
                return self._full()
            if self.on_call is not None:
                self.on_call(call)
            held = (asyncio.get_running_loop().create_future(), digest)
            self._inflight[call.call_id] = held
            if wait_s is not None:
                self._watched.watch(call.call_id, wait_s)
            self._spawn(self._run(call, held[0], digest))
        return await self._answer(call.call_id, held, wait_s)

    async def join(self, request: Request) -> Response:
        """Join a call posted before by its id and digest: its body is not sent again on each poll."""
        call_id = request.path_params["call_id"]
        digest = request.query_params.get("digest", "")
        try:
            wait_s = _wait_s(request.query_params.get("wait_s"))
        except BadRequest as exc:
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        if not digest:
            return JSONResponse({"error": "digest is missing: pass the digest of the call's 202 answer"}, 400)
        held, stored = await self._find(call_id)
        if stored is not None:
            return await _stored_answer(call_id, stored, digest)
        if held is None:
            return JSONResponse({"error": f"call {call_id!r} is not held here: post it again"}, status_code=404)
        if held[1] != digest:
            return _conflict(call_id)
        return await self._answer(call_id, held, wait_s)

    async def _find(
        self, call_id: str
    ) -> tuple[tuple[asyncio.Future[dict[str, Any]], str] | None, tuple[dict[str, Any], str] | None]:
        """The call in flight under ``call_id``, else its stored outcome (each None where there is none).

        In flight first: a call stores its outcome before it leaves ``_inflight``,
        so one not in flight at the first look has its outcome in the store, if
        it ran here. Read the other way round, a call that finished during the
        read of the store was found in neither, and a POST ran it a second time.
        """
        held = self._inflight.get(call_id)
        if held is not None:
            return held, None
        stored = await asyncio.to_thread(self.results.get, call_id)
        return (self._inflight.get(call_id) if stored is None else None), stored  # posted meanwhile: joined

    async def _answer(
        self, call_id: str, held: tuple[asyncio.Future[dict[str, Any]], str], wait_s: float | None
    ) -> Response:
        """The outcome of a call in flight once done, or ``202`` (with its digest) after ``wait_s``.

        Any request waiting here counts as its caller asking: a watched call is not withdrawn meanwhile.
        """
        with self._watched.asking(call_id):
            try:
                body = await asyncio.wait_for(asyncio.shield(held[0]), wait_s)
            except TimeoutError:  # still queued or running: the caller asks again (the same call joins)
                pending = {"ok": None, "pending": True, "paused": self.pool.paused, "digest": held[1]}
                return JSONResponse(pending, status_code=202)
        if body.get("conflict"):
            return JSONResponse({"error": body["error"]["message"]}, status_code=409)
        return Response(await asyncio.to_thread(_render, body), media_type="application/json")

    def _full(self) -> JSONResponse:
        return JSONResponse(
            {"error": f"{len(self._inflight)} calls in flight: the pool is full, retry later"},
            status_code=429,
            headers=retry_after(),
        )

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)  # the loop holds tasks only weakly
        task.add_done_callback(self._tasks.discard)

    async def _recorded(self, batch_id: str, timeout_s: float = 30.0) -> None:
        """Wait until the call's batch is in the cost store (if one listens), so an answer implies its cost.

        Without it, a service killed between answering and storing would leave
        answered calls (served again from the result file after a restart) with
        no cost. Bounded: a store slower than ``timeout_s`` delays no answer more.
        """
        fut = self.pool.recorded(batch_id)
        if fut is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.wrap_future(fut), timeout_s)

    async def _run(self, call: StageCall, fut: asyncio.Future[dict[str, Any]], digest: str) -> None:
        """Run one call and answer everyone waiting on it, whatever happens on the way.

        Stored for retries: the call's output and the stage's own errors. Not
        stored: conflicts (nothing ran), a pool closing and faults of the
        service itself (a retry after a restart should run the call).
        """
        body = error_body(PoolClosedError(f"the service stopped before call {call.call_id!r} finished"))
        try:
            store = True
            try:
                # shielded: this task cancelled at shutdown must not cancel the pool's future of the call
                res = await asyncio.shield(asyncio.wrap_future(self.pool.submit(call)))
                await self._recorded(res.batch_id)
                try:
                    body = await asyncio.to_thread(result_body, res)  # a large tensor takes a while to encode
                except CodecError as exc:  # the stage ran (in process such an output works): say which way it failed
                    raise CodecError(
                        f"stage {call.stage!r} returned what cannot travel back from the pool service: {exc}"
                    ) from None
            except CallConflictError as exc:
                body, store = {**error_body(exc), "conflict": True}, False
            except PoolClosedError as exc:
                body, store = error_body(exc), False
            except (StageCallError, InvalidInputError) as exc:  # the stage's error, or an output the wire cannot carry
                body = error_body(exc)
            except Exception as exc:
                logger.exception("call %s failed inside the service", call.call_id)
                body, store = error_body(exc), False
            if store:
                try:
                    await asyncio.to_thread(self.results.put, call.call_id, body, digest)
                except Exception:  # e.g. a full disk: the caller still gets its answer
                    logger.exception("could not store the outcome of call %s", call.call_id)
        finally:  # also when cancelled at shutdown: answered, never left hanging
            self._inflight.pop(call.call_id, None)
            self._watched.forget(call.call_id)
            if not fut.done():
                fut.set_result(body)


def _wait_s(value: str | None) -> float | None:
    """A call's ``wait_s``: how long to hold the request before answering 202 "still pending" (None: until done)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds <= MAX_WAIT_S:  # NaN too
        raise BadRequest(400, f"wait_s must be a number of seconds in (0, {MAX_WAIT_S:g}], got {value!r}")
    return seconds


def _render(body: dict[str, Any]) -> bytes:
    """A JSON answer's bytes, as JSONResponse renders them (called on a thread: outputs may be large)."""
    return json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


async def _stored_answer(call_id: str, stored: tuple[dict[str, Any], str], digest: str) -> Response:
    """A finished call's stored outcome, or 409 where it answered another call (its digest differs)."""
    if stored[1] and stored[1] != digest:
        return _conflict(call_id)
    return Response(await asyncio.to_thread(_render, stored[0]), media_type="application/json")


def _conflict(call_id: str) -> JSONResponse:
    return JSONResponse(
        {"error": f"call id {call_id!r} was used for another call (other stage, caller or input)"}, status_code=409
    )
