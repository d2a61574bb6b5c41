"""ESG ablations: ESG with one of its ideas taken away (ESG-SPEC section 8).

``esg-noshare`` — no GPU sharing
    ESG unchanged, but its configuration space keeps only whole GPUs (share
    1.0) and the CPU (share 0): what ESG gains from sharing GPUs.

``esg-greedy`` — greedy per stage with an even SLO split
    ESG's ESG_1Q restricted to the queue's own stage (a horizon of one stage:
    no downstream stages are planned with it), and jobs judged against an even
    split of the SLO (stage at depth d of a workflow whose longest path has K
    stages: arrival + SLO * d / K) instead of the dominator-based split with
    slack redistribution. Batching, sharing and placement stay ESG's: what ESG
    gains from being pipeline-conscious.

``esg-fastest`` — the spec's best effort
    ESG unchanged, but a queue no plan can serve in time goes on the fastest
    placeable option (``best_effort_tolerance`` 0, ESG-SPEC's rule) instead of
    the cheapest one within 10 % of it (this project's default): what the
    tolerance changes, and the paper's ESG for a reproduction.

``esg-unpruned`` — no pruning (registered by the scheduler core)
    Plain A* without the two blades and with the slack-blind heuristic; the
    same plans, more expansions (experiment E4).

These reuse :class:`~esg_prefect.scheduling.esg.ESGScheduler` itself, so they
change exactly one thing each.
"""

from __future__ import annotations

from dataclasses import replace

from esg_prefect.model.config import ConfigSpace
from esg_prefect.model.jobs import Job
from esg_prefect.model.pricing import PriceSheet
from esg_prefect.model.profile import LatencyProfile
from esg_prefect.model.workflow import Workflow
from esg_prefect.scheduling.base import QueueState, SchedulingResult, Snapshot
from esg_prefect.scheduling.baselines.common import even_split_deadline_ms
from esg_prefect.scheduling.esg import ESGScheduler
from esg_prefect.scheduling.search import Clock
from esg_prefect.scheduling.settings import ESGSettings
from esg_prefect.scheduling.tables import CandidateTables


def no_share_settings(settings: ESGSettings) -> ESGSettings:
    """``settings`` with GPU shares restricted to whole GPUs (and the CPU where the space has it)."""
    space = settings.config_space
    shares = tuple(s for s in space.gpu_shares if s in (0.0, 1.0)) or (1.0,)
    return replace(settings, config_space=ConfigSpace(space.batches, space.vcpus, shares))


class _OneStageTables(CandidateTables):
    """Candidate tables whose search horizon is the stage alone."""

    def horizon(self, workflow: Workflow, stage: str, hardware: frozenset[str]) -> tuple[str, ...]:
        """Only ``stage``: no downstream stage is planned with it."""
        return (stage,)


class GreedyESGScheduler(ESGScheduler):
    """ESG_1Q on one stage at a time, against even-split deadlines (module docstring)."""

    name = "esg-greedy"

    def __init__(
        self,
        profile: LatencyProfile,
        prices: PriceSheet,
        settings: ESGSettings | None = None,
        clock: Clock | None = None,
    ) -> None:
        s = replace(settings or ESGSettings(), search_horizon="segment")
        super().__init__(profile, prices, s, clock)
        self.tables = _OneStageTables(profile, prices, s)
        self._rewritten: dict[str, tuple[Job, Job]] = {}  # job id -> (as given, with the even-split deadline)

    def decide(self, snapshot: Snapshot, now_ms: float) -> SchedulingResult:
        """ESG's round on a snapshot whose jobs carry even-split deadlines."""
        queues = []
        seen: dict[str, tuple[Job, Job]] = {}
        for q in snapshot.queues:
            wf = snapshot.workflows[q.key.workflow]
            jobs = []
            for j in q.jobs:
                got = self._rewritten.get(j.job_id)
                if got is None or got[0] is not j:
                    even = even_split_deadline_ms(wf, q.key.stage, j.arrival_ms)
                    got = (j, replace(j, deadline_ms=even))
                seen[j.job_id] = got
                jobs.append(got[1])
            queues.append(QueueState(q.key, tuple(jobs), q.arrival_rate_per_s))
        self._rewritten = seen  # forget jobs that left the queues
        return super().decide(Snapshot(tuple(queues), snapshot.cluster, snapshot.workflows), now_ms)


def make_noshare(
    profile: LatencyProfile, prices: PriceSheet, settings: ESGSettings, clock: Clock | None
) -> ESGScheduler:
    """ESG restricted to whole GPUs (and the CPU)."""
    sched = ESGScheduler(profile, prices, no_share_settings(settings), clock)
    sched.name = "esg-noshare"
    return sched


def make_fastest(
    profile: LatencyProfile, prices: PriceSheet, settings: ESGSettings, clock: Clock | None
) -> ESGScheduler:
    """ESG whose best effort takes the fastest option (the spec's rule: tolerance 0)."""
    sched = ESGScheduler(profile, prices, replace(settings, best_effort_tolerance=0.0), clock)
    sched.name = "esg-fastest"
    return sched
