"""The ``esg-prefect`` command.

Each module of this package adds its own sub-commands through a
``register(app)`` function, found at start-up, so commands live next to what
they drive and adding one touches no shared file.
"""

from __future__ import annotations

import importlib
import pkgutil

import typer

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

__all__ = ["app"]
