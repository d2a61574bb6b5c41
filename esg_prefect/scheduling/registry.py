"""Schedulers by name, so the runtime, the simulator and the CLI pick them alike.

A factory takes ``(profile, prices, settings, clock)`` and returns an object
with the :class:`~esg_prefect.scheduling.base.Scheduler` interface. ESG is registered
below; the baselines and ablations register in
:mod:`esg_prefect.scheduling.baselines` (``_register``), which is where a new
scheduler goes too (docs/architecture.md, "Adding a scheduler").

Example:
    >>> "esg" in scheduler_names()
    True
"""

from __future__ import annotations

from collections.abc import Callable

from esg_prefect.exceptions import InvalidInputError, UnknownSchedulerError
from esg_prefect.model.pricing import PriceSheet
from esg_prefect.model.profile import LatencyProfile
from esg_prefect.scheduling.base import Scheduler
from esg_prefect.scheduling.esg import ESGScheduler
from esg_prefect.scheduling.search import Clock
from esg_prefect.scheduling.settings import ESGSettings

SchedulerFactory = Callable[[LatencyProfile, PriceSheet, ESGSettings, "Clock | None"], Scheduler]

_REGISTRY: dict[str, tuple[SchedulerFactory, str]] = {}


def register_scheduler(name: str, factory: SchedulerFactory, description: str, *, replace: bool = False) -> None:
    """Make ``factory`` available as ``name``.

    Raises:
        InvalidInputError: on an empty name, or a name taken (unless ``replace``).
    """
    if not name or not name.replace("-", "").replace("_", "").isalnum():
        raise InvalidInputError(f"scheduler name must be letters, digits, '-' or '_', got {name!r}")
    if name in _REGISTRY and not replace:
        raise InvalidInputError(f"a scheduler named {name!r} is already registered")
    _REGISTRY[name] = (factory, description)


def scheduler_names() -> list[str]:
    """Registered names, sorted."""
    return sorted(_REGISTRY)


def describe_schedulers() -> dict[str, str]:
    """Name -> one-line description."""
    return {n: d for n, (_, d) in sorted(_REGISTRY.items())}


def create_scheduler(
    name: str,
    profile: LatencyProfile,
    prices: PriceSheet,
    settings: ESGSettings | None = None,
    clock: Clock | None = None,
) -> Scheduler:
    """Build the scheduler registered as ``name``.

    Raises:
        UnknownSchedulerError: naming the unknown name and the known ones.
    """
    try:
        factory, _ = _REGISTRY[name]
    except KeyError:
        raise UnknownSchedulerError(f"unknown scheduler {name!r}; known: {scheduler_names()}") from None
    return factory(profile, prices, settings or ESGSettings(), clock)


register_scheduler("esg", ESGScheduler, "ESG: A* with dual-blade pruning over the SLO segment, then ESG_Dispatch")
register_scheduler(
    "esg-unpruned",
    lambda p, pr, s, c: ESGScheduler(p, pr, s.without_pruning(), c),
    "ESG ablation: plain A* without blades and with the slack-blind heuristic",
)
