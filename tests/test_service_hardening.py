"""The pool service under bad, hostile or unlucky requests: every one answered, with a 4xx naming the problem.

Each test here failed on the code before its fix: wrong results for a stage path
that is not the call's stage, calls never answered, 500s on wrong field types, a
call id bound to nothing, bodies read whole before the size check, any token
accepted, outcomes kept for ever.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from esg_prefect.control.calls import StageCall, WorkflowDecl
from esg_prefect.exceptions import InvalidInputError
from esg_prefect.model import PriceSheet
from esg_prefect.runtime.pool import Pool
from esg_prefect.runtime.workers import InlineBackend
from esg_prefect.service.app import PoolService, check_bind, check_token
from esg_prefect.service.results import ResultCache
from esg_prefect.service.wire import parse_result
from tests.toy_calls import toy_body, toy_pool
from tests.toy_stages import toy_profile

TOKEN = "a-token-of-thirty-two-characters"


@pytest.fixture(scope="module")
def pool() -> Iterator[Pool]:
    """One toy pool for all the module's tests (conftest's ``pool`` is one a test)."""
    with toy_pool() as p:
        yield p


def http(service: PoolService) -> TestClient:
    return TestClient(service.app(), headers={"Authorization": f"Bearer {TOKEN}"})


# ---- 1. a stage path must be the call's stage --------------------------------------------------


@pytest.mark.parametrize(
    ("path", "status", "needle"),
    [
        ("tests.toy_stages:double", 400, "is stage 'double', not 'inc'"),
        ("tests.toy_stages:os.system", 404, "is not a stage"),
        ("tests.toy_stages:nosuch", 404, "is not a stage"),
        ("tests.nosuchmodule:inc", 404, "is not a stage"),
        ("tests.toy_stages:", 400, "module:attribute"),
    ],
)
def test_a_stage_path_that_is_not_the_calls_stage_is_refused(pool: Pool, path: str, status: int, needle: str) -> None:
    resp = http(PoolService(pool, ["tests"], TOKEN)).post("/v1/calls", json=toy_body(1, stage_path=path))
    assert resp.status_code == status and needle in resp.json()["error"], resp.text


def test_a_call_is_answered_with_its_own_stage_after_another_path_was_tried(pool: Pool) -> None:
    client = http(PoolService(pool, ["tests"], TOKEN))
    assert client.post("/v1/calls", json=toy_body(3, stage_path="tests.toy_stages:double")).status_code == 400
    assert parse_result(client.post("/v1/calls", json=toy_body(3)).json()).output == 4  # inc, not double


# ---- 2. calls are answered and free their place ---------------------------------------------------


@pytest.mark.parametrize("field", ["call_id", "request_id", "run_id", "stage"])
def test_empty_ids_are_a_400_and_hold_no_place(pool: Pool, field: str) -> None:
    service = PoolService(pool, ["tests"], TOKEN, max_pending=3)
    client = http(service)
    for i in range(4):
        resp = client.post("/v1/calls", json={**toy_body(10 + i), field: ""})
        assert resp.status_code == 400 and field in resp.json()["error"]
    assert client.post("/v1/calls", json=toy_body(20, call_id=f"ok-{field}")).status_code == 200
    assert service._inflight == {}


def test_an_input_without_a_size_is_answered(pool: Pool) -> None:
    service = PoolService(pool, ["tests"], TOKEN, max_pending=1)
    client = http(service)
    resp = client.post("/v1/calls", json=toy_body(30, stage="double", item={"boxes": 5}, input_size=None))
    assert resp.status_code == 200 and resp.json()["ok"] is False  # the stage's own TypeError, answered
    assert client.post("/v1/calls", json=toy_body(31)).status_code == 200  # its place was freed


def test_a_failing_result_store_still_answers_the_call(pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    service = PoolService(pool, ["tests"], TOKEN)

    def full_disk(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(service.results, "put", full_disk)
    resp = _with_deadline(lambda: http(service).post("/v1/calls", json=toy_body(40, call_id="disk")), 30)
    assert resp.status_code == 200 and parse_result(resp.json()).output == 41
    assert service._inflight == {}


# ---- 3. and 6. bad field types and shapes are 4xx naming the field -----------------------------------


@pytest.mark.parametrize(
    ("over", "needle"),
    [
        ({"input_size": [1]}, "input_size"),
        ({"input_size": {}}, "input_size"),
        ({"input_size": 10**400}, "input_size"),
        ({"arrival_ms": None}, "arrival_ms"),
        ({"arrival_ms": {}}, "arrival_ms"),
        ({"arrival_ms": []}, "arrival_ms"),
        ({"arrival_ms": True}, "arrival_ms"),
        ({"upstream": [1]}, "upstream"),
        ({"task_run_id": 5}, "task_run_id"),
        ({"workflow": {"name": "toy", "slo_ms": "fast"}}, "workflow.slo_ms"),
        ({"workflow": {"name": "toy", "slo_ms": True}}, "workflow.slo_ms"),
        ({"workflow": {"name": "toy", "slo_ms": 10**400}}, "workflow.slo_ms"),
        ({"workflow": {"name": "", "slo_ms": 800}}, "workflow name"),
        ({"workflow": {"name": "toy", "slo_ms": 800, "edges": [["a", "b"], ["b", "a"]]}}, "cycle"),
        ({"workflow": {"name": "toy", "slo_ms": 800, "edges": [["a", ""]]}}, "workflow.edges"),
        ({"workflow": {"name": "toy", "slo_ms": 800, "stages": "inc"}}, "workflow.stages"),
        ({"item": {"__esg__": "ndarray", "dtype": "float32", "shape": [2], "data": "AAAA"}}, "field 'item'"),
        ({"item": {"__esg__": "tensor", "dtype": "float32", "shape": [-1], "data": ""}}, "field 'item'"),
    ],
)
def test_wrong_field_types_are_400_naming_the_field(pool: Pool, over: dict[str, Any], needle: str) -> None:
    resp = http(PoolService(pool, ["tests"], TOKEN)).post("/v1/calls", json=toy_body(50, **over))
    assert resp.status_code == 400 and needle in resp.json()["error"], resp.text


def test_deeply_nested_json_is_a_400(pool: Pool) -> None:
    raw = b'{"item": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    resp = http(PoolService(pool, ["tests"], TOKEN)).post("/v1/calls", content=raw)
    assert resp.status_code == 400 and "nested" in resp.json()["error"]


def test_a_cyclic_declaration_leaves_the_workflow_usable(pool: Pool) -> None:
    client = http(PoolService(pool, ["tests"], TOKEN))
    cyc = {"name": "fresh", "slo_ms": 800, "edges": [["double", "inc"], ["inc", "double"]]}
    assert client.post("/v1/calls", json=toy_body(60, workflow=cyc)).status_code == 400
    ok = {"name": "fresh", "slo_ms": 800, "edges": [["double", "inc"]]}
    assert parse_result(client.post("/v1/calls", json=toy_body(61, workflow=ok)).json()).output == 62


def test_another_slo_for_a_workflow_is_a_409(pool: Pool) -> None:
    client = http(PoolService(pool, ["tests"], TOKEN))
    assert client.post("/v1/calls", json=toy_body(70)).status_code == 200
    other = {"name": "toy", "slo_ms": 5, "edges": [["double", "inc"]]}
    resp = client.post("/v1/calls", json=toy_body(71, workflow=other))
    assert resp.status_code == 409 and "slo_ms=800" in resp.json()["error"]


# ---- 7. a call id is bound to its call -------------------------------------------------------


def test_a_call_id_reused_with_another_input_is_a_409(tmp_path: Path, pool: Pool) -> None:
    client = http(PoolService(pool, ["tests"], TOKEN, ResultCache(tmp_path / "r.db")))
    assert parse_result(client.post("/v1/calls", json=toy_body(80, call_id="bound")).json()).output == 81
    assert parse_result(client.post("/v1/calls", json=toy_body(80, call_id="bound")).json()).output == 81
    other = toy_body(80, call_id="bound", item=5)
    resp = client.post("/v1/calls", json=other)
    assert resp.status_code == 409 and "'bound'" in resp.json()["error"]
    resp = client.post("/v1/calls", json=toy_body(80, call_id="bound", run_id="someone-else"))
    assert resp.status_code == 409


# ---- 9. tokens ---------------------------------------------------------------------------------


@pytest.mark.parametrize("token", [" ", "short", "has a space in it xx", " padded-token-of-many-chars "])
def test_weak_tokens_are_refused(token: str, pool: Pool) -> None:
    with pytest.raises(InvalidInputError, match="at least 16 characters"):
        check_token(token)
    with pytest.raises(InvalidInputError, match="at least 16 characters"):
        PoolService(pool, ["tests"], token)
    with pytest.raises(InvalidInputError):
        check_bind("0.0.0.0", token)
    check_token(TOKEN)


# ---- 10. limits and small things -------------------------------------------------------------


def test_a_body_without_content_length_is_cut_off_while_it_streams(pool: Pool) -> None:
    service = PoolService(pool, ["tests"], TOKEN, max_body_bytes=1000)
    app = service.app()
    sent = {"chunks": 0}
    replies: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        sent["chunks"] += 1
        return {"type": "http.request", "body": b"x" * 100, "more_body": sent["chunks"] < 1000}

    async def send(message: dict[str, Any]) -> None:
        replies.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/calls",
        "raw_path": b"/v1/calls",
        "query_string": b"",
        "headers": [(b"authorization", f"Bearer {TOKEN}".encode())],
        "http_version": "1.1",
        "scheme": "http",
        "server": ("127.0.0.1", 4270),
        "client": ("127.0.0.1", 5000),
        "root_path": "",
    }
    asyncio.run(app(scope, receive, send))  # type: ignore[arg-type]
    assert replies[0]["status"] == 413
    assert sent["chunks"] <= 11  # stopped reading at the limit, not after 100 kB


def test_limits_and_names(pool: Pool) -> None:
    client = http(PoolService(pool, ["tests"], TOKEN, max_pending=0))
    for bad in ("-1", "0", "abc", "10001"):
        resp = client.get(f"/v1/batches?limit={bad}")
        assert resp.status_code == 400 and "limit must be" in resp.json()["error"]
    assert client.get("/v1/batches?limit=5").status_code == 200
    afters = {client.post("/v1/calls", json=toy_body(90 + i)).headers["retry-after"] for i in range(40)}
    assert afters <= {"1", "2", "3"} and len(afters) > 1  # jittered
    assert client.post("/v1/calls", json={**toy_body(99), "stage": ""}).status_code == 429  # a full pool reads no body
    resp = http(PoolService(pool, ["tests"], TOKEN)).post("/v1/calls", json={**toy_body(99), "stage": ""})
    assert resp.status_code == 400 and "'stage'" in resp.json()["error"]


# ---- 5. retention ------------------------------------------------------------------------------


def test_stored_outcomes_expire_and_stay_under_their_byte_budget(tmp_path: Path) -> None:
    now = {"t": 1000.0}
    cache = ResultCache(tmp_path / "r.db", ttl_s=60, max_bytes=10_000, clock=lambda: now["t"])
    big = {"ok": True, "result": {"output": "y" * 3000}}
    for i in range(10):
        cache.put(f"c{i}", big, "d")
        now["t"] += 1
    assert cache.stored_bytes() <= 10_000
    assert cache.get("c0") is None and cache.get("c9") is not None  # the oldest went first
    now["t"] += 61
    assert cache.get("c9") is None  # past its TTL: not served...
    cache.put("late", {"ok": True}, "d")
    assert cache.stored_bytes() == len(json.dumps({"ok": True}))  # ...and deleted at the next store
    cache.close()
    assert (tmp_path / "r.db").stat().st_mode & 0o077 == 0  # stage outputs: the owner's alone
    reopened = ResultCache(tmp_path / "r.db", ttl_s=60, max_bytes=10_000, clock=lambda: now["t"])
    assert reopened.stored_bytes() == len(json.dumps({"ok": True})) and reopened.get("late") == ({"ok": True}, "d")


# ---- fuzz: no 500 and no hang for any body ---------------------------------------------------------


def _with_deadline(fn: Any, seconds: float) -> Any:
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        return ex.submit(fn).result(seconds)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=12,
)
_fields = st.sampled_from(
    [
        "call_id",
        "stage",
        "stage_path",
        "request_id",
        "run_id",
        "item",
        "upstream",
        "arrival_ms",
        "input_size",
        "task_run_id",
        "deployment_id",
        "workflow",
    ]
)


# No deadline and no "too slow" health check: a loaded machine makes examples slow, not wrong.
@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(changes=st.dictionaries(_fields, _json, max_size=4), drop=st.lists(_fields, max_size=2), i=st.integers(0, 50))
def test_any_body_gets_an_answer_that_is_not_a_500(
    pool: Pool, changes: dict[str, Any], drop: list[str], i: int
) -> None:
    b = toy_body(i, call_id=f"fz-{i}-{json.dumps(changes, sort_keys=True)}-{drop}")
    b.update(changes)
    for name in drop:
        b.pop(name, None)
    service = PoolService(pool, ["tests"], TOKEN, max_pending=50)
    raw = json.dumps(b).encode()  # NaN and Infinity as Python writes them: the service must cope
    resp = _with_deadline(lambda: http(service).post("/v1/calls", content=raw), 30)
    assert resp.status_code in (200, 400, 403, 404, 409), resp.text
    assert service._inflight == {}


# ---- the CLI: TLS and weak tokens, on a real server ----------------------------------------------


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


def _serve_cmd(port: int, profile: Path, *extra: str) -> list[str]:
    import sys

    return [
        sys.executable,
        "-m",
        "esg_prefect.cli",
        "pool",
        "serve",
        "--allow",
        "tests",
        "--port",
        str(port),
        "--backend",
        "inline",
        "--profile",
        str(profile),
        "--store",
        "off",
        "--no-artifacts",
        *extra,
    ]


@pytest.mark.service
def test_the_service_serves_https_and_refuses_a_weak_token(tmp_path: Path) -> None:
    import os
    import socket
    import ssl
    import subprocess
    import time

    import httpx

    root = Path(__file__).resolve().parent.parent
    profile = tmp_path / "toy.csv"
    toy_profile().to_csv(profile)
    cert, key = _self_signed(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    weak = subprocess.run(
        _serve_cmd(port, profile),
        cwd=root,
        env={**os.environ, "ESG_PREFECT_TOKEN": "short"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert weak.returncode == 2 and "at least 16 characters" in weak.stderr and "Traceback" not in weak.stderr
    env = {**os.environ, "ESG_PREFECT_TOKEN": TOKEN}
    proc = subprocess.Popen(
        _serve_cmd(port, profile, "--ssl-certfile", str(cert), "--ssl-keyfile", str(key)), cwd=root, env=env
    )
    try:
        url = f"https://localhost:{port}"
        trust = ssl.create_default_context(cafile=str(cert))
        with httpx.Client(base_url=url, verify=trust, headers={"Authorization": f"Bearer {TOKEN}"}) as tls:
            give_up = time.monotonic() + 180  # a ceiling on a condition: the service starts slowly under load
            while time.monotonic() < give_up and proc.poll() is None:
                try:
                    if tls.get("/healthz", timeout=5).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.1)
            resp = tls.post("/v1/calls", json=toy_body(7, call_id="tls-7"), timeout=60)
            assert resp.status_code == 200 and parse_result(resp.json()).output == 8
        with pytest.raises(httpx.HTTPError):  # plain HTTP is not spoken on that port
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).raise_for_status()
    finally:
        proc.terminate()
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_an_answer_leaves_only_once_its_batch_is_in_the_cost_store() -> None:
    """A service killed right after answering must not leave an answered call without its cost."""
    import threading

    pool = Pool(toy_profile(), PriceSheet(1e-5, {}), backend=InlineBackend())
    stored: list[str] = []
    gate = threading.Event()

    def slow_store(batches: Any) -> None:
        gate.wait(10)  # a store that takes its time
        stored.extend(c.call_id for b in batches for c in b.calls)

    pool.add_batch_listener(slow_store)
    try:
        service = PoolService(pool, ["tests"], TOKEN)
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            fut = ex.submit(lambda: http(service).post("/v1/calls", json=toy_body(7, call_id="durable")))
            with pytest.raises(concurrent.futures.TimeoutError):
                fut.result(0.5)  # held while the store has not got it
            gate.set()
            resp = fut.result(30)
        assert resp.status_code == 200 and parse_result(resp.json()).output == 8 and "durable" in stored
    finally:
        pool.close()


def test_pool_serve_applies_its_set_overrides_to_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """``esg-prefect pool serve --set KEY=VALUE`` reaches the pool's settings; the rest stay the defaults."""
    import uvicorn

    from esg_prefect.cli import main
    from esg_prefect.scheduling import ESGSettings

    served: list[Any] = []

    def fake_run(server: Any, sockets: Any = None) -> None:  # the service's server, not run: nothing binds
        server.started = True
        served.append(server.config)

    made: list[Any] = []
    import esg_prefect.runtime.pool as pool_module

    real_init = pool_module.Pool.__init__

    def spy_init(self: Any, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(uvicorn.Server, "run", fake_run)
    monkeypatch.setattr(pool_module.Pool, "__init__", spy_init)
    argv = ["pool", "serve", "--allow", "x", "--backend", "inline", "--store", "off", "--no-artifacts"]
    assert main([*argv, "--set", "keep_alive_s=7", "--set", "max_batch_wait_ms=20"]) in (0, None)
    assert served and len(made) == 1
    got, default = made[0].settings, ESGSettings()
    assert (got.keep_alive_s, got.max_batch_wait_ms) == (7.0, 20.0)
    assert got.percentile == default.percentile and got.idle_aware == default.idle_aware


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens there once the socket closes


def test_a_client_whose_service_never_answered_gives_up_after_the_grace(caplog: pytest.LogCaptureFixture) -> None:
    from esg_prefect.exceptions import PoolClosedError
    from esg_prefect.service.client import PoolClient

    address = f"http://127.0.0.1:{_closed_port()}"
    client = PoolClient(address, deadline_s=600.0, connect_grace_s=0.5)
    call = StageCall("c1", "inc", "tests.toy_stages:inc", WorkflowDecl("toy", 800), "r", "r", 1)
    try:
        with caplog.at_level("WARNING", logger="esg_prefect.service.client"):
            futs = [client.submit(call), client.submit(call)]
            for fut in futs:
                with pytest.raises(PoolClosedError, match=rf"no pool service answers at {address}.*pool serve"):
                    fut.result(60)  # well inside the 600 s deadline: the grace applies
        warnings = [r.getMessage() for r in caplog.records if "no pool service answers" in r.getMessage()]
        assert len(warnings) == 1 and address in warnings[0]  # once, not per call or per retry
    finally:
        client.close()


def test_a_client_whose_service_answered_once_retries_to_its_deadline() -> None:
    from esg_prefect.exceptions import PoolClosedError
    from esg_prefect.service.client import PoolClient

    client = PoolClient(f"http://127.0.0.1:{_closed_port()}", deadline_s=1.0, connect_grace_s=0.0)
    client._answered = True  # as after a first answer: the service may be restarting
    call = StageCall("c1", "inc", "tests.toy_stages:inc", WorkflowDecl("toy", 800), "r", "r", 1)
    try:
        with pytest.raises(PoolClosedError, match=r"gave the call no answer for 1 s \(ConnectError"):
            client.submit(call).result(60)
    finally:
        client.close()
