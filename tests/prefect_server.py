"""A real Prefect server (``prefect server start``) in a subprocess, for tests that need more than the harness.

Used by tests/test_deployments.py and tests/test_ui_artifacts.py: process work-pool
workers, ``prefect deploy`` and the UI all need a server of their own on a port,
which Prefect's test harness does not give. Every process a test starts against
it gets ``PREFECT_HOME`` set to the test's own temporary folder; on the way out
:func:`prefect_server` stops the server and then ends any process still carrying
that ``PREFECT_HOME`` (a worker's flow-run subprocess, a pool service's worker),
so a test leaves no strays, whatever failed.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx

ROOT = Path(__file__).resolve().parent.parent

CLIENT_SETTINGS = {"PREFECT_CLIENT_MAX_RETRIES": "7", "PREFECT_API_REQUEST_TIMEOUT": "120"}
"""Prefect client settings for every process the tests run against a test server.

Prefect's test servers keep their data in SQLite. On a loaded machine their
transactions last longer and collide more, and a write the server cannot get in
is answered 503 ("retry"). Prefect's client retries a 503 or a timed-out request
``PREFECT_CLIENT_MAX_RETRIES`` times, backing off 2, 4, 8, ... s: the default 5
(about 1 min in all) was seen to run out under load (tests/test_runner.py, 12
concurrent flow runs against the harness); 7 waits up to about 4 min. A server
that stays busy longer still fails the test, as does any other error. A request
may take up to 120 s (default 60) before it counts as timed out.
"""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class PrefectServer:
    """A running server: its URLs, its home folder and the environment for its clients."""

    url: str
    home: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def api_url(self) -> str:
        """The REST API's base URL (``PREFECT_API_URL``)."""
        return f"{self.url}/api"

    def api(self) -> httpx.Client:
        """An HTTP client of the REST API (the caller closes it); it waits out a busy server (503)."""
        return httpx.Client(base_url=self.api_url, timeout=30.0, transport=BusyRetry())


class BusyRetry(httpx.BaseTransport):
    """Sends a request again, after a pause, while the server answers 503 (Service Unavailable).

    A SQLite-backed server answers 503 when its database stays locked past its
    timeout, which happens on a loaded machine (the test suite runs two workers,
    each with servers and worker processes of its own); seen in CI on a
    ``DELETE /deployments/{id}`` that another moment would have served. Every
    request a test sends is a small JSON body, so sending it again is safe; the
    last answer is returned whatever it is, so a server that stays busy still fails
    the test with its own status. Nine tries wait out about 2 min of busy server.
    """

    def __init__(self, tries: int = 9, first_pause_s: float = 0.5) -> None:
        self._inner = httpx.HTTPTransport()
        self._tries = tries
        self._first_pause_s = first_pause_s

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        pause = self._first_pause_s
        for _ in range(self._tries - 1):
            response = self._inner.handle_request(request)
            if response.status_code != 503:
                return response
            response.read()
            response.close()
            time.sleep(pause)
            pause *= 2
        return self._inner.handle_request(request)

    def close(self) -> None:
        self._inner.close()


def base_env(home: Path) -> dict[str, str]:
    """This process's environment without Prefect settings, plus a home of its own and no telemetry."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        {
            "PREFECT_HOME": str(home),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "DO_NOT_TRACK": "1",
            "PREFECT_CLI_PROMPT": "false",
            **CLIENT_SETTINGS,
        }
    )
    return env


SIGINT_DEFAULT = (
    "import os, signal, sys\n"
    "for name in ('SIGINT', 'SIGPIPE', 'SIGXFSZ'):\n"
    "    signal.signal(getattr(signal, name), signal.SIG_DFL)\n"
    "os.execvp(sys.argv[1], sys.argv[1:])"
)
"""``python -c SIGINT_DEFAULT cmd...`` runs ``cmd`` (an exec: same pid) with SIGINT at its default.

SIGPIPE and SIGXFSZ too, which this launcher's Python ignores and ``subprocess`` resets for a command
it starts directly.
"""


def spawn(cmd: Sequence[str], env: Mapping[str, str], log: Path, cwd: Path = ROOT) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in a session of its own (so that its whole group can be stopped), output to ``log``.

    ``cmd`` gets SIGINT at its default, as a command typed in a terminal does, whatever this
    process has: a shell ignores SIGINT for the commands it runs in the background of a script
    (``pytest ... &``, and so every process they start), and a process that inherits that never
    hears the SIGINT (Ctrl-C) the tests stop it with. Seen: deployments/serve.py serving on,
    idle, 240 s after its SIGINT, in a suite run started in the background beside a CPU hog.
    """
    out: IO[bytes] = log.open("ab")
    try:
        return subprocess.Popen(
            [sys.executable, "-c", SIGINT_DEFAULT, *cmd],
            cwd=cwd,
            env=dict(env),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        out.close()  # the child has its own copy


def tail(log: Path, chars: int = 3000) -> str:
    """The end of a log file, for failure messages."""
    try:
        return log.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 20.0, sig: int = signal.SIGINT) -> None:
    """Signal a process started by :func:`spawn`, wait, then kill what is left of its process group."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def processes_with_home(home: Path) -> list[int]:
    """Ids of live processes (other than this one) whose environment has ``PREFECT_HOME=home``."""
    marker = f"PREFECT_HOME={home}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:  # gone, or not ours to read
            continue
        if state != "Z" and marker in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def kill_strays(home: Path, grace_s: float = 5.0) -> list[int]:
    """End the processes still carrying ``PREFECT_HOME=home``: SIGTERM, then SIGKILL after ``grace_s``."""
    strays = processes_with_home(home)
    for pid in strays:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    give_up = time.monotonic() + grace_s
    while time.monotonic() < give_up and processes_with_home(home):
        time.sleep(0.1)
    for pid in processes_with_home(home):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return strays


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float, what: str) -> None:
    """Wait until ``GET url`` answers 200; fail with the log's tail if ``proc`` exits or time runs out."""
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode}:\n{tail(log)}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not answer {url} within {timeout_s:.0f} s:\n{tail(log)}")


@contextlib.contextmanager
def prefect_server(home: Path, *, ui: bool = False, timeout_s: float = 300.0) -> Iterator[PrefectServer]:
    """Run ``prefect server start`` on a free port with its own home and SQLite database.

    The scheduler service is off: deployments keep their schedules, but no run is
    created from them, so a test sees only the runs it starts.

    Args:
        home: an empty folder for ``PREFECT_HOME`` (database, UI build, logs).
        ui: serve the UI too (``PREFECT_UI_API_URL`` points it at this server's API).
        timeout_s: how long the server may take to answer ``/api/health``: a ceiling on a
            condition, generous since the server took over a minute to start on a loaded machine.
    """
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = base_env(home) | {
        "PREFECT_API_URL": f"{url}/api",
        "PREFECT_UI_API_URL": f"{url}/api",
        "PREFECT_SERVER_UI_ENABLED": str(ui).lower(),
        "PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED": "false",
        "PREFECT_SERVER_LOGGING_LEVEL": "WARNING",
    }
    log = home / "server.log"
    cmd = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)]
    proc = spawn(cmd, env, log)
    try:
        wait_http(f"{url}/api/health", proc, log, timeout_s, "prefect server")
        yield PrefectServer(url, home, env, proc, log)
    finally:
        stop(proc)
        strays = kill_strays(home)
        if strays:
            print(f"ended {len(strays)} process(es) left running against {url}: {strays}")


class _Health(http.server.BaseHTTPRequestHandler):
    """Answers a Prefect API's health check (``GET /api/health``) and nothing else."""

    def do_GET(self) -> None:
        ok = self.path == "/api/health"
        self.send_response(200 if ok else 404)
        self.end_headers()
        self.wfile.write(b"true" if ok else b"")

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def health_only_api() -> Iterator[str]:
    """The URL of an "API" on 127.0.0.1 that passes the health check that scripts ask up front, and no more.

    For tests of what a script does after that check (its waits, its signals), which never reach the API.
    """
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/api"
    finally:
        server.shutdown()
        server.server_close()
