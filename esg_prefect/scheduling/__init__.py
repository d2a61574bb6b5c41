"""Scheduler core: pure functions of a snapshot and a time value.

Imports neither prefect, torch, asyncio nor an HTTP library (a test checks it).
"""

from esg_prefect.scheduling.base import (
    DecisionStats,
    Dispatch,
    Hold,
    Placement,
    QueueState,
    Reject,
    Scheduler,
    SchedulingResult,
    Snapshot,
    Start,
)
from esg_prefect.scheduling.dispatch import ClusterView
from esg_prefect.scheduling.esg import ESGScheduler
from esg_prefect.scheduling.frontier import Option, SuffixFrontiers, pareto_prune
from esg_prefect.scheduling.registry import (
    create_scheduler,
    describe_schedulers,
    register_scheduler,
    scheduler_names,
)
from esg_prefect.scheduling.search import SearchResult, SearchStats, astar_plan, greedy_plan
from esg_prefect.scheduling.settings import ESGSettings
from esg_prefect.scheduling.tables import CandidateTables, Choice

__all__ = [
    "CandidateTables",
    "Choice",
    "ClusterView",
    "DecisionStats",
    "Dispatch",
    "ESGScheduler",
    "ESGSettings",
    "Hold",
    "Option",
    "Placement",
    "QueueState",
    "Reject",
    "Scheduler",
    "SchedulingResult",
    "SearchResult",
    "SearchStats",
    "Snapshot",
    "Start",
    "SuffixFrontiers",
    "astar_plan",
    "create_scheduler",
    "describe_schedulers",
    "greedy_plan",
    "pareto_prune",
    "register_scheduler",
    "scheduler_names",
]
from esg_prefect.scheduling import baselines as baselines  # registers the baselines
