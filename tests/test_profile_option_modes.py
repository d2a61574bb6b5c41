"""``esg-prefect profile``: an option the chosen mode would ignore is refused by name, never dropped.

Each option either works in the run asked for or is refused in one line (exit 2)
naming it and the mode, before anything is measured; an option left out is never
refused, even where its default would be.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from esg_prefect.profiler import SessionOptions, SessionResult


@pytest.fixture
def sessions(monkeypatch: pytest.MonkeyPatch) -> list[SessionOptions]:
    """The sessions the command would run, recorded instead of run."""
    from esg_prefect.profiler import session

    seen: list[SessionOptions] = []
    monkeypatch.setattr(session, "run_session", lambda opts, *a, **kw: seen.append(opts) or SessionResult(files={}))
    return seen


def _said(output: str) -> str:
    return " ".join(output.replace("\u2502", " ").split())  # rich's error box, unwrapped


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--quick", "--max-attempts", "3"], "--quick is the smoke test (batches 1,2, one attempt,"),
        (["--quick", "--max-attempts", "4"], "and takes none of --max-attempts; drop it or --quick"),  # typed: given
        (["--quick", "--validate", "--validation-batches", "2,4"], "takes none of --validation-batches;"),
        (["--quick", "--wait-quiet-s", "5", "--batches", "1,2"], "takes none of --batches, --wait-quiet-s; drop them"),
        (["--flow", "--quick", "--max-attempts", "2"], "--quick is the smoke test"),
        (["--trace", "poisson"], "--trace is for --breakdown and does nothing without it; add --breakdown, or drop"),
        (["--co-runners", "2"], "--co-runners is for --breakdown"),
        (["--utilisation", "0.5"], "--utilisation is for --breakdown"),
        (["--breakdown-batch", "8", "--validate"], "--breakdown-batch is for --breakdown"),
        (["--flow", "--breakdown-batch", "8"], "--breakdown-batch is for --breakdown"),
        (["--validation-batches", "2,4", "--breakdown"], "--validation-batches is for --validate"),
        (["--store", "sqlite:///x.db", "--no-store"], "--no-store skips the profile store and takes none of --store;"),
        (["--figures-dir", "figs"], "--figures-dir is for --breakdown, --validate or --stalls and does nothing"),
        (["--profile", "{csv}", "--validate", "--vcpus", "4"], "--profile uses this profile instead of measuring"),
        (["--stalls", "{csv}", "--batches", "4"], "--stalls draws this stall breakdown again instead of measuring"),
        (["--stalls", "{csv}", "--breakdown"], "one or a profile and takes none of --breakdown; drop it or --stalls"),
        (["--stalls", "{csv}", "-t", "x"], "--stalls without --validate only draws this breakdown, measuring nothing,"),
        (["--stalls", "{csv}", "--quick", "--max-attempts", "1"], "--quick is the smoke test"),
        (["--stalls", "{csv}", "--max-attempts", "2"], "measuring nothing, and takes none of --max-attempts;"),
        (["--stalls", "{csv}", "--quick"], "measuring nothing, and takes none of --quick; drop it or --stalls"),
        (["--measurements", "{csv}"], "--measurements is for --validate"),
        (["--validate", "--measurements", "{csv}", "--validation-batches", "2"], "--measurements reuses these"),
        (["--fit-sizes", "{csv}", "--breakdown", "-t", "x"], "takes none of --target, --breakdown; drop them"),
        (["--profile", "{csv}"], "--profile is for --validate or --breakdown and does nothing without them"),
        (["--stalls", "{csv}", "--validate"], "--stalls measures no profile: give the one to validate with --profile"),
    ],
)
def test_an_option_the_run_would_ignore_is_refused_by_name(
    tmp_path: Path, sessions: list[SessionOptions], argv: list[str], named: str
) -> None:
    """Each of these ran (exit 0) and dropped the option without a word: ``--quick`` fixed the attempts and
    the validation's batches, the breakdown's options did nothing without ``--breakdown``, and so on."""
    from esg_prefect.cli import app

    (tmp_path / "f.csv").write_text("stage\n", encoding="utf-8")
    argv = [a.replace("{csv}", str(tmp_path / "f.csv")) for a in argv]
    result = CliRunner().invoke(app, ["profile", *argv])
    assert result.exit_code == 2, result.output
    assert named in _said(result.output), result.output
    assert sessions == []  # refused before anything ran


@pytest.mark.parametrize(
    "argv",
    [
        ["--quick"],  # its attempts, wait and validation batches differ from the defaults, untyped: not refused
        ["--breakdown", "--trace", "poisson", "--co-runners", "2", "--utilisation", "0.5", "--breakdown-batch", "8"],
        ["--validate", "--validation-batches", "2,4", "--max-attempts", "2"],
        ["--store", "sqlite:///x.db"],
        ["--no-store", "--batches", "1,2", "--figures-dir", "figs", "--validate"],
    ],
)
def test_the_options_a_run_takes_are_taken(sessions: list[SessionOptions], argv: list[str]) -> None:
    from esg_prefect.cli import app

    result = CliRunner().invoke(app, ["profile", *argv])
    assert result.exit_code == 0, result.output
    (opts,) = sessions
    if "--trace" in argv:
        assert opts.breakdown is not None and (opts.breakdown.trace, opts.breakdown.batch) == ("poisson", 8)
    if "--validation-batches" in argv:
        assert opts.validation_batches == (2, 4)
        assert opts.request is not None and opts.request.settings.max_attempts == 2


def test_stalls_breakdown_and_the_measuring_options_went_to_a_default_breakdown(
    tmp_path: Path, sessions: list[SessionOptions]
) -> None:
    """``--stalls S --breakdown --max-attempts 2`` (or ``--quick``) measured a breakdown at the default
    settings (4 attempts) and drew it over S's figures; ``--stalls S -t x`` ran, measuring nothing on x."""
    from esg_prefect.cli import app

    csv = str(tmp_path / "s.csv")
    (tmp_path / "s.csv").write_text("stage\n", encoding="utf-8")
    for argv in (["--breakdown", "--max-attempts", "2"], ["--breakdown", "--quick"], ["-t", "x"]):
        result = CliRunner().invoke(app, ["profile", "--stalls", csv, *argv])
        assert result.exit_code == 2, (argv, result.output)
        assert "--stalls" in _said(result.output) and argv[0] in _said(result.output), result.output
    assert sessions == []


def test_stalls_with_a_profile_to_validate_takes_the_validation_s_options(
    tmp_path: Path, sessions: list[SessionOptions]
) -> None:
    """The validation measures: on ``-t``'s targets, with ``--quick``'s or ``--max-attempts``' settings."""
    from esg_prefect.cli import app

    csv = str(tmp_path / "f.csv")
    (tmp_path / "f.csv").write_text("stage\n", encoding="utf-8")
    for extra, attempts in ((["--quick"], 1), (["--max-attempts", "2"], 2)):
        argv = ["profile", "--stalls", csv, "--profile", csv, "--validate", "-t", "x", *extra]
        result = CliRunner().invoke(app, argv)
        assert result.exit_code == 0, result.output
        opts = sessions.pop()
        assert opts.stalls is not None and opts.validate and opts.targets == ("x",)
        assert opts.validation_settings is not None and opts.validation_settings.max_attempts == attempts


def test_the_tables_name_the_command_s_options() -> None:
    """A misspelt option in a table would never match, and its refusal would never fire."""
    import typer

    from esg_prefect.cli import app
    from esg_prefect.profiler.option_modes import (
        EVERY_OTHER,
        FLOW_PARAMETERS,
        NEEDS_ONE_OF,
        STALLS_ALONE_TAKES_NONE_OF,
        TAKES_NONE_OF,
    )

    profile = typer.main.get_command(app).commands["profile"]  # type: ignore[attr-defined]  # a group's commands
    options = {o for p in profile.params for o in p.opts}
    named = set(TAKES_NONE_OF) | set(NEEDS_ONE_OF) | set(STALLS_ALONE_TAKES_NONE_OF) | set(FLOW_PARAMETERS)
    for _, ignored in TAKES_NONE_OF.values():
        named |= set(ignored) - set(EVERY_OTHER)
    for modes in NEEDS_ONE_OF.values():
        named |= set(modes)
    assert named <= options, named - options


@pytest.mark.parametrize(
    ("option", "header", "named"),
    [
        (
            "--profile",
            "stage,hardware,batch,vcpus,gpu_share\n",
            "missing columns ['mean_ms']; give a latency profile CSV",
        ),
        ("--stalls", "stage,batch\n", "give a stall-breakdown CSV (esg-prefect profile --breakdown writes one)"),
        ("--measurements", "stage,hardware\n", "'predicted_ms', 'quiet', 'vcpus']; give a validation CSV"),
    ],
)
def test_a_table_of_another_kind_names_its_missing_columns(
    tmp_path: Path, option: str, header: str, named: str
) -> None:
    """Each read failed at its first row on the first column it asked for (``line 2: 'mean_ms'``), with
    nothing to say which file the profiler wanted."""
    from esg_prefect.exceptions import InvalidInputError, ProfileError
    from esg_prefect.profiler.breakdown import read_breakdown_csv
    from esg_prefect.profiler.results import read_profile_csv
    from esg_prefect.profiler.validate import read_validation_csv

    path = tmp_path / "t.csv"
    path.write_text(header + ",".join("1" * len(header.split(","))) + "\n", encoding="utf-8")
    read = {"--profile": read_profile_csv, "--stalls": read_breakdown_csv, "--measurements": read_validation_csv}
    with pytest.raises((ProfileError, InvalidInputError)) as err:
        read[option](path)
    assert named in str(err.value)


def test_a_row_short_of_a_column_names_the_column(tmp_path: Path) -> None:
    from esg_prefect.exceptions import ProfileError
    from esg_prefect.model.csv_rows import read_rows

    path = tmp_path / "t.csv"
    path.write_text("a,b\n1,2\n", encoding="utf-8")
    with pytest.raises(ProfileError, match=r"t\.csv line 2: no column 'c'$"):
        read_rows(path, lambda r: r["c"])
