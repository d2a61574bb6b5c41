"""The pool service: an ASGI app (starlette, which Prefect ships) around one :class:`Pool`.

Endpoints:

* ``POST /v1/calls``: one stage call (JSON, see :mod:`esg_prefect.service.codec`); the
  response comes when the call is done: ``{"ok": true, "result": ...}`` or
  ``{"ok": false, "error": {"type", "message", "traceback"}}``.
* ``POST /v1/runs/{run_id}/end``: a flow run finished.
* ``GET /healthz``: liveness (no token needed; says nothing about the work).
* ``GET /metrics``: queue depths, batch sizes, worker shares, decision times.
* ``GET /v1/batches?limit=N``: recent batches and the runs each served.
* ``POST /v1/pause`` / ``POST /v1/resume``: hold dispatching (calls keep queueing,
  none is failed) and release it (:meth:`Pool.pause`); ``/metrics`` says ``paused``.

Security: the service binds 127.0.0.1 unless told otherwise, and then needs a
token; every endpoint but ``/healthz`` checks ``Authorization: Bearer <token>``
in constant time when a token is set. Stage code is imported only from the
module prefixes allowed at start. Bodies are size-bounded, nothing is unpickled.

Idempotency: a call id already finished gets its stored outcome (kept on disk
across restarts by :class:`~esg_prefect.service.results.ResultCache`); one in
flight is joined. Backpressure: past ``max_pending`` calls in flight, new
calls get ``429`` with ``Retry-After``; while closing, ``503``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from esg_prefect.exceptions import InvalidInputError, StageCallError
from esg_prefect.runtime.calls import StageCall, StageResult, WorkflowDecl
from esg_prefect.runtime.pool import Pool
from esg_prefect.service.codec import CodecError, decode, encode
from esg_prefect.service.results import ResultCache

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024 * 1024


class BadRequest(InvalidInputError):
    """A request the service refuses; carries its HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _deployment_id(value: Any) -> str:
    if value in ("", None):
        return ""
    try:
        return str(uuid.UUID(str(value)))
    except ValueError:
        raise BadRequest(400, f"field 'deployment_id' must be a UUID, got {value!r}") from None


def parse_call(body: Any, allow: Sequence[str]) -> StageCall:
    """A :class:`StageCall` from a request body, or :class:`BadRequest` naming the problem."""
    if not isinstance(body, dict):
        raise BadRequest(400, f"body must be a JSON object, got {type(body).__name__}")

    def need(name: str, kind: type | tuple[type, ...], src: dict[str, Any] = body) -> Any:
        if name not in src:
            raise BadRequest(400, f"missing field {name!r}")
        value = src[name]
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise BadRequest(400, f"field {name!r} has the wrong type {type(value).__name__}")
        return value

    path = need("stage_path", str)
    module = path.partition(":")[0]
    if not any(module == p or module.startswith(p + ".") for p in allow):
        raise BadRequest(403, f"stage path {path!r} is outside the allowed modules {list(allow)}")
    wf = need("workflow", dict)
    edges = wf.get("edges")
    if edges is not None and not (
        isinstance(edges, list)
        and all(isinstance(e, list) and len(e) == 2 and all(isinstance(x, str) for x in e) for e in edges)
    ):
        raise BadRequest(400, "field 'workflow.edges' must be a list of [upstream, downstream] names")
    try:
        decl = WorkflowDecl(
            need("name", str, wf),
            float(need("slo_ms", (int, float), wf)),
            None if edges is None else tuple(map(tuple, edges)),
        )
        item = decode(body.get("item"))
        upstream = body.get("upstream", [])
        if not isinstance(upstream, list) or not all(isinstance(u, str) for u in upstream):
            raise BadRequest(400, "field 'upstream' must be a list of strings")
        raw_size = body.get("input_size")
        size = None if raw_size is None else float(raw_size)
        arrival = float(body.get("arrival_ms", 0.0))
        if not ((size is None or (math.isfinite(size) and size > 0)) and math.isfinite(arrival)):
            raise BadRequest(400, f"input_size must be > 0 and arrival_ms finite, got {size!r}, {arrival!r}")
        return StageCall(
            need("call_id", str),
            need("stage", str),
            path,
            decl,
            need("request_id", str),
            need("run_id", str),
            item,
            tuple(upstream),
            arrival,
            size,
            str(body.get("task_run_id", "")),
            _deployment_id(body.get("deployment_id", "")),
        )
    except CodecError as exc:
        raise BadRequest(400, f"field 'item': {exc}") from None
    except InvalidInputError as exc:
        if isinstance(exc, BadRequest):
            raise
        raise BadRequest(400, str(exc)) from None


def result_body(res: StageResult) -> dict[str, Any]:
    """The JSON of a finished call."""
    return {
        "ok": True,
        "result": {
            "call_id": res.call_id,
            "output": encode(res.output),
            "batch_id": res.batch_id,
            "batch_size": res.batch_size,
            "worker_id": res.worker_id,
            "hardware": res.hardware,
            "vcpus": res.vcpus,
            "gpu_share": res.gpu_share,
            "queue_wait_ms": res.queue_wait_ms,
            "predicted_ms": res.predicted_ms,
            "actual_ms": res.actual_ms,
            "cold_start": res.cold_start,
            "at_risk": res.at_risk,
            "reason": res.reason,
            "co_batched_runs": res.co_batched_runs,
        },
    }


def error_body(exc: BaseException) -> dict[str, Any]:
    """The JSON of a call that failed."""
    return {
        "ok": False,
        "error": {
            "type": type(exc).__name__,
            "message": str(exc),
            "error_type": getattr(exc, "error_type", ""),
            "traceback": getattr(exc, "remote_traceback", ""),
        },
    }


class PoolService:
    """One pool behind HTTP.

    Args:
        pool: the pool that owns queues, scheduler and workers.
        allow: module prefixes stage code may be imported from.
        token: bearer token; required by :func:`check_bind` off loopback.
        results: where finished outcomes are kept (in memory by default).
        max_pending: most calls in flight before new ones get 429.
        max_body_bytes: largest request body accepted.
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
    ) -> None:
        if not allow:
            raise InvalidInputError("allow must name at least one module prefix stage code may come from")
        self.pool = pool
        self.allow = tuple(allow)
        self._token = token.encode() if token else None
        self.results = results or ResultCache()
        self.max_pending = max_pending
        self.max_body_bytes = max_body_bytes
        self.on_call = on_call
        self._inflight: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.closing = False

    def app(self) -> Starlette:
        """The ASGI application."""
        return Starlette(
            routes=[
                Route("/healthz", self.healthz, methods=["GET"]),
                Route("/metrics", self.metrics, methods=["GET"]),
                Route("/v1/calls", self.call, methods=["POST"]),
                Route("/v1/runs/{run_id}/end", self.end_run, methods=["POST"]),
                Route("/v1/batches", self.batches, methods=["GET"]),
                Route("/v1/pause", self.pause, methods=["POST"]),
                Route("/v1/resume", self.resume, methods=["POST"]),
            ]
        )

    def _authorized(self, request: Request) -> bool:
        if self._token is None:
            return True
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.encode(), self._token)

    async def healthz(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "closing" if self.closing else "ok"})

    async def metrics(self, request: Request) -> JSONResponse:
        if not self._authorized(request):
            return JSONResponse({"error": "missing or wrong bearer token"}, status_code=401)
        snap = await asyncio.to_thread(self.pool.snapshot)
        times = sorted(d.decision_ms for d in snap.decisions[-1000:] if d.decision_ms is not None)
        sizes = [len(b.items) for b in snap.batches[-1000:]]
        return JSONResponse(
            {
                "queue_depths": snap.queue_depths,
                "paused": self.pool.paused,
                "calls_in_flight": len(self._inflight),
                "workers": list(snap.workers),
                "profile_corrections": list(snap.corrections),
                "recent_batches": len(sizes),
                "mean_batch_size": sum(sizes) / len(sizes) if sizes else 0.0,
                "decision_ms_p50": times[len(times) // 2] if times else None,
                "decision_ms_p99": times[min(len(times) - 1, int(0.99 * len(times)))] if times else None,
            }
        )

    async def batches(self, request: Request) -> JSONResponse:
        """The most recent batches (``?limit=N``, default 100): size, worker, and the runs they served."""
        if not self._authorized(request):
            return JSONResponse({"error": "missing or wrong bearer token"}, status_code=401)
        try:
            limit = int(request.query_params.get("limit", "100"))
        except ValueError:
            return JSONResponse({"error": "limit must be an integer"}, status_code=400)
        snap = await asyncio.to_thread(self.pool.snapshot)
        rows = [
            {
                "batch_id": b.batch_id,
                "worker_id": b.worker_id,
                "size": len(b.items),
                "runs": sorted({i.run_id for i in b.items}),
                "start_ms": b.start_ms,
                "end_ms": b.end_ms,
            }
            for b in snap.batches[-max(0, limit) :]
        ]
        return JSONResponse({"batches": rows})

    async def pause(self, request: Request) -> JSONResponse:
        """Hold dispatching until ``/v1/resume``; calls keep being accepted and queue."""
        return await self._hold(request, True)

    async def resume(self, request: Request) -> JSONResponse:
        """Release a pause: everything that queued meanwhile is scheduled at once."""
        return await self._hold(request, False)

    async def _hold(self, request: Request, paused: bool) -> JSONResponse:
        if not self._authorized(request):
            return JSONResponse({"error": "missing or wrong bearer token"}, status_code=401)
        if self.closing:
            return JSONResponse({"error": "the service is shutting down"}, status_code=503)
        await asyncio.to_thread(self.pool.pause if paused else self.pool.resume)
        return JSONResponse({"paused": paused})

    async def end_run(self, request: Request) -> JSONResponse:
        if not self._authorized(request):
            return JSONResponse({"error": "missing or wrong bearer token"}, status_code=401)
        self.pool.end_run(request.path_params["run_id"])
        return JSONResponse({"ok": True})

    async def call(self, request: Request) -> JSONResponse:
        if not self._authorized(request):
            return JSONResponse({"error": "missing or wrong bearer token"}, status_code=401)
        if self.closing:
            return JSONResponse(
                {"error": "the service is shutting down"}, status_code=503, headers={"Retry-After": "1"}
            )
        size = int(request.headers.get("content-length") or 0)
        if size > self.max_body_bytes:
            return JSONResponse({"error": f"body of {size} bytes exceeds {self.max_body_bytes}"}, status_code=413)
        raw = await request.body()
        if len(raw) > self.max_body_bytes:
            return JSONResponse({"error": f"body of {len(raw)} bytes exceeds {self.max_body_bytes}"}, status_code=413)
        try:
            import json

            call = parse_call(json.loads(raw), self.allow)
        except BadRequest as exc:
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        except ValueError as exc:
            return JSONResponse({"error": f"body is not JSON: {exc}"}, status_code=400)
        if self.on_call is not None:
            self.on_call(call)
        stored = await asyncio.to_thread(self.results.get, call.call_id)
        if stored is not None:
            return JSONResponse(stored)
        fut = self._inflight.get(call.call_id)
        if fut is None:
            if len(self._inflight) >= self.max_pending:
                return JSONResponse(
                    {"error": f"{len(self._inflight)} calls in flight: the pool is full, retry later"},
                    status_code=429,
                    headers={"Retry-After": "1"},
                )
            fut = asyncio.get_running_loop().create_future()
            self._inflight[call.call_id] = fut
            asyncio.get_running_loop().create_task(self._run(call, fut))
        body = await asyncio.shield(fut)
        return JSONResponse(body)

    async def _run(self, call: StageCall, fut: asyncio.Future[dict[str, Any]]) -> None:
        try:
            res = await asyncio.wrap_future(self.pool.submit(call))
            body = result_body(res)
        except StageCallError as exc:
            body = error_body(exc)
        except CodecError as exc:
            body = error_body(exc)
        await asyncio.to_thread(self.results.put, call.call_id, body)
        self._inflight.pop(call.call_id, None)
        fut.set_result(body)


def check_bind(host: str, token: str | None) -> None:
    """Refuse to listen beyond loopback without a token.

    Raises:
        InvalidInputError: naming the host.
    """
    if host not in ("127.0.0.1", "localhost", "::1") and not token:
        raise InvalidInputError(
            f"binding to {host!r} exposes the pool beyond this machine: set a token "
            "(--token-env VAR, with the token in that environment variable)"
        )
