"""Who may drive the pool service, and what one client can do to the others.

Each test failed on the code before its fix (a security review's findings): a
web page could pause a tokenless service or read its metrics through a
rebound host name; one call's SLO of 1e308 failed every waiting call of every
client; tokens an HTTP header cannot carry were accepted; a full pool read
whole bodies before refusing them; the client raised on a ``Retry-After`` date
and on an answer of the wrong shape. The service's address is checked by one rule
wherever it is given (``http://``, with no host, passed the client and the runner).
"""

from __future__ import annotations

import sys
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from esg_prefect.control.calls import StageCall, WorkflowDecl
from esg_prefect.exceptions import InvalidInputError, StageFailedError, StageRejectedError
from esg_prefect.runtime.pool import Pool
from esg_prefect.service.address import address_error, check_address
from esg_prefect.service.app import PoolService, check_bind, check_token
from esg_prefect.service.client import PoolClient, _retry_after_s
from tests.toy_calls import toy_body, toy_call

TOKEN = "a-token-of-thirty-two-characters"
LOCAL = "http://127.0.0.1:4270"


# ---- browsers and foreign host names, on a service with no token ---------------------------------


@pytest.mark.parametrize("base", [LOCAL, "http://localhost:4270", "http://[::1]:4270"])
def test_a_tokenless_service_serves_local_callers(pool: Pool, base: str) -> None:
    client = TestClient(PoolService(pool, ["tests"]).app(), base_url=base)
    resp = client.post("/v1/calls", json=toy_body(1))
    assert resp.status_code == 200 and resp.json()["result"]["output"] == 2


def test_a_tokenless_service_refuses_web_pages(pool: Pool) -> None:
    client = TestClient(PoolService(pool, ["tests"]).app(), base_url=LOCAL)
    resp = client.post("/v1/pause", headers={"Origin": "http://evil.example"})
    assert resp.status_code == 403 and "web pages" in resp.json()["error"]
    assert not pool.paused  # refused before it reached the pool
    resp = client.post("/v1/calls", json=toy_body(2), headers={"Origin": "null", "Content-Type": "text/plain"})
    assert resp.status_code == 403


def test_a_tokenless_service_refuses_a_rebound_host_name(pool: Pool) -> None:
    client = TestClient(PoolService(pool, ["tests"]).app(), base_url="http://rebind.evil.example:4270")
    resp = client.get("/metrics")
    assert resp.status_code == 403 and "'rebind.evil.example:4270'" in resp.json()["error"]
    assert client.get("/healthz").status_code == 403


def test_with_a_token_any_host_name_serves_and_the_token_decides(pool: Pool) -> None:
    app = PoolService(pool, ["tests"], TOKEN).app()
    client = TestClient(app, base_url="http://pool.example.org:4270")
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


@pytest.mark.parametrize("token", [None, TOKEN])
def test_websockets_are_closed(pool: Pool, token: str | None) -> None:
    client = TestClient(PoolService(pool, ["tests"], token).app(), base_url=LOCAL)
    with pytest.raises(WebSocketDisconnect), client.websocket_connect("/v1/calls") as ws:
        ws.receive_text()


# ---- tokens and binds --------------------------------------------------------------------------


@pytest.mark.parametrize("token", ["pässwörd-pässwörd-1", "a-token-with\na-newline-in-it", "tab\tseparated-token-x"])
def test_tokens_a_header_cannot_carry_are_refused(token: str) -> None:
    with pytest.raises(InvalidInputError, match="printable ASCII") as err:
        check_token(token)
    assert token not in str(err.value)  # never echoed, nor any of its characters
    assert "with a control or non-ASCII character" in str(err.value)
    assert not any(c in str(err.value) for c in "äö\n\t")


def test_a_token_with_a_space_is_told_so() -> None:
    with pytest.raises(InvalidInputError, match=r"got 21 characters, with a space\)"):
        check_token("abc def ghi jkl mno p")


@pytest.mark.parametrize("host", ["[::1]", "LOCALHOST", "::1"])
def test_loopback_names_need_no_token(host: str) -> None:
    check_bind(host, None)


# ---- the service's address ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("localhost:4270", "not an http(s) URL with a host"),
        ("http://", "not an http(s) URL with a host"),
        ("ftp://127.0.0.1:4270", "not an http(s) URL with a host"),
        ("http://127.0.0.1:4270\n", "non-printable ASCII character"),
        (4270, "not a string but int"),
    ],
)
def test_a_bad_address_is_refused_alike_by_the_client_and_the_runner(address: Any, why: str) -> None:
    """One rule in three places (runner, client, deployments/serve.py): ``http://`` passed the client's and runner's."""
    from esg_prefect import ESGTaskRunner

    for make in (PoolClient, lambda a: ESGTaskRunner(address=a)):
        with pytest.raises(InvalidInputError) as err:
            make(address)
        line = str(err.value)
        assert line.startswith("address: ") and why in line.split(";")[0] and line.endswith(f"got {address!r}"), line
        assert "\n" not in line and LOCAL in line  # one line, with an address that works


@pytest.mark.parametrize("address", [LOCAL, "https://pool.example:8443/", "HTTP://[::1]:4270"])
def test_an_http_url_with_a_host_is_an_address(address: str) -> None:
    assert address_error(address) is None
    check_address(address)


# ---- one client cannot fail the others ---------------------------------------------------------


def test_an_slo_past_a_week_is_refused_and_the_other_calls_run(pool: Pool) -> None:
    client = TestClient(PoolService(pool, ["tests"], TOKEN).app(), headers={"Authorization": f"Bearer {TOKEN}"})
    huge = toy_body(3, workflow={"name": "toyP", "slo_ms": 1e308, "edges": None, "stages": []})
    resp = client.post("/v1/calls", json=huge)
    assert resp.status_code == 400 and "slo_ms" in resp.json()["error"] and "1e+308" in resp.json()["error"]
    resp = client.post("/v1/calls", json=toy_body(4))
    assert resp.status_code == 200 and resp.json()["result"]["output"] == 5


def test_a_full_pool_or_byte_budget_refuses_before_decoding(pool: Pool) -> None:
    service = PoolService(pool, ["tests"], TOKEN, max_reading_bytes=100)
    client = TestClient(service.app(), headers={"Authorization": f"Bearer {TOKEN}"})
    resp = client.post("/v1/calls", json=toy_body(5))  # longer than the 100 bytes all bodies in hand may hold
    assert resp.status_code == 429 and resp.headers["retry-after"] in {"1", "2", "3"}
    assert service._reading == 0  # the refused body gave its bytes back
    service.max_reading_bytes = 10_000
    assert client.post("/v1/calls", json=toy_body(6)).status_code == 200
    assert service._reading == 0


def test_an_import_that_exits_is_a_404_with_one_line(pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIE_ON_IMPORT", "1")
    monkeypatch.delitem(sys.modules, "tests.dies_on_import", raising=False)  # imported at collection, maybe
    client = TestClient(PoolService(pool, ["tests"], TOKEN).app(), headers={"Authorization": f"Bearer {TOKEN}"})
    resp = client.post("/v1/calls", json=toy_body(7, stage_path="tests.dies_on_import:inc"))
    assert resp.status_code == 404 and "SystemExit" in resp.json()["error"]
    assert "\n" not in resp.json()["error"]


# ---- the client reads answers defensively ------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("2", 2.0),
        ("Wed, 21 Oct 2026 07:28:00 GMT", 0.4),
        ("nan", 0.4),
        ("-1", 0.2),
        ("0", 0.2),  # a proxy's 0: no busy loop (the backoff doubles the last wait)
        ("1e9", 60.0),
        (None, 0.4),
    ],
)
def test_retry_after_values(value: str | None, seconds: float) -> None:
    assert _retry_after_s(value, 0.4) == seconds


def _client_answering(answers: list[httpx.Response]) -> PoolClient:
    client = PoolClient(LOCAL, deadline_s=5.0, threads=1)

    def handler(request: httpx.Request) -> httpx.Response:
        return answers.pop(0)

    client._http = httpx.Client(base_url=LOCAL, transport=httpx.MockTransport(handler))
    return client


def test_the_client_retries_past_an_http_date_and_rejects_a_malformed_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("esg_prefect.service.client.time.sleep", lambda s: None)
    answers = [
        httpx.Response(429, headers={"Retry-After": "Wed, 21 Oct 2026 07:28:00 GMT"}, json={"error": "full"}),
        httpx.Response(200, json={"ok": True, "result": {"output": 1}}),
    ]
    client = _client_answering(answers)
    call = toy_call(8)
    with pytest.raises(StageRejectedError, match=r"cannot read .*KeyError"):
        client.submit(call).result(10)
    assert answers == []  # the 429 was retried, not raised
    client.close()


def test_the_client_still_raises_the_stages_own_error() -> None:
    error = {"type": "StageFailedError", "message": "boom", "error_type": "ValueError", "traceback": "tb"}
    client = _client_answering([httpx.Response(200, json={"ok": False, "error": error})])
    call = toy_call(9)
    with pytest.raises(StageFailedError, match="boom"):
        client.submit(call).result(10)
    client.close()


def test_a_loopback_client_ignores_proxy_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    local, remote = PoolClient(LOCAL), PoolClient("http://pool.example.org:4270")
    assert local._http._trust_env is False and remote._http._trust_env is True
    local.close()
    remote.close()


def test_a_long_chain_is_no_recursion_error() -> None:
    chain = tuple((f"s{i}", f"s{i + 1}") for i in range(3000))  # the old depth-first search recursed per stage
    assert WorkflowDecl("long", 800, chain).graph() is not None
    with pytest.raises(InvalidInputError, match="edges form a cycle s0 -> s1 -> "):
        WorkflowDecl("long", 800, (*chain, ("s3000", "s0")))


def test_the_client_warns_once_per_outage_of_a_service_that_answered(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("esg_prefect.service.client.time.sleep", lambda s: None)
    error = {"type": "StageFailedError", "message": "boom", "error_type": "ValueError", "traceback": ""}
    steps: list[Any] = [
        httpx.Response(429, json={"error": "full"}),  # the service answers: it exists
        httpx.ConnectError("refused"),  # then it restarts: the flow's log should say why it waits
        httpx.ConnectError("refused"),
        httpx.Response(200, json={"ok": False, "error": error}),
    ]
    client = PoolClient(LOCAL, deadline_s=5.0, threads=1)

    def handler(request: httpx.Request) -> httpx.Response:
        step = steps.pop(0)
        if isinstance(step, Exception):
            raise step
        return step

    client._http = httpx.Client(base_url=LOCAL, transport=httpx.MockTransport(handler))
    caplog.set_level("WARNING", logger="esg_prefect.service.client")
    call = toy_call(10)
    with pytest.raises(StageFailedError):
        client.submit(call).result(10)
    outage = [r.getMessage() for r in caplog.records if "does not answer" in r.getMessage()]
    assert len(outage) == 1 and LOCAL in outage[0] and "retrying until 5 s" in outage[0]
    client.close()


def test_a_cancelled_call_is_withdrawn_through_the_service(pool: Pool) -> None:
    # Before, a task timeout through the pool service left its call queued; it ran later, billed, for no one.
    import threading

    client = TestClient(PoolService(pool, ["tests"], TOKEN).app(), headers={"Authorization": f"Bearer {TOKEN}"})
    pool.pause()
    answer: list[Any] = []
    waiting = threading.Thread(target=lambda: answer.append(client.post("/v1/calls", json=toy_body(11))))
    waiting.start()
    for _ in range(200):  # until the call is queued
        if any(pool.snapshot().queue_depths.values()):
            break
        threading.Event().wait(0.05)
    assert client.post("/v1/calls/c11/cancel").json() == {"ok": True}
    waiting.join(30)
    assert answer and answer[0].json()["ok"] is False and "cancelled" in answer[0].json()["error"]["message"]
    assert not any(pool.snapshot().queue_depths.values())
    pool.resume()


def test_a_stage_of_the_script_being_run_is_refused_saying_how_to_serve_it() -> None:
    """It reached the service, which answered 403 "stage path '__main__:encode' is outside the allowed
    modules ['mypipe']", though --allow named the script's own module: nothing said why."""
    toy = WorkflowDecl("toy", 800, (("encode", "head"),))
    client = PoolClient("http://127.0.0.1:9")  # never asked
    try:
        fut = client.submit(StageCall("c1", "encode", "__main__:encode", toy, "r1", "r1", 3))
        with pytest.raises(StageRejectedError, match="stage 'encode' is defined in the script being run") as info:
            fut.result(5)
        assert "define the stages in a module of their own" in str(info.value)
        assert "--allow stages" in str(info.value)
    finally:
        client.close()


def test_retry_jitter_leaves_the_global_random_state_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The jitter drew from the global ``random``: a pool thread moved the state of a user's seeded ``random``."""
    import random

    from esg_prefect.service.shutdown import retry_after

    monkeypatch.setattr("esg_prefect.service.client.time.sleep", lambda s: None)
    state = random.getstate()
    assert 1 <= int(retry_after()["Retry-After"]) <= 3
    client = _client_answering(
        [
            httpx.Response(429, headers={"Retry-After": "0"}, json={"error": "full"}),
            httpx.Response(200, json={"ok": True}),
        ]
    )
    with pytest.raises(StageRejectedError):
        client.submit(toy_call(10)).result(10)
    client.close()
    assert random.getstate() == state
