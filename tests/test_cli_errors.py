"""A user's mistake on the command line is one line naming the bad value, exit code 2, no traceback."""

from __future__ import annotations

import pytest

from esg_prefect.cli import main


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["simulate", "--scheduler", "nonexistent", "--duration", "1"], "unknown scheduler 'nonexistent'"),
        (["simulate", "--rate", "-5", "--duration", "1"], "rate_per_s must be a finite number > 0, got -5.0"),
        (["simulate", "--duration", "-1"], "duration_s must be a finite number > 0, got -1.0"),
        (["simulate", "--case", "/nonexistent.json"], "/nonexistent.json"),
        (["simulate", "--trace", "nope", "--duration", "1"], "unknown trace 'nope'"),
        (["simulate", "--profile", "nonexistent", "--duration", "1"], "profile 'nonexistent'"),
        (["demo", "--rate", "-1"], "rate_per_s must be a finite number > 0, got -1.0"),
        (["demo", "--trace", "nope"], "unknown trace 'nope'"),
        (["demo", "--requests", "0"], "--requests must be at least 1, got 0"),
        (["demo", "--runs-shown", "-2"], "--runs-shown must be 0 or more, got -2"),
    ],
)
def test_bad_values_are_one_line_and_exit_2(argv: list[str], named: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines == [lines[0]] and lines[0].startswith("esg-prefect: error:") and named in lines[0], err
    assert "Traceback" not in err


def test_an_unreachable_prefect_api_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/api"
    monkeypatch.setenv("PREFECT_API_URL", url)
    assert main(["demo", "--requests", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and url in err and "prefect server start" in err


def test_usage_errors_keep_typers_message_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schedulers", "--nope"]) == 2
    err = capsys.readouterr().err
    assert "No such option" in err and "Traceback" not in err


def test_a_good_command_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schedulers"]) == 0
    assert "esg" in capsys.readouterr().out


def test_a_refused_demo_leaves_this_process_as_it_was(capsys: pytest.CaptureFixture[str]) -> None:
    # The demo quiets Prefect through the environment: a bad value must be refused before that,
    # or a test process that ran the command would lose Prefect's run logs afterwards.
    import os

    before = dict(os.environ)
    for argv in (["demo", "--requests", "0"], ["demo", "--rate", "-1"], ["demo", "--trace", "nope"]):
        assert main(argv) == 2
    assert dict(os.environ) == before
