"""``esg-prefect --help`` and each command's: whole lines, and boolean flags written one way."""

from __future__ import annotations

from typing import Any

import typer
from typer.testing import CliRunner

from esg_prefect.cli import app

PARAGRAPHS_OWNED_ELSEWHERE = {"profile"}
"""Commands whose later help paragraphs still break mid-sentence (their module is maintained apart)."""


def _commands(cmd: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """Every command under ``cmd`` (groups included) with its path of names."""
    found = [(path, cmd)]
    for name, sub in getattr(cmd, "commands", {}).items():
        found += _commands(sub, (*path, name))
    return found


def test_every_help_paragraph_is_one_line() -> None:
    """Typer prints a docstring's paragraphs with their line breaks, the first as the summary in the
    command list: a break inside one showed as "idle time attributed to no run / has a row of its own"."""
    for path, cmd in _commands(typer.main.get_command(app)):
        paragraphs = (cmd.help or "").strip().split("\n\n")
        assert "\n" not in paragraphs[0], (path, paragraphs[0])
        if not set(path) & PARAGRAPHS_OWNED_ELSEWHERE:
            assert all("\n" not in p.strip() for p in paragraphs), (path, paragraphs)


def test_the_command_list_shows_each_summary_whole() -> None:
    out = CliRunner().invoke(app, ["--help"], terminal_width=200, env={"COLUMNS": "200"}).output
    costs = next(line for line in out.splitlines() if " costs " in line)
    assert "one row per run, workflow, deployment or day, and a total." in costs


def test_a_flag_that_is_off_by_default_has_no_negative_form() -> None:
    """`--quick` as profile's, `--fresh`, `--json`; only a switch that is on by default has a --no- form."""
    for path, cmd in _commands(typer.main.get_command(app)):
        for param in getattr(cmd, "params", []):
            if getattr(param, "secondary_opts", None):
                assert param.default is True, (path, param.opts, param.secondary_opts)
    out = CliRunner().invoke(app, ["compare", "--help"], env={"COLUMNS": "200"}).output
    assert "--no-quick" not in out and "--quick" in out


def test_an_option_states_its_default_once() -> None:
    """An option whose help already says "(default: ...)" hides Typer's "[default: ...]": compare's --out
    read "(default: ./esg-compare in the working folder). [default: esg-compare]"."""
    for path, _cmd in _commands(typer.main.get_command(app)):
        out = CliRunner().invoke(app, [*path, "--help"], terminal_width=400, env={"COLUMNS": "400"}).output
        for line in out.splitlines():
            assert not ("(default:" in line and "[default:" in line), (path, line)
    out = CliRunner().invoke(app, ["compare", "--help"], terminal_width=400, env={"COLUMNS": "400"}).output
    out_line = next(line for line in out.splitlines() if "--out " in line)
    assert "./esg-compare in the working folder" in out_line and "[default:" not in out_line


def test_pool_serve_help_says_which_prefect_api_gets_the_artifacts() -> None:
    """--artifacts read "to the Prefect API" with no word of which: it is PREFECT_API_URL's, and without one a
    temporary API of the service's own, as the warning at start-up says."""
    out = CliRunner().invoke(app, ["pool", "serve", "--help"], terminal_width=400, env={"COLUMNS": "400"}).output
    artifacts = " ".join(next(line for line in out.splitlines() if "--artifacts" in line).split())
    assert "to the Prefect API at PREFECT_API_URL" in artifacts
    assert "(unset: a temporary Prefect API that this service starts and that ends with it)" in artifacts
