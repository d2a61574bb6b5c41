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

And one loader, :func:`read_profile`, so that a name means one profile too: the
simulator predicts with what ``pool serve`` plans with, size model included.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from esg_prefect.exceptions import ConfigError
from esg_prefect.model.profile import LatencyProfile
from esg_prefect.model.size_model import SizeModel

__all__ = [
    "PROFILE_DIR",
    "SIZE_SAMPLES",
    "is_shipped_name",
    "load_profile",
    "profile_path",
    "read_profile",
    "shipped_profiles",
    "shipped_size_model",
]

PROFILE_DIR = Path(__file__).resolve().parents[1] / "data" / "profiles"
"""The shipped profiles' folder: a profile named ``"nvidia_gpu"`` is ``PROFILE_DIR / "nvidia_gpu.csv"``.

The one definition of it: the runtime's default profile, the co-run table and the
GPU-table builder all read and write their shipped files here."""

SIZE_SAMPLES = "profiler_examples_cpu_samples.csv"
"""The profiler's per-call samples shipped in :data:`PROFILE_DIR` (the example stages on this
project's CPU), from which every shipped table's size model (Cypress) is fitted."""

_NOT_PROFILES = ("_sources", "_samples", "_stalls", "_corun", "_validation")  # the profiler's other outputs


@lru_cache(maxsize=1)
def shipped_profiles() -> tuple[str, ...]:
    """Names of the latency profiles shipped with the package (not the profiler's other tables), sorted.

    Listed once per process: the package's files do not change while it runs, and every profile
    given by name asks (:func:`is_shipped_name`).
    """
    return tuple(sorted(p.stem for p in PROFILE_DIR.glob("*.csv") if not p.stem.endswith(_NOT_PROFILES)))


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


@lru_cache(maxsize=4)
def shipped_size_model(samples: str = SIZE_SAMPLES) -> SizeModel | None:
    """The size model fitted from the shipped samples file ``samples``; None when it is absent.

    Fitted once per process: every shipped table shares it.
    """
    path = PROFILE_DIR / samples
    return SizeModel.from_samples_csv(path) if path.is_file() else None


def read_profile(path: Path) -> LatencyProfile:
    """The latency profile in the CSV file ``path``, with its size model.

    A shipped table (a file of :data:`PROFILE_DIR` with a shipped name, however
    it was reached) carries :func:`shipped_size_model`: a size *factor* is a
    ratio to the typical item, so it carries over to a table measured in
    another run, and stages or hardware the samples do not cover keep factor 1.
    Any other file carries the samples beside it (:meth:`LatencyProfile.from_csv`).

    Raises:
        OSError: when the file cannot be read.
        ProfileError: naming the row and column of a malformed value.
    """
    profile = LatencyProfile.from_csv(path)
    if path.resolve().parent == PROFILE_DIR and is_shipped_name(path.stem):
        return profile.with_sizes(shipped_size_model())
    return profile


def load_profile(value: str) -> LatencyProfile:
    """The latency profile a shipped name or a CSV path names (:func:`profile_path`, :func:`read_profile`).

    Raises:
        ConfigError: when ``value`` is neither a shipped name nor a file.
        OSError, ProfileError: when the file cannot be read as a profile.
    """
    return read_profile(profile_path(value))
