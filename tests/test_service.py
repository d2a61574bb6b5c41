"""The pool service: wire encoding, HTTP errors, auth, idempotency across restarts, backpressure, client."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from starlette.testclient import TestClient

from esg_prefect.control.calls import StageCall, WorkflowDecl
from esg_prefect.exceptions import (
    CallConflictError,
    InvalidInputError,
    PoolClosedError,
    StageCallError,
    StageFailedError,
    StageRejectedError,
    WorkerCrashedError,
)
from esg_prefect.runtime.pool import Pool
from esg_prefect.runtime.workers import InlineBackend
from esg_prefect.service.app import PoolService, check_bind
from esg_prefect.service.client import call_body, parse_result
from esg_prefect.service.codec import CodecError, decode, encode
from esg_prefect.service.results import ResultCache
from esg_prefect.service.wire import error_body
from tests.toy_calls import toy_body
from tests.toy_stages import POISON, UNPICKLABLE, toy_profile

TOKEN = "s3cret-token-of-24-chars"


def client(service: PoolService, token: str | None = TOKEN) -> TestClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return TestClient(service.app(), headers=headers)


# ---- codec -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.uint8, torch.bool])
def test_tensors_round_trip_exactly(dtype: torch.dtype) -> None:
    t = (torch.arange(24).reshape(2, 3, 4) % 5).to(dtype)
    got = decode(encode(t))
    assert got.dtype == dtype and got.shape == t.shape and torch.equal(got, t)


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.zeros(1, 4).expand(3, 4)[:, :1],  # size-1 last dim with stride 0: contiguous() keeps it
        lambda: torch.tensor(2.5).expand(5),
        lambda: torch.tensor(2.5).expand(1),  # one element, stride 0: clone() keeps that stride
        lambda: torch.arange(3.0)[:, None].expand(3, 2),
        lambda: torch.empty(0, 7),
    ],
)
def test_broadcast_views_round_trip(make: Any) -> None:
    t = make()
    got = decode(encode(t))
    assert got.shape == t.shape and torch.equal(got, t.contiguous())


def test_views_nested_values_and_arrays_round_trip() -> None:
    base = torch.rand(4, 4)
    arr = np.arange(6, dtype=np.int32).reshape(2, 3)
    value = {"view": base[1:3, ::2], "arr": arr, "t": (1, "a", None), "f": [math.inf]}
    got = decode(encode(value))
    assert torch.equal(got["view"], base[1:3, ::2]) and got["arr"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert got["t"] == (1, "a", None) and got["f"] == [math.inf]


def test_unencodable_values_and_bad_payloads_are_named() -> None:
    with pytest.raises(CodecError, match=r"builtins\.set"):
        encode({1, 2})
    with pytest.raises(CodecError, match="key 3"):
        encode({3: "x"})
    with pytest.raises(CodecError, match="unknown payload tag 'pickle'"):
        decode({"__esg__": "pickle", "v": "gASV"})
    with pytest.raises(CodecError, match="does not hold 4 float32 values"):
        decode({"__esg__": "tensor", "dtype": "float32", "shape": [4], "data": "AAAA"})
    with pytest.raises(CodecError, match="'complex64'"):
        decode({"__esg__": "tensor", "dtype": "complex64", "shape": [1], "data": ""})


WIRE_ERRORS = [StageFailedError, StageRejectedError, WorkerCrashedError, CallConflictError, PoolClosedError]


@pytest.mark.parametrize("known", WIRE_ERRORS, ids=lambda c: c.__name__)
def test_a_subclass_of_a_wire_error_travels_as_that_error(known: type[StageCallError]) -> None:
    """The wire names the nearest known type in the error's MRO; a known type itself goes as before."""
    sub = type(f"Own{known.__name__}", (known,), {})
    assert error_body(known("m"))["error"]["type"] == known.__name__
    body = error_body(sub("the message"))
    assert body["error"]["type"] == known.__name__
    with pytest.raises(known, match="the message") as got:
        parse_result(body)
    assert type(got.value) is not sub  # nothing of the sender's own classes is rebuilt


def test_a_typed_stage_failure_and_other_errors_keep_their_wire_names() -> None:
    typed = StageFailedError.raised("boom", "RuntimeError", "tb")
    assert error_body(typed)["error"] == {
        "type": "StageFailedError",
        "message": "boom",
        "error_type": "RuntimeError",
        "traceback": "tb",
    }
    assert error_body(ValueError("v"))["error"]["type"] == "ValueError"  # a fault of the service itself
    with pytest.raises(StageCallError, match="v"):
        parse_result(error_body(ValueError("v")))


# ---- HTTP ------------------------------------------------------------------------------------


def test_call_round_trip_and_stage_error(pool: Pool) -> None:
    http = client(PoolService(pool, ["tests"], TOKEN))
    ok = http.post("/v1/calls", json=toy_body(5))
    assert ok.status_code == 200 and parse_result(ok.json()).output == 6
    bad = http.post("/v1/calls", json=toy_body(POISON * 2))
    assert bad.status_code == 200
    with pytest.raises(StageFailedError, match="poison input 26") as info:
        parse_result(bad.json())
    assert info.value.error_type == "ValueError"


def test_an_output_without_a_wire_form_names_its_stage_and_the_way_back(pool: Pool) -> None:
    """A stage whose output JSON cannot carry (a lock here; a class of one's own) works in process but
    not through the service: the error says the stage returned it, not that an input could not go."""
    http = client(PoolService(pool, ["tests"], TOKEN))
    resp = http.post("/v1/calls", json=toy_body(UNPICKLABLE * 2))
    assert resp.status_code == 200
    with pytest.raises(StageCallError) as info:
        parse_result(resp.json())
    msg = str(info.value)
    assert msg.startswith("stage 'inc' returned what cannot travel back from the pool service: values of type ")
    assert "_thread.lock" in msg and "to the pool service" not in msg


def test_auth(pool: Pool) -> None:
    service = PoolService(pool, ["tests"], TOKEN)
    assert client(service, token=None).get("/healthz").json() == {"status": "ok"}
    assert client(service, token=None).post("/v1/calls", json=toy_body(1)).status_code == 401
    assert client(service, token="wrong").get("/metrics").status_code == 401
    assert client(service).get("/metrics").status_code == 200


def test_pause_and_resume_over_http(pool: Pool) -> None:
    service = PoolService(pool, ["tests"], TOKEN)
    assert client(service, token=None).post("/v1/pause").status_code == 401
    assert not pool.paused
    http = client(service)
    assert http.post("/v1/pause").json() == {"paused": True}
    assert pool.paused and http.get("/metrics").json()["paused"] is True
    assert http.post("/v1/resume").json() == {"paused": False}
    assert not pool.paused and http.get("/metrics").json()["paused"] is False
    assert http.post("/v1/calls", json=toy_body(5)).status_code == 200  # dispatching again
    service.closing = True
    closing = http.post("/v1/pause")
    assert closing.status_code == 503 and not pool.paused
    assert closing.json() == {"error": "the service is shutting down"} and 1 <= int(closing.headers["retry-after"]) <= 3


@pytest.mark.parametrize(
    ("mutate", "status", "needle"),
    [
        (lambda b: b.pop("call_id"), 400, "missing field 'call_id'"),
        (lambda b: b.update(stage_path="os:system"), 403, "outside the allowed modules"),
        (lambda b: b.update(item={"__esg__": "pickle"}), 400, "field 'item'"),
        (lambda b: b.update(run_id=7), 400, "field 'run_id' has the wrong type int"),
        (lambda b: b.update(input_size=-1), 400, "input_size must be > 0"),
    ],
)
def test_bad_requests_are_named(pool: Pool, mutate: object, status: int, needle: str) -> None:
    b = toy_body(1)
    mutate(b)  # type: ignore[operator]
    resp = client(PoolService(pool, ["tests"], TOKEN)).post("/v1/calls", json=b)
    assert resp.status_code == status and needle in resp.json()["error"]


def test_oversized_and_non_json_bodies(pool: Pool) -> None:
    http = client(PoolService(pool, ["tests"], TOKEN, max_body_bytes=100))
    assert http.post("/v1/calls", json=toy_body(1)).status_code == 413
    http = client(PoolService(pool, ["tests"], TOKEN))
    resp = http.post("/v1/calls", content=b"{not json", headers={"content-type": "application/json"})
    assert resp.status_code == 400 and "not JSON" in resp.json()["error"]


def test_backpressure_says_retry_later(pool: Pool) -> None:
    resp = client(PoolService(pool, ["tests"], TOKEN, max_pending=0)).post("/v1/calls", json=toy_body(1))
    assert resp.status_code == 429 and resp.headers["retry-after"] in {"1", "2", "3"}  # jittered


def test_a_finished_call_is_not_run_again_even_after_a_restart(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    first = Pool(toy_profile(), backend=InlineBackend())
    try:
        http = client(PoolService(first, ["tests"], TOKEN, ResultCache(db)))
        out1 = parse_result(http.post("/v1/calls", json=toy_body(9, call_id="once")).json())
        again = parse_result(http.post("/v1/calls", json=toy_body(9, call_id="once")).json())
        assert out1.output == again.output == 10 and again.batch_id == out1.batch_id
        assert len(first.snapshot().batches) == 1
    finally:
        first.close()
    second = Pool(toy_profile(), backend=InlineBackend())  # the service restarted: a new pool, the same file
    try:
        http = client(PoolService(second, ["tests"], TOKEN, ResultCache(db)))
        out2 = parse_result(http.post("/v1/calls", json=toy_body(9, call_id="once")).json())
        assert out2.batch_id == out1.batch_id and second.snapshot().batches == ()
    finally:
        second.close()


def test_binding_beyond_loopback_needs_a_token() -> None:
    check_bind("127.0.0.1", None)
    with pytest.raises(InvalidInputError, match=r"'0\.0\.0\.0'"):
        check_bind("0.0.0.0", None)
    check_bind("0.0.0.0", TOKEN)


def test_deployment_id_travels_with_the_call_and_is_checked() -> None:
    from esg_prefect.service.app import BadRequest, parse_call
    from esg_prefect.service.client import call_body

    dep = "6f1b2c3d-0000-4000-8000-00000000abcd"
    call = StageCall("c1", "inc", "tests.toy_stages:inc", WorkflowDecl("toy", 800), "r", "r", 1, deployment_id=dep)
    assert parse_call(call_body(call), ["tests"]).deployment_id == dep
    body = {**call_body(call), "deployment_id": "not-a-uuid"}
    with pytest.raises(BadRequest, match=r"deployment_id.*not-a-uuid"):
        parse_call(body, ["tests"])
    assert parse_call({**call_body(call), "deployment_id": ""}, ["tests"]).deployment_id == ""


def test_the_profile_stage_travels_with_the_call_and_is_checked() -> None:
    from esg_prefect.service.app import BadRequest, parse_call
    from esg_prefect.service.client import call_body

    call = StageCall("c1", "tally", "tests.toy_stages:tally", WorkflowDecl("w", 800), "r", "r", 1, profile_stage="inc")
    assert parse_call(call_body(call), ["tests"]).profile_stage == "inc"
    body = call_body(call)
    del body["profile_stage"]  # a client of an older version: the stage's own name
    assert parse_call(body, ["tests"]).profile_stage == ""
    with pytest.raises(BadRequest, match=r"'profile_stage' has the wrong type int"):
        parse_call({**call_body(call), "profile_stage": 3}, ["tests"])


def test_the_flow_runs_name_travels_with_the_call_and_is_checked() -> None:
    from esg_prefect.service.app import BadRequest, parse_call
    from esg_prefect.service.wire import MAX_RUN_NAME

    call = StageCall("c1", "inc", "tests.toy_stages:inc", WorkflowDecl("w", 800), "r", "r", 1, run_name="crimson-fox")
    assert call_body(call)["run_name"] == "crimson-fox"
    assert parse_call(call_body(call), ["tests"]).run_name == "crimson-fox"
    body = call_body(call)
    del body["run_name"]  # a client of an older version: no name
    assert parse_call(body, ["tests"]).run_name == ""
    with pytest.raises(BadRequest, match=r"'run_name' has the wrong type int"):
        parse_call({**call_body(call), "run_name": 3}, ["tests"])
    assert len(parse_call({**call_body(call), "run_name": "x" * 10_000}, ["tests"]).run_name) == MAX_RUN_NAME


def test_the_service_notes_each_calls_deployment_for_the_cost_store() -> None:
    import uuid

    from esg_prefect.integration import recording

    dep = str(uuid.uuid4())
    recording.remember_deployment(
        StageCall("c2", "inc", "tests.toy_stages:inc", WorkflowDecl("toy", 800), "r9", "run-9", 1, deployment_id=dep)
    )
    with recording._lock:
        assert recording._run_deployments.pop("run-9") == uuid.UUID(dep)
