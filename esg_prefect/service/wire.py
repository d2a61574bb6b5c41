"""The pool service's wire format, written once: calls and outcomes as JSON, both directions.

A call travels as a JSON object (:func:`call_body`, read back by :func:`parse_call`,
which names the first bad field); its outcome as ``{"ok": true, "result": ...}``
or ``{"ok": false, "error": ...}`` (:func:`result_body`, :func:`error_body`,
read back by :func:`parse_result`). Inputs and outputs go through
:mod:`esg_prefect.service.codec`: nothing is ever unpickled.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import uuid
from collections.abc import Sequence
from typing import Any

from esg_prefect.control.calls import MAX_RUN_NAME, StageCall, StageResult, WorkflowDecl
from esg_prefect.exceptions import (
    CallConflictError,
    InvalidInputError,
    PoolClosedError,
    StageCallError,
    StageFailedError,
    StageRejectedError,
    WorkerCrashedError,
)
from esg_prefect.runtime.batch_output import checked_lines
from esg_prefect.service.codec import decode, encode

JITTER = random.Random()
"""Retry jitter (the service's Retry-After, the client's backoff) from its own generator: the service and its
clients never draw from, or move, the global ``random`` a user may seed."""

MAX_WAIT_S = 3600.0
"""The longest the service holds a request before it answers a pending call ``202`` (``wait_s``)."""


_ERRORS: dict[str, type[StageCallError]] = {
    "StageFailedError": StageFailedError,
    "StageRejectedError": StageRejectedError,
    "WorkerCrashedError": WorkerCrashedError,
    "CallConflictError": CallConflictError,
    "PoolClosedError": PoolClosedError,
}
_WIRE_NAMES = {cls: name for name, cls in _ERRORS.items()}


class BadRequest(InvalidInputError):
    """A request the service refuses; carries its HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def call_body(call: StageCall) -> dict[str, Any]:
    """The JSON of a call (read back by :func:`parse_call`)."""
    wf = call.workflow
    return {
        "call_id": call.call_id,
        "stage": call.stage,
        "stage_path": call.stage_path,
        "workflow": {
            "name": wf.name,
            "slo_ms": wf.slo_ms,
            "edges": None if wf.edges is None else [list(e) for e in wf.edges],
            "stages": list(wf.stages),
        },
        "request_id": call.request_id,
        "run_id": call.run_id,
        "item": encode(call.item),
        "upstream": list(call.upstream),
        "arrival_ms": call.arrival_ms,
        "input_size": call.input_size,
        "task_run_id": call.task_run_id,
        "deployment_id": call.deployment_id,
        "profile_stage": call.profile_stage,
        "run_name": call.run_name,
    }


def _field(src: dict[str, Any], name: str, kind: type | tuple[type, ...], where: str = "") -> Any:
    if name not in src:
        raise BadRequest(400, f"missing field {where + name!r}")
    value = src[name]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind not in (bool, (bool,))):
        raise BadRequest(400, f"field {where + name!r} has the wrong type {type(value).__name__}")
    return value


def _text(src: dict[str, Any], name: str) -> str:
    value: str = _field(src, name, str)
    if not value.strip():
        raise BadRequest(400, f"field {name!r} must be a non-empty string, got {value!r}")
    return value


def _number(src: dict[str, Any], name: str, default: float | None, positive: bool = False) -> float | None:
    value = src.get(name, default)
    if value is None and default is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(400, f"field {name!r} must be a number, got {type(value).__name__}")
    try:
        value = float(value)
    except OverflowError:
        raise BadRequest(400, f"field {name!r} is out of range") from None
    if not math.isfinite(value) or (positive and value <= 0):
        need = "must be > 0 and finite" if positive else "must be finite"
        raise BadRequest(400, f"{name} {need} (field {name!r}), got {value!r}")
    return float(value)


def _names(value: Any, name: str, pairs: bool = False) -> list[Any]:
    ok = isinstance(value, list) and all(
        (isinstance(e, list) and len(e) == 2 and all(isinstance(x, str) and x for x in e))
        if pairs
        else (isinstance(e, str) and e)
        for e in value
    )
    if not ok:
        what = "a list of [upstream, downstream] stage names" if pairs else "a list of non-empty strings"
        raise BadRequest(400, f"field {name!r} must be {what}")
    return list(value)


def _workflow(body: dict[str, Any]) -> WorkflowDecl:
    wf = _field(body, "workflow", dict)
    edges = wf.get("edges")
    stages = wf.get("stages") or []
    try:
        return WorkflowDecl(
            _field(wf, "name", str, "workflow."),
            float(_field(wf, "slo_ms", (int, float), "workflow.")),
            None if edges is None else tuple((a, b) for a, b in _names(edges, "workflow.edges", pairs=True)),
            tuple(_names(stages, "workflow.stages")),
        )
    except BadRequest:
        raise
    except OverflowError:
        raise BadRequest(400, "field 'workflow.slo_ms' is out of range") from None
    except InvalidInputError as exc:
        raise BadRequest(400, str(exc)) from None


def _deployment_id(value: Any) -> str:
    if value in ("", None):
        return ""
    try:
        return str(uuid.UUID(str(value)))
    except ValueError:
        raise BadRequest(400, f"field 'deployment_id' must be a UUID, got {value!r}") from None


def parse_call(body: Any, allow: Sequence[str]) -> StageCall:
    """A :class:`StageCall` from a request body, or :class:`BadRequest` naming the first bad field.

    The stage path must lie under one of the ``allow`` module prefixes (403);
    whether it resolves to a stage of that name is checked by the service.
    """
    if not isinstance(body, dict):
        raise BadRequest(400, f"body must be a JSON object, got {type(body).__name__}")
    path = _text(body, "stage_path")
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise BadRequest(400, f"field 'stage_path' must look like 'module:attribute', got {path!r}")
    if not any(module == p or module.startswith(p + ".") for p in allow):
        raise BadRequest(403, f"stage path {path!r} is outside the allowed modules {list(allow)}")
    ids = {name: _text(body, name) for name in ("call_id", "stage", "request_id", "run_id")}
    decl = _workflow(body)
    upstream = _names(body.get("upstream", []), "upstream")
    arrival = _number(body, "arrival_ms", 0.0)
    size = _number(body, "input_size", None, positive=True)
    task_run_id = body.get("task_run_id", "")
    profile_stage = body.get("profile_stage", "")
    run_name = body.get("run_name", "")  # optional: clients before it send none
    for name, value in (("task_run_id", task_run_id), ("profile_stage", profile_stage), ("run_name", run_name)):
        if not isinstance(value, str):
            raise BadRequest(400, f"field {name!r} has the wrong type {type(value).__name__}")
    try:
        item = decode(body.get("item"))
    except (InvalidInputError, ValueError, TypeError, OverflowError, MemoryError, RecursionError) as exc:
        raise BadRequest(400, f"field 'item': {exc}") from None
    try:
        return StageCall(
            ids["call_id"],
            ids["stage"],
            path,
            decl,
            ids["request_id"],
            ids["run_id"],
            item,
            tuple(upstream),
            0.0 if arrival is None else arrival,
            size,
            task_run_id,
            _deployment_id(body.get("deployment_id", "")),
            profile_stage,
            run_name[:MAX_RUN_NAME],  # this client's are cut visibly already; an older one's are clipped here
        )
    except BadRequest:
        raise
    except InvalidInputError as exc:
        raise BadRequest(400, str(exc)) from None


def call_digest(body: dict[str, Any]) -> str:
    """What a call id is bound to: its stage, path, workflow, request, run and input (sha256 hex).

    A call id reused with another input or for another caller is refused (409)
    instead of answered with the first call's output.
    """
    wf = body.get("workflow") or {}
    key = [body.get(k) for k in ("stage", "stage_path", "request_id", "run_id")]
    text = json.dumps([*key, wf.get("name"), body.get("item")], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


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
            "lines": [list(line) for line in res.lines],
        },
    }


def error_body(exc: BaseException) -> dict[str, Any]:
    """The JSON of a call that failed.

    Its ``type`` is the nearest wire error type in the error's MRO, so a subclass
    of one (a stage's typed :class:`StageFailedError`, say) reaches the client as
    that type; any other error goes by its own name (the client reads it as a
    :class:`StageCallError`).
    """
    wire = next((_WIRE_NAMES[c] for c in type(exc).__mro__ if c in _WIRE_NAMES), type(exc).__name__)
    return {
        "ok": False,
        "error": {
            "type": wire,
            "message": str(exc),
            "error_type": getattr(exc, "error_type", ""),
            "traceback": getattr(exc, "remote_traceback", ""),
        },
    }


def parse_result(body: dict[str, Any]) -> StageResult:
    """A :class:`StageResult` from the service's answer, or the StageCallError it reports."""
    if not body.get("ok"):
        err = body.get("error") or {}
        cls = _ERRORS.get(str(err.get("type")), StageCallError)
        if cls is StageFailedError:
            raise StageFailedError.raised(
                str(err.get("message")), str(err.get("error_type", "")), str(err.get("traceback", ""))
            )
        raise cls(str(err.get("message")))
    r = body["result"]
    return StageResult(
        r["call_id"],
        decode(r["output"]),
        r["batch_id"],
        r["batch_size"],
        r["worker_id"],
        r["hardware"],
        r["vcpus"],
        r["gpu_share"],
        r["queue_wait_ms"],
        r["predicted_ms"],
        r["actual_ms"],
        r["cold_start"],
        r["at_risk"],
        r["reason"],
        r["co_batched_runs"],
        lines=checked_lines(r.get("lines")),
    )
