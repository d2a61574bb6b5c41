"""A queue's one-stage answer kept between rounds, with the inputs it holds for.

A queue is decided again every round while it waits, mostly with the same
inputs. For a one-stage search the answer depends on the queue's length, its
arrival rate, the placeable resources, the workflow, the hardware present, and
on the slack only through which options fit in it: it holds over a slack
interval (:class:`~esg_prefect.scheduling.tables.FirstPick`'s ``lo_us``,
``hi_us``). :meth:`ESGScheduler.decide_queue
<esg_prefect.scheduling.esg.ESGScheduler.decide_queue>` reuses it while they
are the same.
"""

from __future__ import annotations

from esg_prefect.model.workflow import Workflow
from esg_prefect.scheduling.base import DecisionStats, search_stats
from esg_prefect.scheduling.esg_round import DecisionKind
from esg_prefect.scheduling.frontier import Option
from esg_prefect.scheduling.tables import Choice, FirstPick, Resource

__all__ = ["Kept", "with_decision_ms"]


def with_decision_ms(r: DecisionStats, decision_ms: float | None) -> DecisionStats:
    """``dataclasses.replace(r, decision_ms=decision_ms)``, without its overhead."""
    return search_stats(
        r.queue,
        r.expansions,
        r.generated,
        r.cut_latency,
        r.cut_cost,
        r.budget_hit,
        decision_ms,
        r.feasible,
        r.horizon,
        r.options,
    )


class Kept:
    """A queue's latest one-stage answer and the inputs it holds for.

    ``choice`` is the answer when feasible (``kind`` says dispatch or wait);
    otherwise ``best`` is the best-effort option to fall back on. ``stats``
    are kept without a decision time (each reuse measures its own).
    """

    __slots__ = (
        "best",
        "choice",
        "feasible",
        "hardware",
        "hi_us",
        "kind",
        "lo_us",
        "n",
        "rate",
        "resources",
        "stats",
        "workflow",
    )

    def __init__(
        self,
        n: int,
        rate: float,
        resources: tuple[Resource, ...],
        workflow: Workflow,
        hardware: frozenset[str],
        pick: FirstPick,
        stats: DecisionStats,
        kind: DecisionKind,
        choice: Choice | None,
        best: Option | None,
    ) -> None:
        self.n = n
        self.rate = rate
        self.resources = resources
        self.workflow = workflow
        self.hardware = hardware
        self.lo_us = pick.lo_us
        self.hi_us = pick.hi_us
        self.stats = stats if stats.decision_ms is None else with_decision_ms(stats, None)
        self.feasible = choice is not None or best is None
        self.kind = kind
        self.choice = choice
        self.best = best

    def holds(
        self,
        n: int,
        rate: float,
        resources: tuple[Resource, ...],
        workflow: Workflow,
        hardware: frozenset[str],
        slack_us: float,
    ) -> bool:
        """Whether the answer holds for these inputs (the same objects, and the slack in its interval)."""
        return (
            self.lo_us <= slack_us < self.hi_us
            and self.n == n
            and self.rate == rate
            and self.resources is resources
            and self.workflow is workflow
            and self.hardware == hardware
        )
