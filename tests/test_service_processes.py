"""The pool service with flow runs in separate processes: pooling across processes, and a service restart."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from esg_prefect.control.calls import StageCall, WorkflowDecl
from esg_prefect.service.client import PoolClient

pytestmark = [pytest.mark.service, pytest.mark.usefixtures("prefect_harness")]
ROOT = Path(__file__).resolve().parent.parent
TOKEN = "t0ken-for-tests-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_service(
    port: int, results_db: Path, extra_env: dict[str, str] | None = None, stderr: Any = None
) -> subprocess.Popen[bytes]:
    env = {**os.environ, "ESG_PREFECT_TOKEN": TOKEN, **(extra_env or {})}
    cmd = [
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
        str(results_db.parent / "toy_profile.csv"),  # the toy_profile_csv fixture's, in the test's tmp_path
        "--results-db",
        str(results_db),
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=stderr)
    give_up = time.monotonic() + 180  # a ceiling on a condition: importing torch and Prefect is slow under load
    while time.monotonic() < give_up and proc.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    proc.wait()
    raise RuntimeError(f"the pool service did not start (exit code {proc.returncode})")


def stop_service(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT, as Ctrl-C; wait for the service to exit (a generous ceiling), else kill it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
    proc.wait()


def wait_until(condition: Callable[[], bool], what: str, procs: Sequence[subprocess.Popen[bytes]] = ()) -> None:
    """Wait for ``condition()``: a ceiling of 300 s, and an early failure if one of ``procs`` exits."""
    give_up = time.monotonic() + 300
    while not condition():
        exited = [p.returncode for p in procs if p.poll() is not None]
        assert not exited, f"a client process exited ({exited}) before {what}"
        assert time.monotonic() < give_up, f"no {what} within 300 s"
        time.sleep(0.1)


@pytest.fixture
def toy_profile_csv(tmp_path: Path) -> None:
    """The toy profile as a CSV in the test's own tmp_path: tests in parallel workers each have theirs
    (one shared file under tests/ was removed by one test's teardown while another's service read it)."""
    from tests.toy_stages import toy_profile

    toy_profile().to_csv(tmp_path / "toy_profile.csv")


@pytest.mark.usefixtures("toy_profile_csv")
def test_sigterm_stops_the_service_after_its_cleanup(tmp_path: Path) -> None:
    """uvicorn raised a captured SIGTERM again once serving stopped, so the process died (143) before the
    pool and its stores were closed: no 'stopped' line, the cost store's last records lost."""
    log = tmp_path / "serve.err"
    with log.open("wb") as err:
        service = start_service(free_port(), tmp_path / "results.db", stderr=err)
        try:
            service.send_signal(signal.SIGTERM)
            assert service.wait(120) == 128 + signal.SIGTERM
        finally:
            if service.poll() is None:
                service.kill()
                service.wait()
    lines = log.read_text(errors="replace").splitlines()
    assert "stopping: no calls in flight" in lines and "esg-prefect pool service stopped" in lines


@pytest.mark.usefixtures("toy_profile_csv")
def test_batches_mix_calls_from_different_processes(tmp_path: Path) -> None:
    from prefect.settings import PREFECT_API_URL

    port = free_port()
    # The service publishes the clients' run costs to the same Prefect API as they use (without it,
    # it started a temporary API of its own, which a loaded machine's kill left running).
    api = {"PREFECT_API_URL": str(PREFECT_API_URL.value())}
    service = start_service(port, tmp_path / "results.db", api)
    n = 6  # calls of each process; more concurrent flow runs only wait out the SQLite test API's 503s
    clients: list[subprocess.Popen[bytes]] = []
    try:
        env = {**os.environ, **api}
        address = f"http://127.0.0.1:{port}"
        auth = {"Authorization": f"Bearer {TOKEN}"}
        go_dir = tmp_path / "go"
        go_dir.mkdir()
        clients = [
            subprocess.Popen(
                [sys.executable, "-m", "tests.service_client_proc", address, TOKEN, str(n), str(100 * k), str(go_dir)],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
            )
            for k in (1, 2)
        ]
        # Both processes warm up (one flow run each), then wait for the word. The service is paused
        # before it and resumed once both bursts are queued: the batches then draw on calls of both
        # processes, however far apart a loaded machine starts them.
        wait_until(lambda: len(list(go_dir.glob("ready-*"))) == 2, "both clients warmed up", clients)
        assert httpx.post(f"{address}/v1/pause", headers=auth, timeout=30).json() == {"paused": True}
        (go_dir / "go").touch()

        def queued() -> int:
            depths = httpx.get(f"{address}/metrics", headers=auth, timeout=30).json()["queue_depths"]
            return sum(d for key, d in depths.items() if key.endswith("/slow"))

        wait_until(lambda: queued() >= 2 * n, "both bursts queued", clients)
        assert httpx.post(f"{address}/v1/resume", headers=auth, timeout=30).json() == {"paused": False}
        runs_of = []
        for c in clients:
            out, _ = c.communicate(timeout=300)
            assert c.returncode == 0
            runs_of.append(set(json.loads(out.decode().strip().splitlines()[-1])))
        batches = httpx.get(f"{address}/v1/batches?limit=1000", headers=auth).json()
        mixed = [b for b in batches["batches"] if set(b["runs"]) & runs_of[0] and set(b["runs"]) & runs_of[1]]
        sizes = [(b["size"], len(b["runs"])) for b in batches["batches"]]
        assert mixed, f"some batch should hold calls from both processes; (size, runs) of each: {sizes}"
    finally:
        for c in clients:  # still waiting, should the test have failed early
            if c.poll() is None:
                c.kill()
                c.communicate()
        stop_service(service)


@pytest.mark.usefixtures("toy_profile_csv")
def test_clients_recover_when_the_service_restarts(tmp_path: Path) -> None:
    port = free_port()
    db = tmp_path / "results.db"
    service = start_service(port, db)
    client = PoolClient(f"http://127.0.0.1:{port}", TOKEN, deadline_s=120)
    try:
        decl = WorkflowDecl("toy", 800, (("double", "inc"),))
        calls = [StageCall(f"r{i}", "double", "tests.toy_stages:double", decl, f"q{i}", f"q{i}", i) for i in range(30)]
        first = client.submit(calls[0]).result(60)
        service.kill()  # the service dies while clients keep sending
        service.wait(30)
        futs = [client.submit(c) for c in calls]
        time.sleep(1.0)
        service = start_service(port, db)  # back on the same port and results file
        outs = [f.result(120) for f in futs]
        assert [o.output for o in outs] == [2 * i for i in range(30)]
        assert outs[0].batch_id == first.batch_id  # finished before the restart: its stored outcome, not a re-run
    finally:
        client.close()
        stop_service(service)


@pytest.mark.usefixtures("toy_profile_csv")
def test_pause_and_resume_from_the_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from esg_prefect.cli import app

    port = free_port()
    service = start_service(port, tmp_path / "results.db")
    address = f"http://127.0.0.1:{port}"
    metrics = f"{address}/metrics"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        monkeypatch.setenv("ESG_PREFECT_TOKEN", "wrong")
        refused = CliRunner().invoke(app, ["pool", "pause", "--url", address])
        assert refused.exit_code == 1 and "HTTP 401" in refused.output
        assert httpx.get(metrics, headers=auth).json()["paused"] is False
        monkeypatch.setenv("ESG_PREFECT_TOKEN", TOKEN)
        paused = CliRunner().invoke(app, ["pool", "pause", "--url", address])
        assert paused.exit_code == 0 and "paused" in paused.output
        assert httpx.get(metrics, headers=auth).json()["paused"] is True
        resumed = CliRunner().invoke(app, ["pool", "resume", "--url", address])
        assert resumed.exit_code == 0 and "resumed" in resumed.output
        assert httpx.get(metrics, headers=auth).json()["paused"] is False
    finally:
        stop_service(service)
    gone = CliRunner().invoke(app, ["pool", "resume", "--url", address])
    assert gone.exit_code == 1 and "could not reach the pool service" in gone.output


@pytest.mark.usefixtures("toy_profile_csv")
def test_ctrl_c_does_not_wait_out_an_open_long_poll(tmp_path: Path) -> None:
    """A call held for its caller's wait_s (here 600 s) is cut after the shutdown grace, not waited out."""
    import threading

    from esg_prefect.service.wire import call_body

    port = free_port()
    service = start_service(port, tmp_path / "results.db")
    address = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    answers: list[object] = []
    call = StageCall("held", "inc", "tests.toy_stages:inc", WorkflowDecl("toy", 800, (("double", "inc"),)), "q", "q", 1)

    def hold() -> None:
        try:
            answers.append(
                httpx.post(
                    f"{address}/v1/calls", params={"wait_s": "600"}, json=call_body(call), headers=auth, timeout=700
                ).status_code
            )
        except httpx.HTTPError as exc:  # cut at shutdown: what the client reads as a restart
            answers.append(type(exc).__name__)

    try:
        assert httpx.post(f"{address}/v1/pause", headers=auth, timeout=30).json() == {"paused": True}
        holder = threading.Thread(target=hold, daemon=True)
        holder.start()
        wait_until(lambda: httpx.get(f"{address}/metrics", headers=auth, timeout=30).json()["calls_in_flight"] == 1,
                   "the call held")  # fmt: skip
    finally:
        stop_service(service)  # SIGINT, then at most 120 s before a kill
    assert service.returncode == 0  # not killed: the open request did not hold the exit for 600 s
    holder.join(60)
    assert answers and answers[0] != 200
