"""The ``esg-prefect`` command.

Each module of this package adds its own sub-commands through a
``register(app)`` function, found at start-up, so commands live next to what
they drive and adding one touches no shared file.

A user's mistake (a bad value, an unknown name, a missing file) ends the
command with one line naming it and exit code 2, never a traceback: every
command raises the project's own errors (:mod:`esg_prefect.exceptions`) for
those, and :func:`main` turns them into that line. Anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import typer

from esg_prefect.exceptions import ESGError

app = typer.Typer(
    name="esg-prefect",
    help="Pooled, batched DNN pipelines on shared GPUs for Prefect 3, scheduled by ESG.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _main() -> None:
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


def main(argv: list[str] | None = None) -> int:
    """Run ``esg-prefect`` with ``argv`` (default: the process's); a user's mistake is one line, exit 2."""
    try:
        app(args=argv, prog_name="esg-prefect")  # usage errors: typer's own message and exit 2
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except USER_ERRORS as exc:
        typer.echo(f"esg-prefect: error: {exc}", err=True)
        return 2
    return 0


def run() -> None:
    """The console script."""
    sys.exit(main())


__all__ = ["app", "main", "run"]
