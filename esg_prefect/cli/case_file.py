"""A case file for ``simulate`` and ``compare --case``: reading it, and the notes printed about it.

A case file is the JSON that ``esg-prefect simulate --out DIR`` writes
(:class:`~esg_prefect.simulator.case.Case`). Reading it names every mistake in
one line naming ``--case``; its relative paths are read from its own folder
first. The notes say what a user's own case does that they may not expect: an
SLO most likely written in seconds, a CSV trace replayed at another speed, GPU
types no stage is profiled on. A case
file written into a folder has its paths made to be read from there.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

__all__ = [
    "CASE_ACCEPTS",
    "CASE_KEYS",
    "case_dict_in",
    "given_options",
    "load_case",
    "note_case",
    "note_csv_replay",
    "note_noisy_profile",
    "note_unused_gpus",
    "warn_seconds_slos",
]

CASE_ACCEPTS = "a case JSON file, such as the case.json that `esg-prefect simulate --out DIR` writes"


def _case_paths(data: dict[str, Any], change: Callable[[str], str]) -> None:
    """Apply ``change`` to a case's file paths in place: ``profile`` and a ``csv:`` trace's file.

    A shipped profile's name is not a path and is left as it is; a changed profile path that
    would read as such a name is written ``./NAME`` (:mod:`esg_prefect.model.profile_source`).
    """
    from esg_prefect.model.profile_source import is_shipped_name

    profile = data.get("profile")
    if isinstance(profile, str) and profile and not is_shipped_name(profile):
        changed = change(profile)
        data["profile"] = f"./{changed}" if is_shipped_name(changed) else changed
    workload = data.get("workload")
    if isinstance(workload, dict) and isinstance(workload.get("trace"), str) and workload["trace"].startswith("csv:"):
        workload["trace"] = "csv:" + change(workload["trace"][4:])


def _paths_beside(data: dict[str, Any], folder: Path) -> None:
    """Read a case's relative paths (``profile``, a ``csv:`` trace) from the case file's folder when they are there.

    As a user writes them: next to the case. A path found only from the
    working directory is left as it is, and so is a shipped profile's name.
    """

    def beside(value: str) -> str:
        if not value or Path(value).is_absolute():
            return value
        there = folder / value
        return str(there) if there.is_file() else value

    _case_paths(data, beside)


def case_dict_in(case: Any, folder: Path) -> dict[str, Any]:
    """``case.to_dict()`` for a case file written into ``folder`` (``simulate --out``).

    Its relative paths are relative to the working directory, but a case file's
    are read from the file's folder first (:func:`load_case`): a file under
    ``folder`` is written relative to it, any other absolute, so that the case
    file runs from any working directory. Absolute paths and shipped profile
    names are written as they are.
    """
    home = folder.resolve()

    def portable(value: str) -> str:
        path = Path(value)
        if path.is_absolute() or not path.is_file():
            return value
        path = path.resolve()
        return str(path.relative_to(home)) if path.is_relative_to(home) else str(path)

    data: dict[str, Any] = case.to_dict()
    _case_paths(data, portable)
    return data


def load_case(path: Path) -> Any:
    """The case in the JSON file ``path`` (``--case``).

    Raises:
        typer.BadParameter: naming ``--case``, the path, and what is accepted, for a
            missing or unreadable file, bad JSON, or a case the simulator refuses.
    """
    from esg_prefect.exceptions import ESGError
    from esg_prefect.simulator import Case

    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise typer.BadParameter(f"no file {str(path)!r}; give {CASE_ACCEPTS}", param_hint="--case") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise typer.BadParameter(
            f"cannot read {str(path)!r} ({type(exc).__name__}); give {CASE_ACCEPTS}", param_hint="--case"
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(
            f"{str(path)!r} is not JSON ({exc.msg}, line {exc.lineno}); give {CASE_ACCEPTS}", param_hint="--case"
        ) from None
    if not isinstance(data, dict):
        raise typer.BadParameter(
            f"{str(path)!r} holds a JSON {type(data).__name__}, not an object; give {CASE_ACCEPTS}",
            param_hint="--case",
        )
    _paths_beside(data, path.parent)
    try:
        return Case.from_dict(data)
    except (ESGError, TypeError, ValueError) as exc:
        raise typer.BadParameter(f"{str(path)!r} is not a valid case: {exc}", param_hint="--case") from None


def warn_seconds_slos(case: Any, console: Console) -> None:
    """Warn, one line each, of a case's workflows whose ``slo_ms`` is most likely written in seconds.

    ``Pipeline``'s rule (:func:`~esg_prefect.model.workflow.seconds_slo_hint`): ``slo_ms: 0.5`` meant as
    half a second misses with every request, and nothing else would say why. The case runs as written:
    a tiny SLO can be meant in a simulation.
    """
    from esg_prefect.model.workflow import seconds_slo_hint

    for wf in case.workflows:
        hint = seconds_slo_hint(wf.slo_ms)
        if hint is not None:
            console.print(
                f"warning: workflow {wf.name!r}: slo_ms={wf.slo_ms:g} is {wf.slo_ms:g} ms; {hint} "
                "(the case runs as written)",
                highlight=False,
                soft_wrap=True,
            )


def note_unused_gpus(case: Any, console: Console) -> None:
    """Say which of a case's GPU types no stage is profiled on (a misspelt type runs silently otherwise)."""
    unused = case.unused_gpu_types()
    if unused:
        console.print(
            f"note: no stage of this case has a latency profile on {', '.join(unused)}: those GPUs stay unused "
            f"(the profile covers {', '.join(case.profiled_hardware())})",
            highlight=False,
        )


def note_csv_replay(case: Any, console: Console, from_file: bool = True) -> None:
    """Say how a user's CSV trace is replayed: at what speed against its own rate, and from where.

    ``from_file``: the case came from a case file (its ``workload`` keys set the replay), else from
    the standard case's options (``--rate``).
    """
    wl = case.workload
    if not wl.trace.startswith("csv:"):
        return
    from esg_prefect.workload.arrivals import csv_trace_rate

    rows, own = csv_trace_rate(wl.trace[4:])
    pace = replay_pace(wl.rate_per_s / own)
    where = (
        "from its first row"
        if wl.start_s == 0
        else (
            f"from {wl.start_s:g} s into it" if wl.start_s is not None else "from a point the seed picks (start_s null)"
        )
    )
    console.print(
        f"note: your trace ({rows} rows, {own:.4g} requests/s) is replayed at {wl.rate_per_s:g} requests/s, {pace}, "
        f"{where}; {'workload.rate_per_s' if from_file else '--rate'} {own:.6g} and "
        f"{'workload.start_s 0' if from_file else 'start_s 0 (in a case file)'} replay it as recorded "
        "(docs/simulator.md)",
        highlight=False,
    )


def replay_pace(speed: float) -> str:
    """``speed`` (replay rate / the trace's own rate) in words, the factor always >= 1.

    Examples:
        >>> replay_pace(10 / 10.7)
        '1.07x slower'
        >>> replay_pace(3.0), replay_pace(1.004)
        ('3x faster', 'in real time')
    """
    if abs(speed - 1.0) < 0.01:
        return "in real time"
    return f"{speed:.3g}x faster" if speed > 1 else f"{1 / speed:.3g}x slower"


def note_case(case: Any, console: Console) -> None:
    """The notes on a user's case file: SLOs likely in seconds, GPUs no stage can use, how a CSV trace is
    replayed, a noisy profile."""
    warn_seconds_slos(case, console)
    note_unused_gpus(case, console)
    note_csv_replay(case, console)
    note_noisy_profile(case.profile, console)


def note_noisy_profile(profile: Any, console: Console) -> None:
    """Say which stages of a user's profile CSV were timed with other processes on their cores, or take less
    time at a bigger batch: the profiler warned as it wrote them, and ESG plans with them as they are (a batch
    of one the cheapest per call, say, makes it split queues and start workers a quiet profile would not)."""
    from esg_prefect.model.profile_source import is_shipped_name, profile_path
    from esg_prefect.profiler.report import noise_warnings
    from esg_prefect.profiler.results import read_profile_csv

    if not isinstance(profile, str) or is_shipped_name(profile):
        return  # a profile given as an object, or one shipped: nothing of the user's to check
    try:
        path = profile_path(profile)
        lines = noise_warnings(read_profile_csv(path))
    except Exception:  # unreadable here: the case's own load says why, this note is only advice
        return
    for line in lines:
        console.print(f"note: profile {path}: {line.removeprefix('warning: ')}", highlight=False, soft_wrap=True)


CASE_KEYS: dict[str, str] = {
    "rate": "workload.rate_per_s",
    "trace": "workload.trace",
    "duration": "duration_s",
    "warmup": "warmup_s",
    "tightness": "each workflow's slo_ms",
    "profile": "profile",
}
"""The standard case's options, and where a case file holds each instead."""


def given_options(ctx: typer.Context, names: Iterable[str]) -> list[str]:
    """Which of these options of the running command were given (on the command line or by environment)."""
    sources = {n: ctx.get_parameter_source(n) for n in names}
    return [n for n, src in sources.items() if src is not None and src.name not in ("DEFAULT", "DEFAULT_MAP")]
