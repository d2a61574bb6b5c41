"""What the pool plans with: the profile (rescaled by the online correction), the scheduler and its tables.

The online correction folds each batch's time as the pool saw it (inputs sent,
batch run, outputs back: what the plan's batch latency has to cover) into a
per-(stage, hardware) factor. Re-planning (a rescaled profile, a new scheduler
and tables) happens when a factor moved by more than 10 % from the one in use,
at most once a second; the scheduler keeps no state between rounds that this
would lose (arrival rates live in the core).
"""

from __future__ import annotations

import logging
import math

from esg_prefect.control.records import CorrectionRow
from esg_prefect.model.config import Config
from esg_prefect.model.correction import LatencyCorrection
from esg_prefect.model.pricing import PriceSheet
from esg_prefect.model.profile import LatencyProfile
from esg_prefect.scheduling import ESGSettings, Scheduler, create_scheduler
from esg_prefect.scheduling.search import Clock
from esg_prefect.scheduling.tables import CandidateTables

logger = logging.getLogger(__name__)

REPLAN_EVERY_MS = 1000.0  # at most one re-plan from a corrected profile per second


class Planner:
    """The base profile, the profile planned with now, the scheduler and tables built from it.

    Args:
        profile: the measured or shipped profile.
        prices: the price sheet.
        settings: the knobs (``correction_alpha`` 0 turns the correction off).
        scheduler_name: a registered scheduler.
        scheduler_clock: the wall clock for the scheduler's time budget (None: none).
    """

    def __init__(
        self,
        profile: LatencyProfile,
        prices: PriceSheet,
        settings: ESGSettings,
        scheduler_name: str,
        scheduler_clock: Clock | None,
    ) -> None:
        self.base_profile = profile
        self.prices, self.settings = prices, settings
        self.scheduler_name, self._clock = scheduler_name, scheduler_clock
        alpha = settings.correction_alpha
        self.correction: LatencyCorrection | None = LatencyCorrection(alpha) if alpha > 0 else None
        self.applied: dict[tuple[str, str], float] = {}  # factors the profile in use was scaled with
        self.replan_every_ms = REPLAN_EVERY_MS
        self._replanned_ms = -math.inf
        self.profile = profile
        self.scheduler: Scheduler = create_scheduler(scheduler_name, profile, prices, settings, clock=scheduler_clock)
        self.tables = CandidateTables(profile, prices, settings)

    def replan(self, profile: LatencyProfile) -> None:
        """Plan with ``profile`` from now on (a new scheduler and tables)."""
        self.profile = profile
        self.scheduler = create_scheduler(self.scheduler_name, profile, self.prices, self.settings, clock=self._clock)
        self.tables = CandidateTables(profile, self.prices, self.settings)

    def alias(self, name: str, stage: str) -> None:
        """Plan stage ``name`` with the profile of ``stage`` (a second code under one name)."""
        self.base_profile = self.base_profile.aliased({name: stage})
        self.replan(self.base_profile.scaled(self.applied) if self.applied else self.base_profile)

    def correct(
        self, stage: str, hardware: str, vcpus: int, share: float, sizes: list[float], actual_ms: float, now_ms: float
    ) -> bool:
        """Fold one batch's measured time in; True when the profile was re-planned."""
        if self.correction is None:
            return False
        cfg = Config(len(sizes), vcpus, share)
        predicted = self.base_profile.try_latency_ms(stage, cfg, hardware, "mean")
        if predicted is None:
            return False
        predicted *= self.base_profile.size_factor(stage, cfg, hardware, sizes)
        self.correction.observe(stage, hardware, predicted, actual_ms)
        if now_ms - self._replanned_ms < self.replan_every_ms or not self.correction.drifted(self.applied):
            return False
        self._replanned_ms = now_ms
        self.applied = self.correction.factors()
        self.replan(self.base_profile.scaled(self.applied))
        logger.info(
            "profile corrected from measured batches: %s",
            ", ".join(f"{st}@{hw} x{f:.2f}" for (st, hw), f in sorted(self.applied.items())),
        )
        return True

    def corrections(self) -> tuple[CorrectionRow, ...]:
        """The online correction's learned factors, and the ones the scheduler plans with now."""
        if self.correction is None:
            return ()
        return tuple(
            CorrectionRow(
                stage,
                hw,
                round(f, 4),
                round(self.applied.get((stage, hw), 1.0), 4),
                self.correction.observations(stage, hw),
            )
            for (stage, hw), f in sorted(self.correction.factors().items())
        )
