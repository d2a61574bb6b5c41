"""deployments/serve.py refuses bad options in one line, before any flow loads or service starts.

No server is needed: every refusal here comes before the script touches the Prefect API
(the unreachable ``--pool-url`` case only needs PREFECT_API_URL to be set, not to answer).
The wait for the pool service is bounded by ``main``'s ``wait_s``, so no test waits 180 s.
"""

from __future__ import annotations

import subprocess
import sys
from types import ModuleType

import pytest

from tests.prefect_server import free_port
from tests.scripts import load_script


@pytest.fixture(scope="module")
def serve() -> ModuleType:
    return load_script("esg_deployments_serve_args", "deployments/serve.py")


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
    serve: ModuleType, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
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
    with temporary_settings({PREFECT_API_URL: f"http://127.0.0.1:{free_port()}/api"}), pytest.raises(SystemExit) as exc:
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
