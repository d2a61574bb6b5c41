"""How a pool priced its runs: the pricing options the store keeps per pool, and reads its records with.

A run's cost depends on two of the pool's settings beyond its records and
prices: the cost split (``equal`` or ``input_size``) and the idle billing
(``attribute`` or ``separate``). The store keeps them per attached pool (its
scope), so that ``esg-prefect costs`` shows by default the figure the pool's
artifacts showed, whatever pools of other settings wrote to the same store.
A pool's ``idle_vcpus`` needs no row here: each stored idle interval says
whether its worker held its vCPUs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from esg_prefect.exceptions import ConfigError
from esg_prefect.model.attribution import COST_SPLITS, IDLE_BILLINGS, CostSplit, IdleBilling, one_of


@dataclass(frozen=True, slots=True)
class Billing:
    """The pricing options of one pool: how a batch's cost is split, and where warm idle time goes.

    Raises:
        ConfigError: a value that is neither of its two choices (e.g. a hand-edited store row).

    Example:
        >>> Billing("input_size", "separate").describe()
        'input_size split, idle time on the idle line'
    """

    cost_split: CostSplit = "equal"
    idle_billing: IdleBilling = "attribute"

    def __post_init__(self) -> None:
        if self.cost_split not in COST_SPLITS:
            raise ConfigError(f"cost_split must be {one_of(COST_SPLITS)}, got {self.cost_split!r}")
        if self.idle_billing not in IDLE_BILLINGS:
            raise ConfigError(f"idle_billing must be {one_of(IDLE_BILLINGS)}, got {self.idle_billing!r}")

    def describe(self) -> str:
        """The options in a few words, for the CLI's notes."""
        idle = "idle time to the runs before it" if self.idle_billing == "attribute" else "idle time on the idle line"
        return f"{self.cost_split} split, {idle}"

    def overridden(self, split: str | None, idle_billing: str | None) -> Billing:
        """These options with the caller's overrides (None: keep this one's)."""
        return Billing(cast(CostSplit, split or self.cost_split), cast(IdleBilling, idle_billing or self.idle_billing))


@dataclass(frozen=True, slots=True)
class PoolPricing:
    """How one pool's records were priced: the options it stored, and those used (overrides applied).

    ``stored`` is None for a pool that stored none (an older esg-prefect's): ``used`` is then
    the store's defaults, overridden.
    """

    stored: Billing | None
    used: Billing


DEFAULT_BILLING = Billing()
"""The defaults of ``ESGSettings``: what a pool that recorded no options (an older esg-prefect's) is read with."""


def billing_of(pool: object) -> Billing | None:
    """The options a pool prices with (its ``settings``); None for a record source without settings."""
    settings = getattr(pool, "settings", None)
    split, idle = getattr(settings, "cost_split", None), getattr(settings, "idle_billing", None)
    if not isinstance(split, str) or not isinstance(idle, str):
        return None
    return Billing(cast(CostSplit, split), cast(IdleBilling, idle))


def scope_of(scoped_id: str) -> str:
    """The scope of a stored batch or worker id (``3f2a:w1`` -> ``3f2a``; an unscoped ``w1`` -> ``""``)."""
    scope, sep, _ = scoped_id.partition(":")
    return scope if sep else ""
