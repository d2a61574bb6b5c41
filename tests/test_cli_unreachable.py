"""What is not there is one line naming it: a Prefect API, pool service, port or database that does not answer.

The other half of test_cli_errors.py (a bad value, an unknown name, a missing
file): each command and flow script that talks to something outside, against
nothing there or something that does not answer, ends in one line naming the
address and how to start what is missing, never a traceback or a long wait.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from esg_prefect.cli import main
from esg_prefect.exceptions import InvalidInputError
from esg_prefect.integration.api_check import api_error, check_prefect_api, prefect_api_url
from tests.prefect_server import free_port, health_only_api

REPO = Path(__file__).resolve().parents[1]


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def dead_api(monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"http://127.0.0.1:{free_port()}/api"
    monkeypatch.setenv("PREFECT_API_URL", url)
    return url


def test_the_demo_against_an_unreachable_api_is_one_line(dead_api: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--requests", "2"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert dead_api in line and "prefect server start" in line


def test_profile_as_a_flow_against_an_unreachable_api_is_one_line(
    dead_api: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["profile", "--flow", "--quick"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert dead_api in line and "prefect server start" in line


@pytest.mark.parametrize("script", sorted(p.name for p in (REPO / "flows").glob("*.py")))
def test_flow_scripts_against_an_unreachable_api_are_one_line_within_10_s(script: str) -> None:
    url = f"http://127.0.0.1:{free_port()}/api"
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(REPO / "flows" / script), "--requests", "2"],
        env={**os.environ, "PREFECT_API_URL": url},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    elapsed = time.monotonic() - t0
    assert done.returncode == 2, done.stderr
    line = _one_line(done.stderr)
    assert url in line and "prefect server start" in line
    assert elapsed < 10.0, f"{script} took {elapsed:.1f} s to refuse"


@pytest.fixture
def live_api() -> Iterator[str]:
    with health_only_api() as url:
        yield url


def test_an_api_that_answers_passes_the_check(live_api: str) -> None:
    check_prefect_api(live_api)
    check_prefect_api(live_api + "/")
    check_prefect_api(None)  # no URL: Prefect starts its own API, nothing to check


def test_an_api_that_answers_with_an_error_is_refused(live_api: str) -> None:
    with pytest.raises(InvalidInputError, match="HTTPStatusError"):
        check_prefect_api(live_api.removesuffix("/api") + "/elsewhere")


def test_api_error_is_the_checks_message_or_none(live_api: str) -> None:
    """The wording a refusal (deployments/serve.py) or a warning (``pool serve``) puts in its own line."""
    assert api_error(live_api) is None and api_error(None) is None
    elsewhere = live_api.removesuffix("/api") + "/elsewhere"
    with pytest.raises(InvalidInputError) as info:
        check_prefect_api(elsewhere, remedy="do this")
    assert api_error(elsewhere, remedy="do this") == str(info.value) and str(info.value).endswith(": do this")


def test_an_api_that_accepts_but_never_answers_is_refused_within_the_timeout() -> None:
    with socket.socket() as s:  # listens (the kernel completes connections) but never reads or answers
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        url = f"http://127.0.0.1:{s.getsockname()[1]}/api"
        t0 = time.monotonic()
        with pytest.raises(InvalidInputError, match="ReadTimeout") as info:
            check_prefect_api(url, timeout_s=0.5)
        assert time.monotonic() - t0 < 5.0
    assert url in str(info.value) and "\n" not in str(info.value)


def test_the_api_url_comes_from_the_environment_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFECT_API_URL", "http://example.invalid:4200/api")
    assert prefect_api_url() == "http://example.invalid:4200/api"


def test_pool_admin_against_no_service_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    assert main(["pool", "pause", "--url", f"http://127.0.0.1:{port}"]) == 1
    line = _one_line(capsys.readouterr().err)
    assert f"127.0.0.1:{port}" in line and "esg-prefect pool serve" in line


@pytest.mark.parametrize("command", [["pool", "status"], ["pool", "pause"], ["pool", "resume"]])
def test_pool_admin_takes_address_as_the_runner_names_it(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """``ESGTaskRunner(address=...)`` names the service's address; ``--address`` was refused as no such option."""
    port = free_port()
    assert main([*command, "--address", f"http://127.0.0.1:{port}"]) == 1
    assert f"127.0.0.1:{port}" in _one_line(capsys.readouterr().err)  # reached for, not refused as an option


def test_pool_admin_finds_the_service_in_esg_prefect_pool_url(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    monkeypatch.setenv("ESG_PREFECT_POOL_URL", f"http://127.0.0.1:{port}")
    assert main(["pool", "resume"]) == 1
    assert f"127.0.0.1:{port}" in _one_line(capsys.readouterr().err)  # the one named, not the default


@pytest.mark.parametrize("command", [["pool", "status"], ["pool", "pause"], ["pool", "resume"]])
@pytest.mark.parametrize("given", ["option", "environment"])
def test_pool_admin_refuses_an_address_that_is_no_url_as_a_bad_value(
    command: list[str], given: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--url 127.0.0.1:4270`` was 'could not reach the pool service ... (Request URL is missing an
    'http://' or 'https://' protocol.): start it with `esg-prefect pool serve`': a service to start, not a
    value to correct."""
    if given == "option":
        argv = [*command, "--url", "127.0.0.1:4270"]
    else:
        monkeypatch.setenv("ESG_PREFECT_POOL_URL", "127.0.0.1:4270")
        argv = command
    assert main(argv) == 2
    line = _one_line(capsys.readouterr().err)
    assert line == (
        "esg-prefect: error: Invalid value for --url (or ESG_PREFECT_POOL_URL): not an http(s) URL with a host; "
        "give the pool service's address, e.g. http://127.0.0.1:4270, got '127.0.0.1:4270'"
    ), line


def test_pool_serve_names_an_allow_prefix_no_module_answers_to() -> None:
    from esg_prefect.cli.pool import unimportable

    assert unimportable(["esg_prefect.examples", "tests", "no_such_module_xyz.stages", "bad-name", "json"]) == [
        "no_such_module_xyz.stages",
        "bad-name",
    ]


def test_pool_serve_on_a_port_in_use_is_one_line_before_anything_starts(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["pool", "serve", "--allow", "tests", "--port", str(port)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "--port" in line and f"cannot listen on 127.0.0.1:{port}" in line and "in use" in line, line


def test_pool_serve_with_an_unreachable_store_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """A PostgreSQL cost store that does not answer: one line naming --store (password masked), not 500 of traceback."""
    pytest.importorskip("psycopg")
    url = f"postgresql://esg:secretpw@127.0.0.1:{free_port()}/costs"
    argv = ["pool", "serve", "--allow", "x", "--backend", "inline", "--port", str(free_port()), "--store", url]
    assert main(argv) == 2
    line = _one_line(capsys.readouterr().err)
    assert "--store" in line and "127.0.0.1" in line and "secretpw" not in line, line


@pytest.mark.parametrize(
    ("api_url", "artifacts", "warned"),
    [("", [], True), ("live", [], False), ("", ["--no-artifacts"], False)],
)
def test_pool_serve_warns_where_its_cost_artifacts_would_go_to_a_temporary_api(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    api_url: str,
    artifacts: list[str],
    warned: bool,
) -> None:
    """Without PREFECT_API_URL the service's artifacts and tags land on a temporary API no flow reports to."""
    import uvicorn

    from esg_prefect.integration import api_check

    ran: list[object] = []

    def fake_run(server: uvicorn.Server, sockets: object = None) -> None:  # nothing binds
        server.started = True
        ran.append(server.config.app)

    monkeypatch.setattr(uvicorn.Server, "run", fake_run)
    with health_only_api() as live:
        monkeypatch.setattr(api_check, "prefect_api_url", lambda: live if api_url == "live" else api_url or None)
        argv = ["pool", "serve", "--allow", "tests", "--port", str(free_port()), "--store", "off", *artifacts]
        assert main(argv) == 0
    assert len(ran) == 1
    err = capsys.readouterr().err
    assert ("warning: no Prefect API is set (PREFECT_API_URL)" in err) is warned, err
    assert "does not answer" not in err, err
    if warned:  # in one line, which says what to run to see them in the UI
        (line,) = [ln for ln in err.splitlines() if "PREFECT_API_URL" in ln]
        assert "temporary Prefect API that this service starts and that ends with it" in line, line
        assert "run `prefect server start` and set PREFECT_API_URL to it for this service and your flows" in line
        assert "--no-artifacts" in line, line


def test_pool_serve_warns_in_one_line_where_its_prefect_api_does_not_answer(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], dead_api: str
) -> None:
    """It started without a word; the runs' logs then said their cost was published as an artifact, and the
    service's first failed post, minutes later, was the first sign that none would reach the UI."""
    import uvicorn

    def fake_run(server: uvicorn.Server, sockets: object = None) -> None:  # nothing binds
        server.started = True

    monkeypatch.setattr(uvicorn.Server, "run", fake_run)
    assert main(["pool", "serve", "--allow", "tests", "--port", str(free_port()), "--store", "off"]) == 0
    (line,) = [ln for ln in capsys.readouterr().err.splitlines() if "PREFECT_API_URL" in ln]
    assert line.startswith(f"warning: the Prefect API at PREFECT_API_URL={dead_api} does not answer (ConnectError)")
    assert "each run's cost artifacts and tags will not reach it until it does" in line, line
    assert "--no-artifacts" in line, line
