"""The options the commands share, checked and read: one place for each rule and its message.

``simulate``, ``compare``, ``profile`` and ``pool serve`` take some of the same
values (a scheduler, a trace, a profile, a number that must be > 0, an output
directory, ``--set KEY=VALUE``); each check here refuses a bad one with
``typer.BadParameter`` naming the option and the value, before any work
starts. Commands import these from here, never from one another.
"""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from esg_prefect.scheduling import ESGSettings

__all__ = [
    "SET_FORMS",
    "check_number",
    "check_profile",
    "check_scheduler",
    "check_trace",
    "make_out_dir",
    "parse_settings",
    "setting_pairs",
    "setting_value",
    "with_settings",
]


def check_scheduler(name: str, hint: str = "--scheduler") -> None:
    """Refuse a scheduler name the registry does not know, naming the known ones.

    Raises:
        typer.BadParameter: naming ``hint``, the name and the known names.
    """
    import esg_prefect.scheduling  # noqa: F401 - registers the baselines
    from esg_prefect.scheduling import scheduler_names

    if name not in scheduler_names():
        raise typer.BadParameter(
            f"unknown scheduler {name!r}; known: {', '.join(scheduler_names())} (esg-prefect schedulers)",
            param_hint=hint,
        )


def check_trace(name: str) -> None:
    """Refuse a trace name the workload does not know, naming the known ones.

    Raises:
        typer.BadParameter: naming ``--trace``, the name and the accepted ones.
    """
    from esg_prefect.workload.arrivals import trace_names

    if name not in trace_names() and not name.startswith("csv:"):
        raise typer.BadParameter(
            f"unknown trace {name!r}; known: {', '.join(trace_names())}, or csv:<file>", param_hint="--trace"
        )


def check_profile(value: str, hint: str = "--profile") -> None:
    """Refuse a profile that is neither a shipped profile's name nor a readable latency profile CSV.

    Loads it as the simulator will (once per process per file), so that a bad
    value is named with its option before the run, as ``pool serve --profile`` does.

    Raises:
        typer.BadParameter: naming ``hint``, the value and the shipped names, or why the file cannot be read.
    """
    from esg_prefect.exceptions import ConfigError, InvalidInputError
    from esg_prefect.model.profile_source import profile_path
    from esg_prefect.simulator.case import resolve_profile

    try:
        profile_path(value)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint=hint) from None
    try:
        resolve_profile(value)
    except (OSError, InvalidInputError) as exc:
        raise typer.BadParameter(
            f"cannot read {value!r} ({exc}); give a latency profile CSV (esg-prefect profile writes one)",
            param_hint=hint,
        ) from None


def check_number(value: float, hint: str, what: str, *, zero_ok: bool = False) -> None:
    """Refuse a value that is not finite and > 0 (>= 0 with ``zero_ok``).

    Raises:
        typer.BadParameter: naming ``hint``, the accepted range, ``what`` it is, and the value.
    """
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        bound = ">= 0" if zero_ok else "> 0"
        raise typer.BadParameter(f"must be a finite number {bound} ({what}), got {value!r}", param_hint=hint)


def make_out_dir(path: Path, hint: str = "--out") -> None:
    """Create the output directory ``path`` before any run, so that a bad one fails before the work, not after.

    Raises:
        typer.BadParameter: naming ``hint`` and the path when it is a file or cannot be created.
    """
    if path.exists() and not path.is_dir():
        raise typer.BadParameter(
            f"{str(path)!r} is a file; give a directory (it is created if missing)", param_hint=hint
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise typer.BadParameter(f"cannot create directory {str(path)!r}: {exc.strerror}", param_hint=hint) from None


def with_settings(case: Any, pairs: Sequence[str]) -> Any:
    """``case`` with ESG settings overridden by ``KEY=VALUE`` pairs (``--set``; :func:`parse_settings`)."""
    if not pairs:
        return case
    return replace(case, settings=parse_settings(case.settings, pairs))


SET_FORMS = "--set reads a value as JSON or a Python literal: true/True, 0.25, \"p95\"/'p95', {...}; else as a string"
"""How a ``--set`` value is read (:func:`setting_value`): said with a refused value."""


def parse_settings(base: ESGSettings, pairs: Sequence[str]) -> ESGSettings:
    """``base`` with ``KEY=VALUE`` pairs applied (``--set``).

    A value is read by :func:`setting_value` (JSON, a Python literal, else a
    string), so that ``--set percentile=mean`` works unquoted and ``--set
    idle_vcpus=True`` as ``esg-prefect schedulers`` prints the default. Unknown
    keys and bad values are refused by :class:`~esg_prefect.scheduling.ESGSettings`
    with the name and the value in the message; a bad value's also says how values are read.

    Raises:
        typer.BadParameter: on a pair without ``=`` or a setting refused.
    """
    from esg_prefect.exceptions import ConfigError
    from esg_prefect.scheduling import ESGSettings

    data = base.to_dict()
    given = setting_pairs(pairs)
    data.update(given)
    try:
        return ESGSettings.from_dict(data)
    except (ConfigError, TypeError) as exc:
        known = all(key in ESGSettings.__dataclass_fields__ for key, _ in given)
        note = f" ({SET_FORMS})" if known else ""  # else the message is about the unknown key
        raise typer.BadParameter(f"{exc}{note}", param_hint="--set") from None


def setting_value(raw: str) -> Any:
    """One ``--set`` value: JSON (``true``, ``0.25``, ``"p95"``, ``{...}``), else a Python literal, else ``raw``.

    Python literals (``True``, ``None``, ``'p95'``, ``{'batches': [1, 2]}``) are how
    ``esg-prefect schedulers`` and docs/settings.md print the defaults, so a default
    copied from there is read as what it says. Anything else stays a string
    (``--set percentile=mean``), left for the setting's own check.
    """
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        pass
    try:
        return ast.literal_eval(raw.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return raw


def setting_pairs(pairs: Sequence[str]) -> list[tuple[str, Any]]:
    """``KEY=VALUE`` strings as (key, value), each value read by :func:`setting_value` (unchecked).

    Raises:
        typer.BadParameter: on a pair without ``=`` or without a key.
    """
    out: list[tuple[str, Any]] = []
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint="--set")
        out.append((key.strip(), setting_value(raw)))
    return out
