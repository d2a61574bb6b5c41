"""Two baselines without any SLO reasoning: per-invocation (Prefect's default) and Triton-like batching.

``per-invocation`` — Prefect's default behaviour
    What it models: every stage call is a task run of its own, executed
    alone (batch 1) as soon as a worker is free, first come first served
    across all queues, on a whole GPU (Prefect has no notion of a GPU share;
    a GPU work pool hands a task a device). Hardware: a warm idle worker of the
    stage on any GPU type, else a new worker on the cheapest GPU type with
    room (an operator's sensible default). Workers stay warm for the
    keep-alive time, like a long-lived worker process with the model loaded.
    What it leaves out: Prefect's own per-task overhead (docs/architecture.md,
    "Latency: what Prefect itself costs"), result persistence, retries.

``triton`` — NVIDIA Triton's dynamic batcher on whole GPUs
    What it models: one model instance holds a whole GPU; requests of a
    queue are batched up to ``max_batch_size`` (8) and a batch goes when it is
    full or its oldest request has waited ``max_queue_delay_ms`` (10 ms),
    Triton's ``dynamic_batching`` with ``max_queue_delay_microseconds``. A
    batch goes to an idle warm instance; when none is idle, a new instance is
    started (one at a time per model, as a queue-driven autoscaler such as
    KServe's does) on the GPU type with the lowest cost per request at full
    batch (the type an operator would pick after profiling). No SLO is used.
    What it leaves out: Triton's preferred batch sizes, priority levels and
    per-request timeouts, multiple instances per GPU (``instance_group``
    count > 1), and batching across workflows (queues stay per workflow and
    stage, as for every scheduler here).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from itertools import islice
from operator import attrgetter, le

from esg_prefect.model.jobs import Job
from esg_prefect.model.pricing import PriceSheet
from esg_prefect.model.profile import LatencyProfile
from esg_prefect.scheduling.base import DecisionStats, Dispatch, Hold, SchedulingResult, Snapshot, plain_stats
from esg_prefect.scheduling.baselines.common import BaselineBase, Resource, cheapest_gpu_first, fifo
from esg_prefect.scheduling.dispatch import ClusterView
from esg_prefect.scheduling.search import Clock
from esg_prefect.scheduling.settings import ESGSettings


def fifo_iter(jobs: tuple[Job, ...], in_ready_order: bool | None = None) -> Iterator[Job]:
    """``jobs`` in FIFO order (:func:`~esg_prefect.scheduling.baselines.common.fifo`), produced lazily.

    Queues usually hold their jobs in the order they became ready (the runtime
    and the simulator append them so): then only runs of equal ready times
    need sorting (by id), and a consumer that stops early pays for what it
    took. Otherwise the whole tuple is sorted first.

    Args:
        jobs: the queue's jobs.
        in_ready_order: whether ``jobs`` are known to be in ready order (see
            :class:`ReadyOrder`); None checks (one C-level pass).
    """
    if in_ready_order is None:
        in_ready_order = _in_ready_order(jobs)
    if not in_ready_order:
        yield from fifo(jobs)
        return
    n = len(jobs)
    i = 0
    while i < n:
        ready = jobs[i].ready_ms
        j = i + 1
        while j < n and jobs[j].ready_ms == ready:
            j += 1
        if j == i + 1:
            yield jobs[i]
        else:
            yield from sorted(jobs[i:j], key=_ID)
        i = j


def _in_ready_order(jobs: Sequence[Job]) -> bool:
    readys = list(map(_READY, jobs))
    return all(map(le, readys, islice(readys, 1, None)))


class ReadyOrder:
    """Whether each queue's jobs are in ready order, answered from the previous round's answer.

    Between two rounds a queue usually loses some jobs at its front (they were
    dispatched) and gains some at its end (they became ready): then the new
    tuple's middle is the old one's end, compared item by item at C speed
    (identical items compare without calling ``__eq__``), and only the new end
    is read. Any other change is checked in full, so the answer is always
    ``_in_ready_order(jobs)``.
    """

    __slots__ = ("_known",)

    _SCAN = 64  # how many dispatched front jobs are looked for

    def __init__(self) -> None:
        self._known: dict[object, tuple[tuple[Job, ...], bool]] = {}

    def __call__(self, key: object, jobs: tuple[Job, ...]) -> bool:
        """Whether ``jobs`` (the queue ``key`` now) are in ready order."""
        got = self._known.get(key)
        flag: bool | None = None
        if got is not None:
            old, old_flag = got
            if old is jobs:
                return old_flag
            if old_flag and old and jobs:
                first = jobs[0]
                k = -1
                for i in range(min(len(old), self._SCAN)):
                    if old[i] is first:
                        k = i
                        break
                if k >= 0:
                    m = len(old) - k
                    if len(jobs) >= m and jobs[:m] == old[k:]:
                        flag = _in_ready_order(jobs[m - 1 :])
        if flag is None:
            flag = _in_ready_order(jobs)
        self._known[key] = (jobs, flag)
        return flag


def _merge_unblocked(queues: list[Iterator[Job]], blocked: set[str]) -> Iterator[Job]:
    """Jobs of all ``queues`` (each in FIFO order) oldest first, skipping stages in ``blocked``.

    ``blocked`` may grow while the merge runs: a queue whose stage is blocked
    is dropped from the merge at once, so a round under a long backlog looks
    at the jobs it dispatches, not at the whole backlog.
    """
    heap = []
    for i, q in enumerate(queues):
        first = next(q, None)
        if first is not None:
            heap.append((first.ready_ms, first.job_id, i, first))
    heapq.heapify(heap)
    while heap:
        _, _, i, job = heap[0]
        if job.queue.stage in blocked:
            heapq.heappop(heap)
            continue
        yield job
        nxt = next(queues[i], None)
        if nxt is not None:
            heapq.heapreplace(heap, (nxt.ready_ms, nxt.job_id, i, nxt))
        else:
            heapq.heappop(heap)


_READY = attrgetter("ready_ms")
_ID = attrgetter("job_id")


class PerInvocationScheduler(BaselineBase):
    """Batch 1, whole GPU, first come first served: Prefect's default (module docstring)."""

    name = "per-invocation"

    def _setup(self) -> None:
        # Per (stage, hardware present): how many whole-GPU resources, and the covered ones with their
        # batch-1 latency, GPU types by price.
        self._types: dict[tuple[str, frozenset[str]], tuple[int, list[tuple[Resource, float]]]] = {}
        self._ready_order = ReadyOrder()

    def decide(self, snapshot: Snapshot, now_ms: float) -> SchedulingResult:
        """Send every waiting job alone to a free whole GPU, oldest first."""
        view = self._views.view(snapshot.cluster)
        states = {q.key: q for q in snapshot.queues}
        # All jobs oldest first: a lazy merge of each queue's FIFO order, so that a round under a
        # long backlog looks only at the jobs it dispatches, not at the whole backlog.
        order = self._ready_order
        jobs = _merge_unblocked(
            [fifo_iter(q.jobs, order(q.key, q.jobs)) for q in snapshot.queues if q.jobs], blocked := set()
        )
        dispatches: list[Dispatch] = []
        stats: list[DecisionStats] = []
        v = min(self.settings.config_space.vcpus)
        for job in jobs:
            stage = job.queue.stage
            got = self._types.get((stage, view.hardware))
            if got is None:
                types = cheapest_gpu_first(self.prices, view.hardware & self.profile.hardware_types(stage))
                res_list: list[Resource] = [(hw, v, 0.0 if hw == "cpu" else 1.0) for hw in types]
                covered = [(res, lat) for res in res_list if (lat := self.latency_ms(stage, 1, res)) is not None]
                got = self._types[(stage, view.hardware)] = (len(res_list), covered)
            n_options, covered = got
            choice = None
            has_warm = view.has_idle_warm
            warm = [has_warm(stage, res[1], res[2], res[0]) for res, _ in covered]
            # A warm worker on any type first (a type with none: self.place would answer None at once).
            for (res, lat), w in zip(covered, warm, strict=True):
                if w:
                    placement = self.place(view, stage, res, [job], now_ms, allow_cold=False)
                    if placement is not None:
                        choice = (res, placement, lat)
                        break
            # Then a new worker, unless one of the stage is starting (one at a time). Types with a warm
            # worker are not asked again: nothing changed since they answered None above.
            if choice is None and not self.starting(stage, now_ms):
                for (res, lat), w in zip(covered, warm, strict=True):
                    # Skip a type where no place fits a new worker (view.place would answer None after
                    # the same memoised check).
                    if not w and view.can_start(res[1], res[2], res[0]):
                        placement = self.place(view, stage, res, [job], now_ms, allow_cold=True)
                        if placement is not None:
                            choice = (res, placement, lat)
                            break
            stats.append(plain_stats(job.queue, choice is not None, n_options))
            if choice is None:
                blocked.add(stage)
                continue
            res, placement, lat = choice
            dispatches.append(
                self.dispatch(states[job.queue], [job], res, placement, lat, False, "per-invocation: alone, whole GPU")
            )
        holds = tuple(Hold(q.key, "no free worker") for q in snapshot.queues if q.key.stage in blocked)
        return SchedulingResult(tuple(dispatches), holds, (), tuple(stats))


class TritonScheduler(BaselineBase):
    """Dynamic batching with a maximum queue delay on whole GPUs (module docstring).

    Args:
        max_batch_size: largest batch.
        max_queue_delay_ms: how long the oldest request may wait for a fuller batch.
    """

    name = "triton"

    def __init__(
        self,
        profile: LatencyProfile,
        prices: PriceSheet,
        settings: ESGSettings | None = None,
        clock: Clock | None = None,
        max_batch_size: int = 8,
        max_queue_delay_ms: float = 10.0,
    ) -> None:
        super().__init__(profile, prices, settings, clock)
        self.max_batch_size = max_batch_size
        self.max_queue_delay_ms = max_queue_delay_ms
        self._ranked: dict[tuple[str, frozenset[str]], tuple[tuple[Resource, int], ...]] = {}

    def _instance_type(self, stage: str, view: ClusterView) -> tuple[tuple[Resource, int], ...]:
        """Whole-GPU resources, with their batch cap, by cost per request at full batch (cached).

        This is the deployment choice an operator makes after profiling.
        """
        key = (stage, frozenset(view.hardware))
        got = self._ranked.get(key)
        if got is None:
            v = min(self.settings.config_space.vcpus)
            ranked = []
            for hw in cheapest_gpu_first(self.prices, view.hardware & self.profile.hardware_types(stage)):
                res: Resource = (hw, v, 0.0 if hw == "cpu" else 1.0)
                b = self._batch_cap(stage, res)
                lat = self.latency_ms(stage, b, res)
                if lat is not None:
                    ranked.append((self.cost_per_request(stage, b, res, lat), hw, res, b))
            got = tuple((r, b) for _, _, r, b in sorted(ranked))
            self._ranked[key] = got
        return got

    def _batch_cap(self, stage: str, res: Resource) -> int:
        """The largest batch up to max_batch_size that the profile covers on ``res``."""
        for b in range(self.max_batch_size, 0, -1):
            if self.latency_ms(stage, b, res) is not None:
                return b
        return 1

    def decide(self, snapshot: Snapshot, now_ms: float) -> SchedulingResult:
        """Dispatch full or timed-out batches to idle instances; start one instance when none is idle."""
        view = self._views.view(snapshot.cluster)
        dispatches: list[Dispatch] = []
        holds: list[Hold] = []
        stats: list[DecisionStats] = []
        queues = sorted(snapshot.queues, key=lambda q: (self.oldest_ready_ms(q), q.key))
        for q in queues:
            stage = q.key.stage
            jobs = self.fifo_of(q)
            ranked = self._instance_type(stage, view)
            cap = max((c for _, c in ranked), default=1)
            while jobs:
                waited = now_ms - jobs[0].ready_ms
                if len(jobs) < cap and waited < self.max_queue_delay_ms:
                    holds.append(Hold(q.key, f"batching: {len(jobs)} of {cap}, oldest waited {waited:.1f} ms"))
                    break
                choice = None
                for allow_cold in (False, True):
                    for res, res_cap in ranked:
                        b = min(len(jobs), res_cap)
                        lat = self.latency_ms(stage, b, res)
                        if lat is None:
                            continue
                        placement = self.place(view, stage, res, jobs[:b], now_ms, allow_cold=allow_cold)
                        if placement is not None:
                            choice = (res, placement, lat, b)
                            break
                    if choice is not None:
                        break
                stats.append(plain_stats(q.key, choice is not None, len(ranked)))
                if choice is None:
                    holds.append(Hold(q.key, "no idle instance"))
                    break
                res, placement, lat, b = choice
                batch, jobs = jobs[:b], jobs[b:]
                reason = f"triton: batch {b} (max {cap}, delay {self.max_queue_delay_ms} ms)"
                dispatches.append(self.dispatch(q, batch, res, placement, lat, False, reason))
        return SchedulingResult(tuple(dispatches), tuple(holds), (), tuple(stats))
