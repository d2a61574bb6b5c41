"""Which file a latency profile given as text is read from: a shipped profile's name, or a CSV path.

One rule wherever a profile is given by name or by path (a case's ``profile``,
``simulate --profile``, a case file, ``pool serve --profile``):

1. A value that is exactly a shipped profile's name (``nvidia_gpu``: no folder,
   no ``.csv``) is that shipped table, whatever files the working directory holds.
2. Anything else is the path of a CSV file, which must exist.

So a name means the same table in every folder and on every machine (a case
file naming ``nvidia_gpu`` runs the same anywhere, and a stray file or an
``--out nvidia_gpu`` folder cannot hijack it), while a file of one's own that
shares a shipped name is still reachable written as a path: ``./nvidia_gpu``.
"""

from __future__ import annotations

from pathlib import Path

from esg_prefect.exceptions import ConfigError

__all__ = ["PROFILE_DIR", "is_shipped_name", "profile_path", "shipped_profiles"]

PROFILE_DIR = Path(__file__).resolve().parents[1] / "data" / "profiles"
"""The shipped profiles' folder: a profile named ``"nvidia_gpu"`` is ``PROFILE_DIR / "nvidia_gpu.csv"``.

The one definition of it: the runtime's default profile, the co-run table and the
GPU-table builder all read and write their shipped files here."""

_NOT_PROFILES = ("_sources", "_samples", "_stalls", "_corun", "_validation")  # the profiler's other outputs


def shipped_profiles() -> list[str]:
    """Names of the latency profiles shipped with the package (not the profiler's other tables), sorted."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.csv") if not p.stem.endswith(_NOT_PROFILES))


def is_shipped_name(value: str) -> bool:
    """Whether ``value`` names a shipped profile (rule 1 of the module docstring), not a path."""
    return value in shipped_profiles()


def profile_path(value: str) -> Path:
    """The CSV file a profile value names: the shipped table for a shipped name, else ``value`` as a path.

    Raises:
        ConfigError: in one line naming ``value`` and the shipped names, when it is
            neither a shipped name nor an existing file (a folder is not one).
    """
    if is_shipped_name(value):
        return PROFILE_DIR / f"{value}.csv"
    path = Path(value)
    if path.is_file():
        return path
    raise ConfigError(
        f"profile {value!r} is neither a shipped profile's name ({', '.join(shipped_profiles())}) nor a file; "
        "give a latency profile CSV (esg-prefect profile writes one) or one of those names"
    )
