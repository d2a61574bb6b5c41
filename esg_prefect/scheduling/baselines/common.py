"""Building blocks shared by the baselines: latencies, even SLO split, placement, dispatches.

Every baseline is a :class:`~esg_prefect.scheduling.base.Scheduler` like ESG:
it sees the same :class:`~esg_prefect.scheduling.base.Snapshot` (queues with
their arrival-rate estimates, the cluster, the workflows) and returns the same
decisions. They reuse ESG's neutral machinery: the latency model through
:class:`~esg_prefect.scheduling.tables.CandidateTables` (cached, with the same
planning percentile) and ESG_Dispatch's placement through
:class:`~esg_prefect.scheduling.dispatch.ClusterView` (warm worker first, then
a cold start, best fit), so that the differences measured are the ones each
system is known for, not incidental ones.

The autoscaling rule of the baselines, from the systems they model (Triton
under a queue-driven autoscaler such as KServe's, INFless's and FaST-GShare's
rate-driven scaling, Llama's on-demand instances): a stage never has more than
one worker *starting* at a time; a new worker counts as capacity from the
moment it is requested. Schedulers see no clock, so each baseline remembers
when it requested the last cold start of each stage and treats it as starting
until its cold-start time (from the profile) has passed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache
from operator import attrgetter

from esg_prefect.model.config import CPU, Config
from esg_prefect.model.jobs import Job, QueueKey
from esg_prefect.model.pricing import PriceSheet
from esg_prefect.model.profile import LatencyProfile
from esg_prefect.model.workflow import Workflow
from esg_prefect.scheduling.base import Dispatch, Placement, QueueState
from esg_prefect.scheduling.dispatch import ClusterView, ViewCache
from esg_prefect.scheduling.search import Clock
from esg_prefect.scheduling.settings import ESGSettings
from esg_prefect.scheduling.tables import CandidateTables

Resource = tuple[str, int, float]
"""(hardware, vcpus, gpu_share)."""


@lru_cache(maxsize=256)
def _depths(workflow: Workflow) -> tuple[dict[str, int], int]:
    depth: dict[str, int] = {}
    for s in workflow.topological_order():
        depth[s] = 1 + max((depth[p] for p in workflow.predecessors(s)), default=0)
    return depth, max(depth.values())


def even_split_deadline_ms(workflow: Workflow, stage: str, arrival_ms: float) -> float:
    """Deadline of ``stage`` when the SLO is split evenly over the longest path's stages.

    A stage at depth ``d`` (stages on the longest path from an entry to it,
    itself included) of a workflow whose longest path has ``K`` stages must
    finish by ``arrival + slo * d / K``: the "even SLO split" of INFless-style
    per-function scheduling.

    Examples:
        >>> wf = Workflow.chain("w", ["a", "b", "c", "d"], slo_ms=100)
        >>> even_split_deadline_ms(wf, "b", 10.0)
        60.0
    """
    depth, k = _depths(workflow)
    return arrival_ms + workflow.slo_ms * depth[stage] / k


def stage_budget_ms(workflow: Workflow) -> float:
    """The per-stage budget of the even split: SLO over the longest path's stage count."""
    return workflow.slo_ms / _depths(workflow)[1]


_EDF_KEY = attrgetter("deadline_ms", "ready_ms", "job_id")  # C-level keys: queues can hold thousands of jobs
_FIFO_KEY = attrgetter("ready_ms", "job_id")


def edf(jobs: Iterable[Job]) -> list[Job]:
    """Jobs by deadline, then ready time, then id."""
    return sorted(jobs, key=_EDF_KEY)


def fifo(jobs: Iterable[Job]) -> list[Job]:
    """Jobs by ready time, then id."""
    return sorted(jobs, key=_FIFO_KEY)


class BaselineBase:
    """State and helpers every baseline shares.

    Args:
        profile: the latency model.
        prices: the price sheet.
        settings: ESG's knobs; baselines read the configuration space, the
            planning percentile and ``allow_eviction``.
        clock: unused (baselines do no bounded search); accepted for the registry.
    """

    name = "baseline"

    def __init__(
        self,
        profile: LatencyProfile,
        prices: PriceSheet,
        settings: ESGSettings | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.settings = settings or ESGSettings()
        self.tables = CandidateTables(profile, prices, self.settings)
        self.profile = profile
        self.prices = prices
        self.clock = clock
        self._starting: dict[str, float] = {}  # stage -> when its latest cold start will be done
        # Per queue: (its jobs tuple, that tuple in FIFO / EDF order), rebuilt when the tuple changes.
        self._fifo: dict[QueueKey, tuple[tuple[Job, ...], list[Job]]] = {}
        self._edf: dict[QueueKey, tuple[tuple[Job, ...], list[Job]]] = {}
        self._views = ViewCache(self.settings.allow_eviction)  # each round's working copy of the cluster
        self._options: dict[
            tuple[str, frozenset[str], tuple[float, ...] | None], tuple[tuple[float, float, Resource, int], ...]
        ] = {}
        self._setup()

    def _setup(self) -> None:
        """A baseline's own caches, made after the shared state above (none here)."""

    # ---- queue orders ---------------------------------------------------------------

    def fifo_of(self, queue: QueueState) -> list[Job]:
        """:func:`fifo` of the queue's jobs, kept while the queue holds the same tuple (do not mutate)."""
        got = self._fifo.get(queue.key)
        if got is None or got[0] is not queue.jobs:
            got = self._fifo[queue.key] = (queue.jobs, fifo(queue.jobs))
        return got[1]

    def edf_of(self, queue: QueueState) -> list[Job]:
        """:func:`edf` of the queue's jobs, kept while the queue holds the same tuple (do not mutate)."""
        got = self._edf.get(queue.key)
        if got is None or got[0] is not queue.jobs:
            got = self._edf[queue.key] = (queue.jobs, edf(queue.jobs))
        return got[1]

    def oldest_ready_ms(self, queue: QueueState) -> float:
        """``min(j.ready_ms for j in queue.jobs)`` (ValueError on an empty queue, like ``min``)."""
        order = self.fifo_of(queue)
        if not order:
            raise ValueError("oldest_ready_ms() of an empty queue")
        return order[0].ready_ms

    # ---- latency and cost ---------------------------------------------------------

    def latency_ms(self, stage: str, batch: int, res: Resource) -> float | None:
        """Planned batch latency on ``res`` (None where the profile has no cover)."""
        hw, v, s = res
        return self.tables.latency_ms(stage, batch, v, s, hw)

    def cost_per_request(self, stage: str, batch: int, res: Resource, latency_ms: float) -> float:
        """Cost of one job of a batch of ``batch`` on ``res`` taking ``latency_ms``."""
        hw, v, s = res
        return self.prices.cost_per_request(Config(batch, v, s), hw, latency_ms)

    def resources(self, stage: str, view: ClusterView, shares: Sequence[float] | None = None) -> list[Resource]:
        """(hardware, vcpus, share) of the space, on hardware present and profiled for ``stage``.

        Args:
            shares: restrict to these GPU shares (0 for the CPU); None keeps the space's.
        """
        out: list[Resource] = []
        for hw in sorted(view.hardware & self.profile.hardware_types(stage)):
            for v, s in self.tables.resources(hw):
                if shares is None or s in shares:
                    out.append((hw, v, s))
        return out

    def options(
        self, stage: str, view: ClusterView, shares: tuple[float, ...] | None = None
    ) -> tuple[tuple[float, float, Resource, int], ...]:
        """Every covered (cost per request, latency, resources, batch) of ``stage``, cheapest first (cached)."""
        key = (stage, frozenset(view.hardware), shares)
        got = self._options.get(key)
        if got is None:
            out = []
            for res in self.resources(stage, view, shares):
                for b in self.settings.config_space.batches:
                    lat = self.latency_ms(stage, b, res)
                    if lat is not None:
                        out.append((self.cost_per_request(stage, b, res, lat), lat, res, b))
            got = tuple(sorted(out))
            self._options[key] = got
        return got

    # ---- placement and autoscaling ------------------------------------------------------

    def starting(self, stage: str, now_ms: float) -> bool:
        """Whether a worker of ``stage`` requested earlier is still starting."""
        return self._starting.get(stage, -1.0) > now_ms

    def place(
        self,
        view: ClusterView,
        stage: str,
        res: Resource,
        jobs: Sequence[Job],
        now_ms: float,
        allow_cold: bool = True,
    ) -> Placement | None:
        """A warm idle worker for ``res``, else (if allowed and no start is pending) a cold start."""
        hw, v, s = res
        warm = view.has_idle_warm(stage, v, s, hw)
        if not warm and (not allow_cold or self.starting(stage, now_ms)):
            return None
        placement = view.place(stage, v, s, hw, (j.input_node for j in jobs))
        if placement is None:
            return None
        view.commit(placement, v, s)
        if placement.cold:
            self._starting[stage] = now_ms + self.profile.cold_start_ms(stage, hw)
        return placement

    def dispatch(
        self,
        queue: QueueState,
        jobs: Sequence[Job],
        res: Resource,
        placement: Placement,
        latency_ms: float,
        at_risk: bool,
        reason: str,
    ) -> Dispatch:
        """The decision for ``jobs`` on ``placement``; the cold start is added to the prediction."""
        hw, v, s = res
        cold = self.profile.cold_start_ms(queue.key.stage, hw) if placement.cold else 0.0
        return Dispatch(
            queue.key,
            tuple(j.job_id for j in jobs),
            Config(len(jobs), v, s),
            hw,
            placement,
            latency_ms + cold,
            (),
            at_risk,
            reason,
        )

    def workers_of(self, view: ClusterView, stage: str) -> int:
        """Workers holding ``stage`` (idle ones in ``view``; busy ones are counted by the caller)."""
        return sum(1 for w in view.idle.values() if w.stage == stage)


def cheapest_gpu_first(prices: PriceSheet, hardware: Iterable[str]) -> list[str]:
    """GPU types by price per second, then name; the CPU last."""
    gpus = sorted((h for h in hardware if h != CPU), key=lambda h: (prices.gpu_price_s(h), h))
    return gpus + ([CPU] if CPU in hardware else [])
