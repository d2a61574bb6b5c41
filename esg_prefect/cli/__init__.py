"""The ``esg-prefect`` command.

Each module of this package adds its own sub-commands through a
``register(app)`` function, found at start-up, so commands live next to what
they drive and adding one touches no shared file.

A user's mistake (a bad value, an unknown name, a missing file) ends the
command with one line naming it and what is accepted, exit code 2, never a
traceback: commands check their options up front and raise
``typer.BadParameter`` (naming the option) or the project's own errors
(:mod:`esg_prefect.exceptions`), and :func:`main` turns either into that line.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from typing import Any

import typer

from esg_prefect.exceptions import ESGError

app = typer.Typer(
    name="esg-prefect",
    help="Pooled, batched DNN pipelines on shared GPUs for Prefect 3, scheduled by ESG.",
    no_args_is_help=True,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        from esg_prefect import __version__

        typer.echo(f"esg-prefect {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Pooled, batched DNN pipelines on shared GPUs for Prefect 3, scheduled by ESG."""


def _load_commands() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        register = getattr(module, "register", None)
        if callable(register):
            register(app)


_load_commands()

USER_ERRORS: tuple[type[BaseException], ...] = (ESGError, FileNotFoundError, IsADirectoryError, PermissionError)


def _click_usage_error() -> type[Exception]:
    """Click's ``UsageError``, which every command-line mistake click finds derives from.

    Found through ``typer.BadParameter``: typer 0.12 re-exports click's own, newer
    versions a vendored copy of click, whose classes are not click's.
    """
    for cls in typer.BadParameter.__mro__:
        if cls.__name__ == "UsageError":
            return cls
    return typer.BadParameter


UsageError = _click_usage_error()


def main(argv: list[str] | None = None) -> int:
    """Run ``esg-prefect`` with ``argv`` (default: the process's); a user's mistake is one line, exit 2.

    Typer's usage errors (an unknown option, a value of the wrong type, a
    ``typer.BadParameter`` of a command) are that one line too, instead of
    typer's boxed message: its text names the option and the value.
    """
    try:
        code = app(args=argv, prog_name="esg-prefect", standalone_mode=False)
    except UsageError as exc:
        err: Any = exc
        if type(exc).__name__ != "NoArgsIsHelpError":  # for that one typer has printed the help
            typer.echo(f"esg-prefect: error: {_usage_message(err, sys.argv[1:] if argv is None else argv)}", err=True)
        return int(err.exit_code)
    except typer.Abort:
        typer.echo("esg-prefect: aborted", err=True)
        return 1
    except USER_ERRORS as exc:
        typer.echo(f"esg-prefect: error: {exc}", err=True)
        return 2
    return code if isinstance(code, int) else 0


def _usage_message(exc: Any, argv: list[str]) -> str:
    """Click's message on one line, with the value given when the message lacks it (a value of the
    wrong type); for a mistake that is not about a value, where to find the options."""
    text = " ".join(str(exc.format_message()).split())
    if not isinstance(exc, typer.BadParameter):
        return f"{text} (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else text
    given = _given(argv, getattr(exc.param, "opts", []) or [])
    return f"{text}, got {given!r}" if given is not None and repr(given) not in text else text


def _given(argv: list[str], opts: list[str]) -> str | None:
    """The last value given to an option named ``opts`` in ``argv`` (``--opt v`` or ``--opt=v``)."""
    found = None
    for i, arg in enumerate(argv):
        for opt in opts:
            if arg == opt and i + 1 < len(argv):
                found = argv[i + 1]
            elif opt.startswith("--") and arg.startswith(opt + "="):
                found = arg[len(opt) + 1 :]
    return found


def run() -> None:
    """The console script."""
    sys.exit(main())


__all__ = ["app", "main", "run"]
