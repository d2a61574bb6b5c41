"""Property-based tests over the wire codec and every endpoint of the pool service.

Whatever arrives (random JSON shapes, wrong types, tensors whose dtype, shape and
bytes disagree, NaN and infinities, unicode and very long names, modules outside
``allow``, path-like stage names, bodies at and over the size limit, missing and
wrong tokens), the answer is a 4xx naming the problem or a normal answer: never a
500, a hang or a crash. Cases tried per run: the sum of the ``max_examples`` below
(1,300), plus the fixed cases. The service is a starlette app with no OpenAPI
schema, so schemathesis has nothing to read.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import json
import math
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from esg_prefect.runtime.pool import Pool
from esg_prefect.service.app import PoolService
from esg_prefect.service.codec import CodecError, decode
from esg_prefect.service.wire import call_body
from tests.toy_calls import toy_call, toy_pool

TOKEN = "fuzzing-token-0123456789abcdef"


def fuzz(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


DTYPES = ["float16", "bfloat16", "float32", "float64", "uint8", "int8", "int16", "int32", "int64", "bool"]


@pytest.fixture(scope="module")
def pool() -> Iterator[Pool]:
    """One toy pool for all the module's tests (conftest's ``pool`` is one a test)."""
    with toy_pool() as p:
        yield p


def answer(service: PoolService, method: str, path: str, token: str | None = TOKEN, **kw: Any) -> Any:
    """One request, answered within 30 s or the test fails (a hang)."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    client = TestClient(service.app(), headers=headers, raise_server_exceptions=False)
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        return ex.submit(lambda: client.request(method, path, **kw)).result(30)


def body(i: int, **over: Any) -> dict[str, Any]:
    """Call ``i``'s JSON, ``over`` replacing its keys: ``stage`` too, which leaves ``stage_path`` as it was."""
    b = call_body(toy_call(i, call_id=f"fz{i}"))
    b.update(over)
    return b


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=16,
)


# ---- the codec ---------------------------------------------------------------------------------


@fuzz(300)
@given(value=_json)
def test_decode_of_any_json_returns_or_names_the_problem(value: Any) -> None:
    with contextlib.suppress(CodecError):
        decode(value)


@fuzz(300)
@given(
    tag=st.sampled_from(["tensor", "ndarray"]),
    dtype=st.sampled_from([*DTYPES, "complex64", "object", ""]),
    shape=st.lists(st.integers(-2, 6), max_size=4),
    nbytes=st.integers(0, 200),
)
def test_tensors_whose_dtype_shape_and_bytes_disagree_are_refused(
    tag: str, dtype: str, shape: list[int], nbytes: int
) -> None:
    payload = {"__esg__": tag, "dtype": dtype, "shape": shape, "data": base64.b64encode(b"\x01" * nbytes).decode()}
    try:
        got = decode(payload)
    except CodecError as exc:
        assert str(exc)  # named
        return
    assert list(got.shape) == shape and int(got.numel() if hasattr(got, "numel") else got.size) == math.prod(shape)


# ---- /v1/calls -----------------------------------------------------------------------------------


_names = st.one_of(
    st.text(min_size=1, max_size=40),
    st.just("x" * 5000),
    st.sampled_from(["../../etc/passwd", "inc/../double", "a:b:c", "🤖", "\u0000", " inc", "inc\n"]),
)


@fuzz(250)
@given(
    field=st.sampled_from(["stage", "call_id", "request_id", "run_id", "stage_path"]), name=_names, i=st.integers(0, 99)
)
def test_unicode_long_and_path_like_names_are_answered(pool: Pool, field: str, name: str, i: int) -> None:
    service = PoolService(pool, ["tests"], TOKEN, max_pending=50)
    resp = answer(service, "POST", "/v1/calls", json=body(i, **{field: name}))
    assert resp.status_code in (200, 400, 403, 404, 409), resp.text
    if resp.status_code != 200:
        assert resp.json()["error"]


@fuzz(100)
@given(module=st.text(min_size=1, max_size=30).filter(lambda m: not (m == "tests" or m.startswith("tests."))))
def test_modules_outside_allow_are_403(pool: Pool, module: str) -> None:
    resp = answer(PoolService(pool, ["tests"], TOKEN), "POST", "/v1/calls", json=body(1, stage_path=f"{module}:inc"))
    assert resp.status_code in (400, 403), resp.text


@fuzz(150)
@given(item=_json, size=_json, arrival=_json, upstream=_json, i=st.integers(0, 99))
def test_any_field_values_with_nan_and_infinities_get_no_500(
    pool: Pool, item: Any, size: Any, arrival: Any, upstream: Any, i: int
) -> None:
    b = body(i, item=item, input_size=size, arrival_ms=arrival, upstream=upstream)
    b["call_id"] = f"nan-{i}-{hash(json.dumps(b, sort_keys=True, default=str)) & 0xFFFFFF}"
    raw = json.dumps(b).encode()  # Python writes NaN and Infinity literals: the service must cope
    resp = answer(PoolService(pool, ["tests"], TOKEN, max_pending=50), "POST", "/v1/calls", content=raw)
    assert resp.status_code in (200, 400, 409), resp.text


def test_bodies_at_and_over_the_size_limit(pool: Pool) -> None:
    raw = json.dumps(body(3, call_id="at-the-limit", request_id="limit", run_id="limit")).encode()
    service = PoolService(pool, ["tests"], TOKEN, max_body_bytes=len(raw))
    assert answer(service, "POST", "/v1/calls", content=raw).status_code == 200  # at the limit
    over = raw[:-1] + b" }"
    resp = answer(service, "POST", "/v1/calls", content=over)
    assert resp.status_code == 413 and str(len(raw)) in resp.json()["error"]


# ---- every endpoint, tokens --------------------------------------------------------------------------

ENDPOINTS = [
    ("GET", "/metrics"),
    ("GET", "/v1/batches"),
    ("POST", "/v1/calls"),
    ("POST", "/v1/runs/some-run/end"),
    ("POST", "/v1/pause"),
    ("POST", "/v1/resume"),
]


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
@pytest.mark.parametrize("token", [None, "", "wrong-token-0123456789", TOKEN[:-1], TOKEN + "x", "Bearer"])
def test_missing_and_wrong_tokens_are_401_on_every_endpoint(pool: Pool, method: str, path: str, token: str) -> None:
    resp = answer(PoolService(pool, ["tests"], TOKEN), method, path, token=token)
    assert resp.status_code == 401 and "token" in resp.json()["error"]
    assert answer(PoolService(pool, ["tests"], TOKEN), "GET", "/healthz", token=None).status_code == 200


@fuzz(200)
@given(
    endpoint=st.sampled_from(ENDPOINTS),
    query=st.text(max_size=20),
    run=st.text(min_size=1, max_size=30),
    payload=st.binary(max_size=200),
)
def test_every_endpoint_answers_any_query_and_body_without_a_500(
    pool: Pool, endpoint: tuple[str, str], query: str, run: str, payload: bytes
) -> None:
    method, path = endpoint
    path = path.replace("some-run", urllib.parse.quote(run, safe=""))
    resp = answer(PoolService(pool, ["tests"], TOKEN), method, path, params={"limit": query}, content=payload)
    assert resp.status_code < 500, resp.text
    if method == "POST" and path in ("/v1/pause", "/v1/resume"):
        pool.resume()  # leave the shared pool dispatching


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "bool"])
def test_empty_tensors_of_every_width_round_trip(dtype: str) -> None:
    import torch

    from esg_prefect.service.codec import encode

    t = torch.empty(0, 3, dtype=getattr(torch, dtype))
    got = decode(encode(t))  # found by the fuzzer: an empty bfloat16 tensor did not decode
    assert got.dtype == t.dtype and tuple(got.shape) == (0, 3)
