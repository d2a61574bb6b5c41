"""deployments/serve.py refuses bad options in one line, before any flow loads or service starts.

No server is needed: every refusal here comes before the script touches the Prefect API
beyond its health check, which the tests that get past it pass with :func:`health_only_api`.
The wait for the pool service is bounded by ``main``'s ``wait_s``, so no test waits 180 s.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.prefect_server import ROOT, SIGINT_DEFAULT, free_port, health_only_api
from tests.scripts import load_script


@pytest.fixture(scope="module")
def serve() -> ModuleType:
    return load_script("esg_deployments_serve_args", "deployments/serve.py")


@pytest.fixture
def api() -> Iterator[str]:
    """A PREFECT_API_URL that passes the script's health check (no test here goes further)."""
    with health_only_api() as url:
        yield url


def refusal(capsys: pytest.CaptureFixture[str]) -> str:
    """The one error line of an argparse refusal (its usage lines above it), checked for a traceback."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return err.splitlines()[-1]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--only", "nope"], "--only: no deployment named 'nope' in prefect.yaml (it has: image-every-2-minutes"),
        (["--only", "text-every-5-minutes", "--only", "nope"], "no deployment named 'nope'"),
        (["--pool-url", "notaurl"], "--pool-url: not an http(s) URL with a host"),
        (["--pool-url", "http://"], "got 'http://'"),
        (["--limit", "0"], "--limit: must be at least 1 flow run at once (leave it out for no limit), got 0"),
        (["--limit", "-3"], "got -3"),
    ],
)
def test_a_bad_option_is_refused_in_one_line(
    serve: ModuleType, argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each was a traceback (--only, --pool-url, --limit -3) or served nothing forever (--limit 0)."""
    with pytest.raises(SystemExit) as exc:
        serve.main(argv)
    assert exc.value.code == 2
    line = refusal(capsys)
    assert " error: " in line and named in line, line


def test_a_pool_url_with_nothing_there_says_it_waits_then_fails_in_one_line(
    api: str, serve: ModuleType, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was silent, then a RuntimeError traceback after 180 s; checked before the flows load."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.delenv("ESG_PREFECT_POOL_URL", raising=False)  # main sets it once the service answers
    loaded: list[object] = []

    def build(*args: object) -> list[object]:
        loaded.append(args)
        return []

    monkeypatch.setattr(serve, "build_deployments", build)
    with temporary_settings({PREFECT_API_URL: api}), pytest.raises(SystemExit) as exc:
        serve.main(["--pool-url", url], wait_s=0.5)
    assert exc.value.code == 2
    out = capsys.readouterr()
    assert out.out.count("waiting up to 0.5 s for the pool service at") == 1 and url in out.out, out.out
    assert "Traceback" not in out.err, out.err
    line = out.err.splitlines()[-1]
    assert " error: --pool-url: the pool service at " in line and url in line, line
    assert "did not answer" in line and "esg-prefect pool serve" in line, line
    assert loaded == []  # no flow was loaded for a service that is not there


def test_a_pool_service_that_exits_is_named_with_its_exit_code(serve: ModuleType) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    with pytest.raises(serve.ServiceDown, match=r"exited with code 3 before it answered at http://127\.0\.0\.1:1$"):
        serve.wait_healthy("http://127.0.0.1:1", proc, timeout_s=60)


# ---- Ctrl-C before serving starts ----------------------------------------------------------------


def test_ctrl_c_while_waiting_for_the_pool_service_ends_in_one_line(api: str, tmp_path: Path) -> None:
    """Was a KeyboardInterrupt traceback. SIGINT is sent once the script says it waits (nothing listens
    at ``--pool-url``), so the wait is where it lands, whatever the machine's speed."""
    env = {**os.environ, "PREFECT_HOME": str(tmp_path), "PREFECT_API_URL": api}
    env.pop("ESG_PREFECT_POOL_URL", None)
    cmd = ["deployments/serve.py", "--pool-url", f"http://127.0.0.1:{free_port()}"]
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGINT_DEFAULT, sys.executable, *cmd],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # blocks until the script has printed it (or exited: then "")
        assert first.startswith("waiting up to "), first + proc.communicate(timeout=60)[1]
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert err == "serve.py: interrupted before serving started\n" and out == "", (out, err)


def test_ctrl_c_while_the_flows_load_ends_in_one_line(
    api: str, serve: ModuleType, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    def build(*args: object) -> list[object]:
        raise KeyboardInterrupt  # as Ctrl-C during the seconds of imports that loading the flows takes

    monkeypatch.setattr(serve, "wait_healthy", lambda *a, **k: None)
    monkeypatch.setattr(serve, "build_deployments", build)
    monkeypatch.setenv("ESG_PREFECT_POOL_URL", "unchanged")  # main sets it; restored after the test
    with temporary_settings({PREFECT_API_URL: api}), pytest.raises(SystemExit) as exc:
        serve.main(["--pool-url", f"http://127.0.0.1:{free_port()}"])
    assert exc.value.code == 130
    out = capsys.readouterr()
    assert out.err.endswith(": interrupted before serving started\n") and out.err.count("\n") == 1, out.err
    assert out.out == ""


@pytest.mark.parametrize(
    ("signal_as", "code", "line"),
    [("KeyboardInterrupt", 130, "interrupted"), ("Terminated", 143, "terminated")],
)
@pytest.mark.parametrize("when", ["loading", "serving"])
def test_ctrl_c_or_kill_ends_in_one_line_that_says_when(
    signal_as: str,
    code: int,
    line: str,
    when: str,
    api: str,
    serve: ModuleType,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ctrl-C and SIGTERM end alike: their own exit code, and "before serving started" until it has."""
    import prefect
    from prefect.settings import PREFECT_API_URL, temporary_settings

    def stop(*args: object, **kwargs: object) -> list[object]:
        raise KeyboardInterrupt if signal_as == "KeyboardInterrupt" else serve.Terminated

    monkeypatch.setattr(serve, "wait_healthy", lambda *a, **k: None)
    monkeypatch.setattr(serve, "build_deployments", stop if when == "loading" else lambda *a: [])
    monkeypatch.setattr(prefect, "serve", stop)  # what serving raises when it has not handled the signal
    monkeypatch.setenv("ESG_PREFECT_POOL_URL", "unchanged")  # main sets it; restored after the test
    with temporary_settings({PREFECT_API_URL: api}), pytest.raises(SystemExit) as exc:
        serve.main(["--pool-url", f"http://127.0.0.1:{free_port()}"])
    assert exc.value.code == code
    said = line if when == "serving" else f"{line} before serving started"
    assert capsys.readouterr().err == f"{serve.make_parser().prog}: {said}\n"


class _Runner:
    """Prefect's serving runner as far as a signal sees it: ``handle_sigterm`` starts its graceful stop."""

    started, stopping = True, False

    def __init__(self) -> None:
        self.stops = 0

    def handle_sigterm(self, *args: object) -> None:
        self.stops += 1
        self.stopping = True


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_while_serving_stops_as_a_kill_does_and_twice_at_once(
    presses: int, api: str, serve: ModuleType, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C (SIGINT to the script) unwound Prefect's event loop: the runs' processes ended with it and
    their runs stayed Running on the API for good, where a ``kill`` cancels them ("Runner is shutting down.")."""
    import prefect
    from prefect.settings import PREFECT_API_URL, temporary_settings

    runner = _Runner()

    def serving(*deployments: object, limit: int | None = None) -> None:
        signal.signal(signal.SIGTERM, runner.handle_sigterm)  # as Prefect's Runner.start does
        for _ in range(presses):
            os.kill(os.getpid(), signal.SIGINT)  # handled in this (the main) thread before the next line

    monkeypatch.setattr(serve, "wait_healthy", lambda *a, **k: None)
    monkeypatch.setattr(serve, "build_deployments", lambda *a: [])
    monkeypatch.setattr(prefect, "serve", serving)
    monkeypatch.setenv("ESG_PREFECT_POOL_URL", "unchanged")  # main sets it; restored after the test
    interrupt = signal.getsignal(signal.SIGINT)
    with temporary_settings({PREFECT_API_URL: api}), contextlib.ExitStack() as stack:
        raised = stack.enter_context(pytest.raises(SystemExit)) if presses == 2 else None
        serve.main(["--pool-url", f"http://127.0.0.1:{free_port()}"])
    out = capsys.readouterr()
    assert runner.stops == 1 and signal.getsignal(signal.SIGINT) is interrupt  # put back on the way out
    assert "Ctrl-C: stopping serving, the flow runs in progress are cancelled" in out.out, out
    if raised is None:
        assert out.out.endswith("serving stopped\n") and out.err == "", out
    else:  # the second Ctrl-C interrupts at once, as before
        assert raised.value.code == 130 and out.err.endswith(": interrupted\n"), out


def test_ctrl_c_ignored_as_in_the_background_of_a_script_stays_ignored_while_serving(
    api: str, serve: ModuleType, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python deployments/serve.py &`` in a script inherits SIGINT ignored (the README says: stop it with
    ``kill``): serving set its Ctrl-C handler anyway, and a Ctrl-C meant for the foreground work stopped
    serving and cancelled the runs in progress."""
    import prefect
    from prefect.settings import PREFECT_API_URL, temporary_settings

    seen: list[object] = []
    monkeypatch.setattr(serve, "wait_healthy", lambda *a, **k: None)
    monkeypatch.setattr(serve, "build_deployments", lambda *a: [])
    monkeypatch.setattr(prefect, "serve", lambda *a, **k: seen.append(signal.getsignal(signal.SIGINT)))
    monkeypatch.setenv("ESG_PREFECT_POOL_URL", "unchanged")  # main sets it; restored after the test
    interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a shell starts a script's `cmd &`
    try:
        with temporary_settings({PREFECT_API_URL: api}):
            serve.main(["--pool-url", f"http://127.0.0.1:{free_port()}"])
        assert seen == [signal.SIG_IGN] and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, interrupt)
    assert capsys.readouterr().out.endswith("serving stopped\n")


def test_a_ctrl_c_handler_not_set_from_python_is_left_in_place(
    serve: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``getsignal`` gives None for a handler set outside Python: replaced, it could never be put back."""
    set_to: list[object] = []
    monkeypatch.setattr(signal, "getsignal", lambda signum: None)
    monkeypatch.setattr(signal, "signal", lambda signum, handler: set_to.append(handler))
    with serve.ctrl_c_stops_like_kill():
        pass
    assert set_to == []


def test_a_pool_service_interrupted_while_it_starts_is_ended_without_a_word(
    serve: ModuleType, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGINT (as the script stopped every service) printed the service's own traceback of an import it
    interrupted; one that never answered was never announced, so its end is not either."""
    started: list[subprocess.Popen[bytes]] = []

    def interrupted_wait(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
        started.append(proc)
        raise KeyboardInterrupt

    monkeypatch.setattr(serve, "wait_healthy", interrupted_wait)
    with pytest.raises(KeyboardInterrupt), serve.pool_service(free_port(), "inline"):
        pass
    assert started[0].returncode == -signal.SIGTERM
    assert capsys.readouterr().out == ""


# ---- kill (SIGTERM) before serving starts --------------------------------------------------------

_TERM_DRIVER = """
import sys
from tests.scripts import load_script
serve = load_script("esg_deployments_serve_term", "deployments/serve.py")
serve.build_deployments = lambda *a: []  # the flows' seconds of imports are not what is tested
real_wait = serve.wait_healthy
def wait(url, proc=None, timeout_s=serve.WAIT_S):
    if proc is not None:
        print("service pid", proc.pid, flush=True)
    real_wait(url, proc, timeout_s)
serve.wait_healthy = wait
sys.argv[0] = "deployments/serve.py"  # the name its one line says
serve.main(sys.argv[1:])
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_kill_while_waiting_for_the_pool_service_stops_it_and_ends_in_one_line(api: str, tmp_path: Path) -> None:
    """A SIGTERM ended the script where it stood and left the pool service it started running (a session
    of its own). SIGTERM is sent once the script says it waits for the service it started, so the wait is
    where it lands; the script's own ``main`` runs in a driver that skips loading the flows."""
    env = {**os.environ, "PREFECT_HOME": str(tmp_path), "PREFECT_API_URL": api}
    env.pop("ESG_PREFECT_POOL_URL", None)
    cmd = [sys.executable, "-c", _TERM_DRIVER, "--port", str(free_port()), "--backend", "inline"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    service = 0
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # blocks until the script has printed it (or exited: then "")
        assert first.startswith("service pid "), first + proc.communicate(timeout=60)[1]
        service = int(first.split()[-1])
        waits = proc.stdout.readline()
        assert waits.startswith("waiting up to "), waits + proc.communicate(timeout=60)[1]
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        # Stopped, and waited for, before the script exited (it shares the script's pipes: read them after).
        assert not _alive(service), f"the pool service (pid {service}) outlived the script (exit {proc.returncode})"
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 143, err
        assert err == "serve.py: terminated before serving started\n" and out == "", (out, err)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if service and _alive(service):  # the old script's orphan: end its whole group
            os.killpg(service, signal.SIGKILL)


def test_without_a_prefect_api_it_refuses_before_starting_the_pool_service(
    serve: ModuleType, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service it starts posts the runs' artifacts to PREFECT_API_URL: without one they would go to a
    temporary API of the service's own, apart from the one the served runs report to."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    started: list[object] = []
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setattr(serve, "pool_service", lambda *args: started.append(args))
    monkeypatch.setattr(serve, "build_deployments", lambda *args: started.append(args) or [])
    with temporary_settings(restore_defaults={PREFECT_API_URL}), pytest.raises(SystemExit) as exc:
        serve.main([], wait_s=0.5)
    assert exc.value.code == 2 and not started
    line = refusal(capsys)
    assert "PREFECT_API_URL is not set: start `prefect server start`" in line, line


def test_a_prefect_api_that_does_not_answer_is_refused_before_the_pool_service_starts(
    serve: ModuleType, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """It started the pool service, loaded the flows, then ended in httpx's traceback
    (``ConnectError: All connection attempts failed``) naming no URL."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    started: list[object] = []
    monkeypatch.setattr(serve, "pool_service", lambda *args: started.append(args))
    monkeypatch.setattr(serve, "build_deployments", lambda *args: started.append(args) or [])
    url = f"http://127.0.0.1:{free_port()}/api"  # nothing listens there
    with temporary_settings({PREFECT_API_URL: url}), pytest.raises(SystemExit) as exc:
        serve.main([], wait_s=0.5)
    assert exc.value.code == 2 and not started
    line = refusal(capsys)
    assert line.endswith(
        f"error: the Prefect API at PREFECT_API_URL={url} does not answer (ConnectError): start it with "
        "`prefect server start`, or point PREFECT_API_URL at it"
    ), line


def test_a_bad_pool_url_in_the_environment_is_named_where_the_deployment_flows_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker's ESG_PREFECT_POOL_URL without its scheme crashed every deployment run with a line that named
    ``address`` only: the runner's argument, not the variable the user set."""
    from esg_prefect.exceptions import InvalidInputError

    monkeypatch.setenv("ESG_PREFECT_POOL_URL", "127.0.0.1:4270")
    with pytest.raises(InvalidInputError) as exc:
        load_script("esg_deployments_flows_bad_url", "deployments/flows.py")
    assert str(exc.value) == (
        "ESG_PREFECT_POOL_URL: not an http(s) URL with a host; give the pool service's address, "
        "e.g. http://127.0.0.1:4270, got '127.0.0.1:4270'"
    )
