"""PALDIA's two features as ESG hooks: built from the knobs, None when off.

:class:`~esg_prefect.scheduling.esg.ESGScheduler` calls :func:`paldia_features`
once; with both knobs off (the defaults) it gets ``(None, None)`` and runs the
paper's ESG unchanged. Kept apart so that ESG's module only holds the hooks.
"""

from __future__ import annotations

from esg_prefect.exceptions import ConfigError, ProfileError
from esg_prefect.model.interference import CoRunModel
from esg_prefect.scheduling.hardware import HardwareSelector
from esg_prefect.scheduling.hybrid import HybridSharing
from esg_prefect.scheduling.tables import CandidateTables

__all__ = ["corun_model", "paldia_features"]


def paldia_features(tables: CandidateTables) -> tuple[HardwareSelector | None, HybridSharing | None]:
    """The hardware selector and the hybrid-sharing reviewer the settings ask for (None when off).

    Raises:
        ConfigError: when ``corun_table`` names no readable co-run table, naming it.
    """
    s = tables.settings.paldia
    hardware = HardwareSelector(tables, s.hardware_utilization) if s.hardware_selection else None
    hybrid = None
    if s.hybrid_sharing:
        hybrid = HybridSharing(tables, corun_model(s.corun_table))
    return hardware, hybrid


def corun_model(table: str) -> CoRunModel:
    """The co-run table ``table`` (a shipped name or a path) as hybrid sharing reads it.

    Raises:
        ConfigError: when it names no readable co-run table, naming it.
    """
    try:
        return CoRunModel.load(table)
    except (ProfileError, OSError) as exc:
        raise ConfigError(f"corun_table {table!r}: {exc}") from exc
