"""What the pool plans with: the profile (rescaled by the online correction), the scheduler and its tables.

The online correction folds each batch's times into a per-(stage, hardware)
factor and per-batch overhead: the worker's own time drives the factor, and
the rest of the round trip as the pool saw it (inputs sent, batch run, outputs
back: what the plan's batch latency has to cover) the overhead; for an
in-process worker the round trip is all of it. Re-planning (a rescaled profile,
a new scheduler and tables) happens when a factor moved by more than 10 % from
the one in use, or an overhead by more than 10 % of a typical batch (and
0.5 ms), at most once a second; the scheduler keeps no state between rounds
that this would lose (arrival rates live in the core).
"""

from __future__ import annotations

import logging
import math

from esg_prefect.control.records import CorrectionRow
from esg_prefect.model.config import Config
from esg_prefect.model.correction import LatencyCorrection
from esg_prefect.model.pricing import PriceSheet, warn_price_mismatches
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
        warn_price_mismatches(prices, profile.all_hardware())  # a misnamed GPU price, once, where the two meet
        self.scheduler_name, self._clock = scheduler_name, scheduler_clock
        alpha = settings.correction_alpha
        self.correction: LatencyCorrection | None = LatencyCorrection(alpha) if alpha > 0 else None
        self.applied: dict[tuple[str, str], float] = {}  # factors the profile in use was scaled with
        self.applied_overheads: dict[tuple[str, str], float] = {}  # and the per-batch overheads it adds, in ms
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
        self.replan(self._corrected())

    def _corrected(self) -> LatencyProfile:
        """The base profile with the factors and overheads applied now."""
        if not self.applied and not self.applied_overheads:
            return self.base_profile
        return self.base_profile.scaled(self.applied, self.applied_overheads)

    def correct(
        self,
        stage: str,
        hardware: str,
        vcpus: int,
        share: float,
        sizes: list[float],
        actual_ms: float,
        now_ms: float,
        own_ms: float | None = None,
    ) -> bool:
        """Fold one batch's times in; True when the profile was re-planned.

        ``actual_ms``: the round trip as the pool saw it; ``own_ms``: the
        worker's own time for the batch, None when the two are one (see
        :meth:`LatencyCorrection.observe`).
        """
        if self.correction is None:
            return False
        cfg = Config(len(sizes), vcpus, share)
        # The items' size scales the table's time only, not the profile's per-batch overhead (as planned).
        factor = self.base_profile.size_factor(stage, cfg, hardware, sizes)
        predicted = self.base_profile.try_latency_ms(stage, cfg, hardware, "mean", factor)
        if predicted is None:
            return False
        corr = self.correction
        corr.observe(stage, hardware, predicted, actual_ms, own_ms)
        if now_ms - self._replanned_ms < self.replan_every_ms or not corr.drifted(
            self.applied, overheads=self.applied_overheads
        ):
            return False
        self._replanned_ms = now_ms
        self.applied, self.applied_overheads = corr.factors(), {k: o for k, o in corr.overheads().items() if o > 0}
        self.replan(self._corrected())
        extra = self.applied_overheads
        logger.info(
            "profile corrected from measured batches: %s",
            ", ".join(
                f"{st}@{hw} x{f:.2f}" + (f" +{extra[st, hw]:.2f} ms" if (st, hw) in extra else "")
                for (st, hw), f in sorted(self.applied.items())
            ),
        )
        return True

    def corrections(self) -> tuple[CorrectionRow, ...]:
        """The online correction's learned factors and overheads, and the factors the scheduler plans with now."""
        if self.correction is None:
            return ()
        return tuple(
            CorrectionRow(
                stage,
                hw,
                round(f, 4),
                round(self.applied.get((stage, hw), 1.0), 4),
                self.correction.observations(stage, hw),
                round(self.correction.overhead_ms(stage, hw), 3),
            )
            for (stage, hw), f in sorted(self.correction.factors().items())
        )
