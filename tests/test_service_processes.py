"""The pool service with flow runs in separate processes: pooling across processes, and a service restart."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

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


def start_service(port: int, results_db: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "ESG_PREFECT_TOKEN": TOKEN}
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
        str(ROOT / "tests" / "toy_profile.csv"),
        "--results-db",
        str(results_db),
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
    for _ in range(300):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the pool service did not start")


@pytest.fixture
def toy_profile_csv() -> Iterator[None]:
    from tests.toy_stages import toy_profile

    path = ROOT / "tests" / "toy_profile.csv"
    toy_profile().to_csv(path)
    yield
    path.unlink(missing_ok=True)


@pytest.mark.usefixtures("toy_profile_csv")
def test_batches_mix_calls_from_different_processes(tmp_path: Path) -> None:
    from prefect.settings import PREFECT_API_URL

    port = free_port()
    service = start_service(port, tmp_path / "results.db")
    try:
        env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value())}
        address = f"http://127.0.0.1:{port}"
        start_at = str(time.time() + 40.0)  # both bursts start together, after both processes are up
        clients = [
            subprocess.Popen(
                [sys.executable, "-m", "tests.service_client_proc", address, TOKEN, "10", str(100 * k), start_at],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
            )
            for k in (1, 2)
        ]
        runs_of = []
        for c in clients:
            out, _ = c.communicate(timeout=300)
            assert c.returncode == 0
            runs_of.append(set(json.loads(out.decode().strip().splitlines()[-1])))
        batches = httpx.get(f"{address}/v1/batches?limit=1000", headers={"Authorization": f"Bearer {TOKEN}"}).json()
        mixed = [b for b in batches["batches"] if set(b["runs"]) & runs_of[0] and set(b["runs"]) & runs_of[1]]
        sizes = [(b["size"], len(b["runs"])) for b in batches["batches"]]
        assert mixed, f"some batch should hold calls from both processes; (size, runs) of each: {sizes}"
    finally:
        service.send_signal(signal.SIGINT)
        service.wait(30)


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
        service.send_signal(signal.SIGINT)
        service.wait(30)


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
        service.send_signal(signal.SIGINT)
        service.wait(30)
    gone = CliRunner().invoke(app, ["pool", "resume", "--url", address])
    assert gone.exit_code == 1 and "could not reach the pool service" in gone.output
